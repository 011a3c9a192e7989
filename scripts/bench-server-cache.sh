#!/usr/bin/env bash
# What the clients' server cache policy does to a mixed workload's tail.
#
# Runs `testbed run --workload mixed` on the default topology (2 servers,
# 2 devices, 2 clients) with values of SIZE bytes, once with
# `--server-cache cached` and once with `--server-cache non-temporal` per
# round, the order flipping every round, region files on tmpfs. Prints each
# run's per-operation p50 and p99 (µs), then the median over the rounds per
# policy and operation. A measurement, not a test: nothing is asserted.
#
#   scripts/bench-server-cache.sh [ROUNDS [SECONDS [SIZE]]]   # 5 10 65536
#
# Uses target/release/testbed (or $TESTBED): build it first with
# `cargo build --release -p testbed`.
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=${1:-5}
seconds=${2:-10}
size=${3:-65536}
testbed=${TESTBED:-${CARGO_TARGET_DIR:-target}/release/testbed}
if [[ ! -x $testbed ]]; then
  echo "bench-server-cache: no testbed binary at $testbed; build it with" \
    "\`cargo build --release -p testbed\` or name it in \$TESTBED" >&2
  exit 1
fi
work=$(mktemp -d /dev/shm/pf-server-cache.XXXXXX)
trap 'rm -rf "$work"' EXIT
rows="$work/rows.txt"
: >"$rows"

# One run: appends "policy op p50 p99" rows for every operation of the
# summary table the run prints.
run() {
  local policy=$1 round=$2
  local out="$work/run-$policy-$round.txt"
  if ! "$testbed" run --workload mixed --size "$size" --duration "$seconds" \
    --seed "$((42 + round))" --data-dir "$work/data-$policy" \
    --reports "$work/reports" --server-cache "$policy" >"$out" 2>&1; then
    echo "bench-server-cache: round $round ($policy) failed:" >&2
    cat "$out" >&2
    exit 1
  fi
  # Table rows: operation count errors p50 p99 p99.9 max MB.
  awk -v policy="$policy" '
    $1 ~ /^([A-Z_]+|all)$/ && NF == 8 && $2 ~ /^[0-9]+$/ { print policy, $1, $4, $5 }
  ' "$out" >>"$rows"
  echo "round $round $policy: $(grep -m1 'operations' "$out" | sed 's/^ *//')"
}

for round in $(seq 1 "$rounds"); do
  if ((round % 2)); then
    run cached "$round"
    run non-temporal "$round"
  else
    run non-temporal "$round"
    run cached "$round"
  fi
done

echo
echo "medians over $rounds rounds (µs), mixed workload, $size B values, $seconds s per run:"
printf '%-16s %-14s %10s %10s\n' operation policy p50 p99
sort -k2,2 -k1,1 "$rows" | awk '
  function median(list,    n, a, i, j, t) {
    n = split(list, a, " ")
    for (i = 2; i <= n; i++) {
      t = a[i] + 0
      for (j = i - 1; j >= 1 && a[j] + 0 > t; j--) a[j + 1] = a[j]
      a[j + 1] = t
    }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  {
    key = $2 " " $1
    if (!(key in p50)) order[++count] = key
    p50[key] = p50[key] " " $3
    p99[key] = p99[key] " " $4
  }
  END {
    for (k = 1; k <= count; k++) {
      split(order[k], parts, " ")
      printf "%-16s %-14s %10.0f %10.0f\n", parts[1], parts[2],
        median(p50[order[k]]), median(p99[order[k]])
    }
  }
'
