#!/usr/bin/env bash
# Latency in the lab, for information: perftest between two guests
# (ib_read_lat 64 B, ib_atomic_lat FETCH_ADD: rxe to rxe), next to the
# project's verbs client (roce-probe --latency) from a guest through a
# fabric device to a pmem-server on the host.
#
#   usage: perftest.sh [--iterations N]
#
# Under TCG emulation (this repository's CI machines) every figure is
# emulation time, hundreds of µs: compare the two paths with each other,
# not with hardware. Builds what it runs (release testbed and roce-probe
# with the `verbs` feature). Logs go to $PMEM_LAB_DIR/runs/perftest-<time>/.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
LAB_DIR=${PMEM_LAB_DIR:-/var/tmp/pmem-lab}
iterations=1000
[ "${1:-}" = --iterations ] && iterations=$2
run=$LAB_DIR/runs/perftest-$(date +%Y%m%d-%H%M%S)
mkdir -p "$run"

say() { echo "perftest.sh: $*" >&2; }

(cd "$REPO" && cargo build --release --quiet -p testbed --features verbs &&
  cargo build --release --quiet -p pmem-client --features verbs --bin roce-probe)
bin=$REPO/target/release
bash "$HERE/image.sh"

# The guest side: the index of rxe0's IPv4 RoCEv2 GID, then the test,
# retried until the server guest listens (expanded in the guest, not here).
# shellcheck disable=SC2016
gid='gid() { for f in /sys/class/infiniband/rxe0/ports/1/gids/*; do
  case $(cat "$f") in 0000:0000:0000:0000:0000:ffff:*) echo "${f##*/}"; return;; esac; done; }'
server="$gid; x=\$(gid)
ib_read_lat -d rxe0 -x \$x -F -s 64 -n $iterations
ib_atomic_lat -d rxe0 -x \$x -F -A FETCH_AND_ADD -n $iterations"
client="$gid; x=\$(gid)
retry() { i=0; while [ \$i -lt 100 ]; do \"\$@\" && return 0; sleep 0.2; i=\$((i+1)); done; return 1; }
retry ib_read_lat -d rxe0 -x \$x -F -s 64 -n $iterations 10.77.0.3
retry ib_atomic_lat -d rxe0 -x \$x -F -A FETCH_AND_ADD -n $iterations 10.77.0.3"

say "guest to guest: ib_read_lat, ib_atomic_lat ($iterations iterations)"
bash "$HERE/net.sh" up >/dev/null
bash "$HERE/guest.sh" --ip 10.77.0.3/24 --timeout 300 --log "$run/perftest-server.log" \
  -- sh -c "$server" >/dev/null &
server_pid=$!
bash "$HERE/guest.sh" --ip 10.77.0.4/24 --timeout 300 --log "$run/perftest-client.log" \
  -- sh -c "$client" >/dev/null
wait "$server_pid"

say "through the fabric device: roce-probe --latency $iterations"
cp "$REPO/configs/lab.toml" "$run/topology.toml"
"$bin/testbed" up --net lab "$run/topology.toml" --data-dir "$run/data" >"$run/testbed-up.log" 2>&1 &
up_pid=$!
for _ in $(seq 300); do
  grep -q "fabric is up" "$run/testbed-up.log" && break
  kill -0 "$up_pid" 2>/dev/null || { cat "$run/testbed-up.log" >&2; exit 1; }
  sleep 0.2
done
# The fabric asks for keys: testbed up made them and says where.
keys=$(sed -n 's/^keys: \([^ ]*\) .*/\1/p' "$run/testbed-up.log")
[ -n "$keys" ] || { echo "testbed up named no keys folder" >&2; cat "$run/testbed-up.log" >&2; exit 1; }
bash "$HERE/guest.sh" --share "$bin" --share "$run" --share "$keys" --timeout 300 --log "$run/probe.log" \
  -- "$bin/roce-probe" --topology "$run/topology.toml" --client c1 --secrets "$keys" \
  --device-port 10.77.0.100:7101 --local-ip 10.77.0.2 --rdma-device rxe0 \
  --latency "$iterations" >/dev/null
kill -TERM "$up_pid"
wait "$up_pid" || true

# perftest prints: #bytes #iterations t_min t_max t_typical t_avg t_stdev p99 p99.9
typical() { awk '/^ *[0-9]+ +[0-9]+ +[0-9.]+/ {print "min " $3 " µs, typical " $5 " µs, p99 " $8 " µs"}' "$1" | sed -n "${2}p"; }
echo
echo "lab latency, $iterations iterations each (TCG emulation: compare rows, not with hardware)"
echo "  rxe -> rxe, ib_read_lat 64 B:           $(typical "$run/perftest-client.log" 1)"
echo "  rxe -> rxe, ib_atomic_lat FETCH_ADD:    $(typical "$run/perftest-client.log" 2)"
echo "  rxe -> device -> server, READ 64 B:     $(grep -o 'latency READ 64 B: .*' "$run/probe.log" | cut -d: -f2-)"
echo "  rxe -> device -> server, FETCH_ADD:     $(grep -o 'latency FETCH_ADD: .*' "$run/probe.log" | cut -d: -f2-)"
echo "logs: $run"
