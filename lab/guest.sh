#!/usr/bin/env bash
# Boots one lab guest on the lab's bridge, runs one command in it and exits
# with the command's exit status. The guest's console is this script's
# stdout.
#
#   usage: guest.sh [--share DIR]... [--ip CIDR] [--mem MIB] [--timeout SECS]
#                   [--log FILE] [--disk FILE] [--nvdimm FILE]... [--nodes N]
#                   [--pidfile FILE] [--env NAME=VALUE]... -- COMMAND [ARG]...
#
#   --share DIR   a host folder the guest sees at the same path (9p,
#                 writable); give the folders holding COMMAND and its files
#   --ip CIDR     the guest's eth0 address (default 10.77.0.2/24); rxe0 is
#                 the RDMA device on eth0, its RoCEv2 GID ::ffff:<address>
#   --mem MIB     guest memory (default 768)
#   --timeout S   kill the guest after S seconds (default 600): exit 124
#   --log FILE    also copy the console to FILE
#   --disk FILE   a raw disk image the guest sees as /dev/vda (virtio);
#                 what the guest wrote to it survives killing QEMU, what
#                 sat in the guest's page cache does not: a power cut
#   --nvdimm FILE an emulated NVDIMM backed by FILE (its size is the
#                 NVDIMM's, a multiple of 2 MiB): a libnvdimm pmem device in
#                 the guest, which starts as a raw namespace (`ndctl
#                 create-namespace -m fsdax|devdax` makes it DAX-capable;
#                 that lasts, it is written to the NVDIMM). Every store the
#                 guest makes lands in FILE, flushed or not
#   --nodes N     N NUMA nodes (one vCPU and an equal share of memory
#                 each); NVDIMM i sits on node i mod N (default 1)
#   --pidfile F   write QEMU's process id to F (to cut the power: kill -9)
#   --env N=V     set variable N to V for COMMAND (the guest does not see
#                 this script's environment)
#
# Needs the image (`image.sh`) and the network (`net.sh up`); runs itself in
# the lab's namespace ($PMEM_LAB_NS, default pmemlab) when started outside.
# The guest runs under KVM where the host has VMX/SVM KVM, and under QEMU's
# TCG emulation otherwise (kvm-pvm cannot run a stock kernel): it then
# boots in about 5 s and everything in it runs slowly but correctly.
set -euo pipefail

NS=${PMEM_LAB_NS:-pmemlab}
LAB_DIR=${PMEM_LAB_DIR:-/var/tmp/pmem-lab}
IMAGE=$LAB_DIR/image

die() { echo "guest.sh: $*" >&2; exit 2; }

# Run inside the lab's namespace (the taps must join its bridge).
if [ "$(ip netns identify $$ 2>/dev/null)" != "$NS" ]; then
  ip netns list | grep -qw "^$NS" || die "no namespace $NS (run net.sh up)"
  exec ip netns exec "$NS" bash "$0" "$@"
fi

shares=()
ip_cidr=10.77.0.2/24
mem=768
timeout_s=600
log=
disk=
nvdimms=()
nodes=1
pidfile=
envs=()
while [ $# -gt 0 ]; do
  case "$1" in
    --share) shares+=("$(realpath "$2")"); shift 2 ;;
    --ip) ip_cidr=$2; shift 2 ;;
    --mem) mem=$2; shift 2 ;;
    --timeout) timeout_s=$2; shift 2 ;;
    --log) log=$2; shift 2 ;;
    --disk) disk=$(realpath "$2"); shift 2 ;;
    --nvdimm) nvdimms+=("$(realpath "$2")"); shift 2 ;;
    --nodes) nodes=$2; shift 2 ;;
    --pidfile) pidfile=$2; shift 2 ;;
    --env)
      [[ "$2" =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || die "--env takes NAME=VALUE, not $2"
      envs+=("$2"); shift 2 ;;
    --) shift; break ;;
    *) die "unknown option $1" ;;
  esac
