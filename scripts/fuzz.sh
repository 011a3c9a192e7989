#!/usr/bin/env bash
# Fuzzes the RoCEv2 parser and RC queue pair (fuzz/fuzz_targets/roce_datagram.rs)
# for SECONDS (default 60) with cargo-fuzz (libFuzzer). cargo-fuzz needs
# nightly compiler flags; with only a stable toolchain, RUSTC_BOOTSTRAP=1
# lets stable accept them. Crashes land in fuzz/artifacts/roce_datagram/.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked
mkdir -p fuzz/corpus/roce_datagram
RUSTC_BOOTSTRAP=1 cargo fuzz run roce_datagram fuzz/corpus/roce_datagram -- \
  -max_total_time="$seconds" -max_len=2048
