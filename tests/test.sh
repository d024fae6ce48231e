#!/usr/bin/env bash
# Sets up a fresh Debian machine and runs every check and test of the workspace. Arguments are
# passed to nextest (e.g. a test name filter).
set -euo pipefail
cd "$(dirname "$0")/.."

tests/setup.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
# The end-to-end tests start the workspace's binaries: build them in the test profile first.
cargo build --workspace --bins
# The desktop image, once per run (the image tests find it; the ide profile runs from it too).
./target/debug/berth image build --profile desktop --json
# The osworld bundle (OSWorld's apps and guest account), for its own tests.
./target/debug/berth image build --profile desktop --bundle osworld --json
# The fuzz targets, briefly, from their committed corpora (fails on a crash).
tests/fuzz.sh
cargo nextest run --workspace "$@"
