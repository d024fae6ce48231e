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
# The desktop image, once per run (the image tests find it; the ide profile runs from it too),
# then the osworld bundle (OSWorld's apps and guest account) for its own tests. The builds mostly
# wait on the mirror, PyPI and the disk, so they run while the fuzz targets compile and run.
mkdir -p target
(
  ./target/debug/berth image build --profile desktop --json
  ./target/debug/berth image build --profile desktop --bundle osworld --json
) > target/image-builds.log 2>&1 &
images=$!
# The fuzz targets, briefly, from their committed corpora (fails on a crash).
fuzzed=0
tests/fuzz.sh || fuzzed=$?
images_ok=0
wait "$images" || images_ok=$?
cat target/image-builds.log
[ "$images_ok" = 0 ] || { echo "test.sh: the image builds failed" >&2; exit 1; }
[ "$fuzzed" = 0 ] || { echo "test.sh: fuzzing failed" >&2; exit 1; }
cargo nextest run --workspace "$@"
