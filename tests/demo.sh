#!/usr/bin/env bash
# Builds berth and berth-agent and runs `berth demo`: the controller in-process on its embedded
# defaults (process provider, SQLite), one desktop sandbox (Xvnc, XFCE, Chromium supervised by
# its agent) waited on until strictly ready, a screenshot saved to berth-demo.png, an exec, and
# a one-time noVNC viewer URL. It keeps running until Ctrl-C (or exits at once with --once),
# then deletes the sandbox.
set -euo pipefail
cd "$(dirname "$0")/.."

tests/setup.sh
cargo build -p berth-agent -p berth-controller --bins

work="$(mktemp -d /tmp/berth-demo.XXXXXX)"
trap 'rm -rf "$work"' EXIT
./target/debug/berth demo --listen "127.0.0.1:${PORT:-8780}" --data-dir "$work/data" \
  --screenshot "$PWD/berth-demo.png" "$@"
