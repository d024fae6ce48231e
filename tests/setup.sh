#!/usr/bin/env bash
# Installs what berth's build, tests and benchmarks need on a Debian machine. Idempotent and
# quick when everything is present: it only calls apt-get or pip for what is missing.
set -euo pipefail

packages=(
  build-essential pkg-config libssl-dev  # the Rust build (native-tls)
  nasm                                   # openh264's assembly kernels, before the first cargo build
  curl ca-certificates                   # the demo
  python3 python3-pip                    # /run_python, the pyautogui shim, the Flask peer
  procps util-linux passwd               # tests: process table, setsid, useradd
)

sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The benchmark's peer server.
if ! python3 -c 'import flask' 2>/dev/null; then
  echo "setup: installing Flask" >&2
  python3 -m pip install --quiet flask 2>/dev/null \
    || python3 -m pip install --quiet --break-system-packages flask
fi

if ! command -v cargo-nextest >/dev/null 2>&1; then
  echo "setup: installing cargo-nextest" >&2
  cargo install --locked cargo-nextest
fi
