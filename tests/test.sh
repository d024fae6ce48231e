#!/usr/bin/env bash
# Sets up a fresh Debian machine and runs every check and test of the workspace. Arguments are
# passed to nextest (e.g. a test name filter).
set -euo pipefail
cd "$(dirname "$0")/.."

# Each phase's end, in seconds since the start, for the run's log.
phase() { echo "test.sh: $1 done at ${SECONDS}s" >&2; }
tests/setup.sh
phase setup
cargo fmt --all -- --check
# The end-to-end tests start the workspace's binaries: build them in the test profile first.
cargo build --workspace --bins
phase build
# The desktop image, once per run (the image tests find it; the ide profile runs from it too),
# then the osworld bundle (OSWorld's apps and guest account) for its own tests. The builds mostly
# wait on the mirror, PyPI and the disk, so they run while clippy and the fuzz targets compile.
mkdir -p target
(
  ./target/debug/berth image build --profile desktop --json
  echo "test.sh: the desktop image built at ${SECONDS}s"
  ./target/debug/berth image build --profile desktop --bundle osworld --json
) > target/image-builds.log 2>&1 &
images=$!
linted=0
cargo clippy --workspace --all-targets -- -D warnings || linted=$?
phase clippy
# The fuzz targets, briefly, from their committed corpora (fails on a crash).
fuzzed=0
if [ "$linted" = 0 ]; then
  tests/fuzz.sh || fuzzed=$?
  phase fuzz
fi
images_ok=0
wait "$images" || images_ok=$?
phase images
cat target/image-builds.log
[ "$linted" = 0 ] || { echo "test.sh: clippy failed" >&2; exit 1; }
[ "$images_ok" = 0 ] || { echo "test.sh: the image builds failed" >&2; exit 1; }
[ "$fuzzed" = 0 ] || { echo "test.sh: fuzzing failed" >&2; exit 1; }
cargo nextest run --workspace "$@"
