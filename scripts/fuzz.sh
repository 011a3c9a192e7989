#!/usr/bin/env bash
# Fuzzes every cargo-fuzz target in fuzz/fuzz_targets/ (or only the TARGETs
# named) for SECONDS each (default 60), FUZZ_JOBS targets at a time (default
# 2, one per core here), and prints per target the executions, executions
# per second and crashes.
# Exits non-zero if any target crashed; its input is in
# fuzz/artifacts/TARGET/ and `cargo fuzz run TARGET FILE` replays it.
#
#   scripts/fuzz.sh [SECONDS [TARGET...]]
#
# cargo-fuzz is installed from crates.io when missing (about 2.5 minutes on
# two cores). It needs nightly compiler flags (the address sanitizer); with
# only a stable toolchain, RUSTC_BOOTSTRAP=1 lets stable accept them. Each
# target keeps its corpus in fuzz/corpus/TARGET/, so later runs start from
# what earlier ones found.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
seconds=${1:-60}
shift || true
command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked
export RUSTC_BOOTSTRAP=1
if [[ $# -gt 0 ]]; then
  targets=("$@")
else
  mapfile -t targets < <(cargo fuzz list)
fi
# One build of every target, before any of them runs.
cargo fuzz build

declare -A max_len=([roce_datagram]=2048)
jobs=${FUZZ_JOBS:-2}

# Fuzzes one target; prints its summary line, and what the crash said when
# it crashed (exit status 1).
fuzz_one() {
  local target=$1 log="artifacts/$1/last-run.log" status=0
  mkdir -p "corpus/$target" "artifacts/$target"
  cargo fuzz run "$target" "corpus/$target" -- \
    -max_total_time="$seconds" -max_len="${max_len[$target]:-4096}" \
    -timeout=10 -print_final_stats=1 >"$log" 2>&1 || status=$?
  local runs rate crashes=0
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
  if [[ $status -ne 0 ]]; then
    crashes=1
    grep -E '^(==[0-9]+==ERROR|SUMMARY|thread .* panicked|artifact_prefix|Test unit written)' "$log" | head -n 20 || tail -n 20 "$log"
  fi
  echo "$target: ${runs:-?} executions in ${seconds} s (${rate:-?} exec/s), $crashes crashes"
  return "$crashes"
}

results=$(mktemp -d)
trap 'rm -rf "$results"' EXIT
crashed=0
for ((i = 0; i < ${#targets[@]}; i += jobs)); do
  pids=()
  for target in "${targets[@]:i:jobs}"; do
    fuzz_one "$target" >"$results/$target" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do
    wait "$pid" || crashed=1
  done
  for target in "${targets[@]:i:jobs}"; do
    cat "$results/$target"
  done
done
echo "== fuzzing summary"
for target in "${targets[@]}"; do
  tail -n 1 "$results/$target"
done
exit "$crashed"
