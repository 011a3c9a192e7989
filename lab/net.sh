#!/usr/bin/env bash
# The lab's network: one namespace holding a bridge that the guests' taps
# join, and three veth pairs for the host side.
#
#   usage: net.sh up | down | status
#
#   namespace $PMEM_LAB_NS (default pmemlab)
#     br0  the bridge
#     vh0  10.77.0.100/24, the kernel's address: fabric devices' control ports
#     vh1  no address: fabric device F1's RoCEv2 port (the device answers ARP
#          for 10.77.0.101 itself)
#     vh2  no address: F2's RoCEv2 port (10.77.0.102)
#     lo   up: servers and device links use the namespace's loopback
#
# With arp_ignore=1 the kernel answers ARP only for an address of the
# interface the request came in on, so 10.77.0.100 is not claimed on vh1/vh2
# and 10.77.0.101/102 are left to the devices. IPv6 is off: no router
# solicitations or DAD in the captures.
set -euo pipefail

NS=${PMEM_LAB_NS:-pmemlab}

die() { echo "net.sh: $*" >&2; exit 1; }
in_ns() { ip netns exec "$NS" "$@"; }

up() {
  [ "$(id -u)" = 0 ] || die "needs root"
  if ip netns list | grep -qw "^$NS"; then
    down
  fi
  ip netns add "$NS"
  in_ns sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
  in_ns sysctl -qw net.ipv4.conf.all.arp_ignore=1 net.ipv4.conf.default.arp_ignore=1
  in_ns ip link set lo up
  in_ns ip link add br0 type bridge
  in_ns ip link set br0 up
  for i in 0 1 2; do
    in_ns ip link add "vh$i" type veth peer name "vb$i"
    in_ns ip link set "vb$i" master br0 up
    in_ns ip link set "vh$i" up
  done
  in_ns ip addr add 10.77.0.100/24 dev vh0
  echo "lab network up: namespace $NS, br0, vh0 10.77.0.100/24, vh1, vh2"
}

down() {
  ip netns list | grep -qw "^$NS" || return 0
  # Processes left in the namespace (daemons, QEMU of a killed run) go first:
  # the namespace's interfaces live as long as any of them does.
  local pids
  pids=$(ip netns pids "$NS" 2>/dev/null || true)
  if [ -n "$pids" ]; then
    # shellcheck disable=SC2086
    kill -TERM $pids 2>/dev/null || true
    sleep 0.5
    pids=$(ip netns pids "$NS" 2>/dev/null || true)
    # shellcheck disable=SC2086
    [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
  fi
  ip netns del "$NS"
  echo "lab network down: namespace $NS removed"
}

status() {
  ip netns list | grep -qw "^$NS" || { echo "no namespace $NS"; return 1; }
  in_ns ip -br addr
  in_ns bridge link
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  *) die "usage: net.sh up | down | status" ;;
esac
