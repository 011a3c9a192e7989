#!/usr/bin/env bash
# Fuzzes every cargo-fuzz target in fuzz/fuzz_targets/ (or only the TARGETs
# named) for SECONDS each (default 60), one after the other on one core, and
# prints per target the executions, executions per second and crashes.
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
# `cargo fuzz run` builds each target first (all share one build).

declare -A max_len=([roce_datagram]=2048)
summary=()
crashed=0
for target in "${targets[@]}"; do
  mkdir -p "corpus/$target" "artifacts/$target"
  log="artifacts/$target/last-run.log"
  status=0
  cargo fuzz run "$target" "corpus/$target" -- \
    -max_total_time="$seconds" -max_len="${max_len[$target]:-4096}" \
    -timeout=10 -print_final_stats=1 >"$log" 2>&1 || status=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
  crashes=0
  if [[ $status -ne 0 ]]; then
    crashes=1
    crashed=1
    grep -E '^(==[0-9]+==ERROR|SUMMARY|thread .* panicked|artifact_prefix|Test unit written)' "$log" | head -n 20 || tail -n 20 "$log"
  fi
  line="$target: ${runs:-?} executions in ${seconds} s (${rate:-?} exec/s), $crashes crashes"
  echo "$line"
  summary+=("$line")
done
echo "== fuzzing summary"
printf '%s\n' "${summary[@]}"
exit "$crashed"
