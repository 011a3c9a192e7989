#!/usr/bin/env bash
# The whole test suite, as CI runs it: installs what the tests need when it is
# missing, then formatting, clippy and every test of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."

# System packages the tests use, as PROBE:PACKAGE (see ensure-packages.sh).
packages=()
if ((${#packages[@]})); then
  scripts/ensure-packages.sh "${packages[@]}"
fi

export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}
export PROPTEST_CASES=${PROPTEST_CASES:-256}

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --locked --workspace --all-targets -- -D warnings
echo "== cargo test"
cargo test --locked --workspace
echo "== all tests passed"
