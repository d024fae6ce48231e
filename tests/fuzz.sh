#!/usr/bin/env bash
# Runs every cargo-fuzz target in fuzz/ for a bounded time (FUZZ_SECONDS each, default 20),
# from its committed corpus. Fails on a crash, a failed assertion, a leak or an input over the
# memory limit; the input that did it is left in fuzz/artifacts/<target>/. Inputs found on the
# way go to fuzz/target/corpus/<target>/ (not committed), so the committed corpus stays as is.
# Arguments name targets to run (default: all of them).
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${FUZZ_SECONDS:-20}"
# The parsers under test are safe Rust, so no AddressSanitizer; unoptimised (--dev: with coverage
# counters the agent and its dependencies take a cold 6 minutes on two cores, about 9 at -O3; a
# short run still makes thousands of inputs a second, ~230 for the HTTP extractors); 16 codegen
# units build the agent in parallel. FUZZ_BUILD_FLAGS overrides (-O for a long campaign).
read -r -a flags <<<"${FUZZ_BUILD_FLAGS:---sanitizer none --codegen-units 16 --dev}"
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(cargo +nightly fuzz list)
fi

cargo fmt --manifest-path fuzz/Cargo.toml -- --check
cargo +nightly fuzz build "${flags[@]}"
# Each run is one libFuzzer process on one core: as many run at once as there are cores
# (FUZZ_JOBS), each into its own log, printed when it ends.
jobs="${FUZZ_JOBS:-$(nproc)}"
logs="fuzz/target/logs"
mkdir -p "$logs"
run() {
  local t="$1" found="fuzz/target/corpus/$1"
  mkdir -p "$found"
  cargo +nightly fuzz run "${flags[@]}" "$t" "$found" "fuzz/corpus/$t" -- \
    -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
    >"$logs/$t.log" 2>&1
}
declare -A running=()
failed=()
# Waits for one run to end, prints its log and records it when it failed.
reap() {
  local pid rc=0 t
  wait -n -p pid "${!running[@]}" || rc=$?
  t="${running[$pid]}"
  unset "running[$pid]"
  echo "fuzz: $t ended (exit $rc)" >&2
  cat "$logs/$t.log" >&2
  [ "$rc" = 0 ] || failed+=("$t")
}
for t in "${targets[@]}"; do
  while [ "${#running[@]}" -ge "$jobs" ]; do reap; done
  echo "fuzz: $t for ${seconds}s" >&2
  run "$t" &
  running[$!]="$t"
done
while [ "${#running[@]}" -gt 0 ]; do reap; done
if [ "${#failed[@]}" -gt 0 ]; then
  echo "fuzz: failed: ${failed[*]} (inputs in fuzz/artifacts/)" >&2
  exit 1
fi
