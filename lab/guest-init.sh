#!/bin/busybox sh
# shellcheck shell=dash disable=SC2013
# /init of a lab guest (built into the image by image.sh).
#
# Kernel command line (set by guest.sh):
#   lab.ip=A.B.C.D/N           eth0's address
#   lab.mounts=TAG:PATH,...    9p shares to mount at PATH
# The 9p share tagged `lab` holds `cmd`, the command to run; its exit
# status is written back there as `rc`. Without it the guest offers a shell.
#
# Console lines for whoever reads it: PMEMLAB-READY once rxe0 has its RoCEv2
# GID, PMEMLAB-END rc=N after the command, then PMEMLAB-COUNTER lines with
# rxe0's hardware counters (sequence and ICRC errors among them).

/bin/busybox mkdir -p /proc /sys /dev /tmp /run
/bin/busybox --install -s
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp

for module in $(cat /etc/lab-modules); do
  insmod "$module" 2>/dev/null
done

ip_cidr=10.77.0.2/24
mounts=
for word in $(cat /proc/cmdline); do
  case "$word" in
    lab.ip=*) ip_cidr=${word#lab.ip=} ;;
    lab.mounts=*) mounts=${word#lab.mounts=} ;;
  esac
done

nine_p() { mount -t 9p -o trans=virtio,version=9p2000.L,msize=524288,cache=loose "$1" "$2"; }
mkdir -p /lab
nine_p lab /lab 2>/dev/null
for pair in $(echo "$mounts" | tr ',' ' '); do
  tag=${pair%%:*}
  path=${pair#*:}
  mkdir -p "$path"
  nine_p "$tag" "$path" || echo "guest-init: cannot mount share $tag at $path"
done

echo 1 >/proc/sys/net/ipv6/conf/all/disable_ipv6
ip link set lo up
ip addr add "$ip_cidr" dev eth0
ip link set eth0 up
rdma link add rxe0 type rxe netdev eth0

# Wait for the port and its IPv4 RoCEv2 GID (::ffff:a.b.c.d).
port=/sys/class/infiniband/rxe0/ports/1
i=0
while [ $i -lt 100 ]; do
  if grep -q ACTIVE "$port/state" 2>/dev/null && grep -q '^0000:0000:0000:0000:0000:ffff:' "$port"/gids/* 2>/dev/null; then
    break
  fi
  sleep 0.1
  i=$((i + 1))
done
echo "PMEMLAB-READY $(cat "$port/state" 2>/dev/null) eth0 $ip_cidr uptime $(cut -d' ' -f1 /proc/uptime)s"

if [ -r /lab/cmd ]; then
  sh /lab/cmd
  rc=$?
  echo "PMEMLAB-END rc=$rc uptime $(cut -d' ' -f1 /proc/uptime)s"
  for counter in "$port"/hw_counters/*; do
    echo "PMEMLAB-COUNTER ${counter##*/} $(cat "$counter")"
  done
  echo "$rc" >/lab/rc
  sync
else
  echo "no /lab/cmd: shell (exit powers off)"
  setsid cttyhack sh
fi
poweroff -f
