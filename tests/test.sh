#!/usr/bin/env bash
# Sets up a fresh Debian machine and runs every check and test of the workspace. Arguments are
# passed to nextest (e.g. a test name filter).
set -euo pipefail
cd "$(dirname "$0")/.."

# Each phase's end, in seconds since the start, for the run's log.
phase() { echo "test.sh: $1 done at ${SECONDS}s" >&2; }
# A CI run (CI=true: a fresh machine, every crate compiled once) keeps no incremental caches
# (3.7 GB of target/ that nothing reads again).
if [ "${CI:-}" = true ]; then export CARGO_INCREMENTAL=0; fi
tests/setup.sh build
cargo fmt --all -- --check
# The end-to-end tests start the workspace's binaries: build them first (the dev profile, the
# benchmarks' too).
# The rest of the set-up (the desktop's packages, Python's, cargo-fuzz) mostly downloads and
# unpacks, so it runs while they compile.
mkdir -p target
tests/setup.sh > target/setup.log 2>&1 &
setup=$!
cargo build --workspace --bins
phase build
setup_ok=0
wait "$setup" || setup_ok=$?
cat target/setup.log
[ "$setup_ok" = 0 ] || { echo "test.sh: tests/setup.sh failed" >&2; exit 1; }
phase setup
# The desktop image, once per run (the image tests find it; the ide profile runs from it too),
# then the osworld bundle (OSWorld's apps and guest account) for its own tests. The builds mostly
# wait on the mirror, PyPI and the disk, so they run while clippy and the fuzz targets compile.
# In CI (a fresh machine, one build of each) their packages stages leave the cache once
# imported: gigabytes the run does not need twice (the tests find the images by name).
drop=()
if [ "${CI:-}" = true ]; then drop=(--drop-stage); fi
(
  ./target/debug/berth image build --profile desktop --json "${drop[@]}"
  echo "test.sh: the desktop image built at ${SECONDS}s"
  ./target/debug/berth image build --profile desktop --bundle osworld --json "${drop[@]}"
  echo "test.sh: disk after the image builds: $(df -h --output=used,avail / | tail -1)"
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
  # In CI the fuzz targets' builds (2.6 GB) are not used again; their logs, corpus and any
  # crash's input (fuzz/artifacts) stay.
  if [ "${CI:-}" = true ]; then rm -rf fuzz/target/debug fuzz/target/x86_64-unknown-linux-gnu; fi
fi
images_ok=0
wait "$images" || images_ok=$?
phase images
cat target/image-builds.log
[ "$linted" = 0 ] || { echo "test.sh: clippy failed" >&2; exit 1; }
[ "$images_ok" = 0 ] || { echo "test.sh: the image builds failed" >&2; exit 1; }
[ "$fuzzed" = 0 ] || { echo "test.sh: fuzzing failed" >&2; exit 1; }
cargo nextest run --workspace "$@"