done
[ $# -gt 0 ] || die "no command (usage: guest.sh [options] -- COMMAND [ARG]...)"
if [ ! -r "$IMAGE/vmlinuz" ] || [ ! -r "$IMAGE/initrd.cpio.gz" ]; then
  die "no image in $IMAGE (run image.sh)"
fi
command -v qemu-system-x86_64 >/dev/null || die "qemu-system-x86_64 missing (image.sh installs it)"

# The command, quoted for the guest's sh, in a folder shared as /lab.
work=$(mktemp -d "${TMPDIR:-/tmp}/pmem-lab-guest.XXXXXX")
tap=lt$$
# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
  ip link del "$tap" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
quote() { printf "'%s'" "${1//\'/\'\\\'\'}"; }
{
  echo "cd $(quote "$PWD") 2>/dev/null || cd /"
  for pair in "${envs[@]}"; do echo "export ${pair%%=*}=$(quote "${pair#*=}")"; done
  printf 'exec'
  for arg in "$@"; do printf ' %s' "$(quote "$arg")"; done
  echo
} >"$work/cmd"

virtfs=(-virtfs "local,path=$work,mount_tag=lab,security_model=none")
mounts=""
for i in "${!shares[@]}"; do
  virtfs+=(-virtfs "local,path=${shares[$i]},mount_tag=share$i,security_model=passthrough")
  mounts="$mounts,share$i:${shares[$i]}"
done

ip tuntap add dev "$tap" mode tap
ip link set "$tap" master br0 up

if [ -w /dev/kvm ] && { [ -d /sys/module/kvm_intel ] || [ -d /sys/module/kvm_amd ]; }; then
  accel=(-accel kvm -cpu host)
else
  # One host thread for all vCPUs: with several, multi-threaded TCG
  # sometimes lets the guest kernel's live code patching (int3) race a vCPU
  # at boot, and it panics.
  accel=(-accel "tcg,tb-size=256,thread=single" -cpu max)
fi
bios=()
[ -r /usr/share/qemu/qboot.rom ] && bios=(-bios /usr/share/qemu/qboot.rom)
# A MAC from the address, so two guests on the bridge never share one.
last=${ip_cidr%/*}; last=${last##*.}
mac=$(printf '52:54:00:77:00:%02x' "$last")

# Memory: NUMA nodes share it; NVDIMMs are hot-pluggable memory beyond it.
[[ "$nodes" =~ ^[1-8]$ ]] || die "--nodes takes 1 to 8"
machine=q35
ram=$mem
topology=()
if [ "$nodes" -gt 1 ]; then
  share=$((mem / nodes))
  for ((n = 0; n < nodes; n++)); do
    topology+=(-object "memory-backend-ram,id=ram$n,size=${share}M"
      -numa "node,nodeid=$n,cpus=$n,memdev=ram$n")
  done
  ram=$((share * nodes))
fi
memory=(-m "$ram")
if [ ${#nvdimms[@]} -gt 0 ]; then
  machine=q35,nvdimm=on
  total=0
  for i in "${!nvdimms[@]}"; do
    file=${nvdimms[$i]}
    [ -w "$file" ] || die "NVDIMM backing file $file is not a writable file"
    size=$(stat -c %s "$file")
    if [ "$size" = 0 ] || [ $((size % (2 << 20))) != 0 ]; then
      die "NVDIMM backing file $file: size $size is not a positive multiple of 2 MiB"
    fi
    total=$((total + size / (1 << 20)))
    topology+=(-object "memory-backend-file,id=nv$i,share=on,mem-path=$file,size=$size"
      -device "nvdimm,id=nvdimm$i,memdev=nv$i,node=$((i % nodes))")
  done
  memory=(-m "$ram,slots=${#nvdimms[@]},maxmem=$((ram + total))M")
fi

qemu=(qemu-system-x86_64 -machine "$machine" "${accel[@]}" "${bios[@]}" "${memory[@]}"
  -smp "$nodes" "${topology[@]}"
  -nodefaults -no-user-config -display none -serial stdio -monitor none -no-reboot
  -kernel "$IMAGE/vmlinuz" -initrd "$IMAGE/initrd.cpio.gz"
  -append "console=ttyS0 quiet loglevel=3 panic=-1 lab.ip=$ip_cidr lab.mounts=${mounts#,}"
  -netdev "tap,id=n0,ifname=$tap,script=no,downscript=no"
  -device "virtio-net-pci,netdev=n0,mac=$mac"
  "${virtfs[@]}")
if [ -n "$disk" ]; then
  [ -w "$disk" ] || die "disk image $disk is not a writable file"
  qemu+=(-drive "file=$disk,if=virtio,format=raw,cache=writeback")
fi
[ -z "$pidfile" ] || qemu+=(-pidfile "$pidfile")

set +e
if [ -n "$log" ]; then
  timeout --kill-after=5 "$timeout_s" "${qemu[@]}" </dev/null | tee "$log"
  status=${PIPESTATUS[0]}
else
  timeout --kill-after=5 "$timeout_s" "${qemu[@]}" </dev/null
  status=$?
fi
set -e
if [ "$status" = 124 ] || [ "$status" = 137 ]; then
  echo "guest.sh: the guest did not finish within ${timeout_s}s" >&2
  exit 124
fi
if [ ! -r "$work/rc" ]; then
  echo "guest.sh: the guest ended (qemu status $status) without running the command to its end" >&2
  exit 125
fi
exit "$(cat "$work/rc")"
