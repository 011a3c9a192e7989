#!/usr/bin/env bash
# Builds the lab's guest image from Debian packages: a stock Debian kernel
# (its rdma_rxe, virtio, virtio-blk, ext4, 9p and NVDIMM/DAX modules) and an
# initramfs with busybox, rdma-core's verbs library and rxe provider, perftest,
# `ip`/`rdma`, ndctl/daxctl (NVDIMM namespaces), mkfs.ext4 and redis-server.
#
#   usage: image.sh [--force]
#
# Output: $PMEM_LAB_DIR/image/{vmlinuz,initrd.cpio.gz,manifest.txt}
# ($PMEM_LAB_DIR defaults to /var/tmp/pmem-lab). Packages are fetched with
# `apt-get download` into $PMEM_LAB_DIR/debs and kept; nothing is copied
# from the host's own filesystem. A rebuild happens only when the package
# versions or guest-init.sh change (or with --force). The host tools the lab
# needs (QEMU, busybox, cpio, kmod, …) are installed when missing.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LAB_DIR=${PMEM_LAB_DIR:-/var/tmp/pmem-lab}
KERNEL_META=${PMEM_LAB_KERNEL:-linux-image-6.12-amd64}
DEBS=$LAB_DIR/debs
WORK=$LAB_DIR/work
OUT=$LAB_DIR/image
FORCE=${1:-}

say() { echo "image.sh: $*" >&2; }
die() { say "$*"; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (apt-get)"

# Host tools.
missing=()
for tool in qemu-system-x86_64:qemu-system-x86 cpio:cpio modprobe:kmod xz:xz-utils \
            readelf:binutils tcpdump:tcpdump ip:iproute2; do
  command -v "${tool%%:*}" >/dev/null 2>&1 || missing+=("${tool#*:}")
done
[ -r /usr/share/qemu/qboot.rom ] || missing+=(qemu-system-data)
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y --no-install-recommends "${missing[@]}" >&2 ||
    { apt-get update >&2 && apt-get install -y --no-install-recommends "${missing[@]}" >&2; }
fi

mkdir -p "$DEBS" "$WORK" "$OUT"
chown _apt "$DEBS" 2>/dev/null || true

# What goes into the guest: these packages and the libraries they link.
# apt-cache fails when the package lists are stale or missing (a fresh
# machine): then the lists are refreshed and it is asked again.
KERNEL_PKG=$(apt-cache depends "$KERNEL_META" 2>/dev/null | awk '/Depends: linux-image/{print $2; exit}' || true)
if [ -z "$KERNEL_PKG" ]; then
  apt-get update >&2
  KERNEL_PKG=$(apt-cache depends "$KERNEL_META" | awk '/Depends: linux-image/{print $2; exit}')
fi
[ -n "$KERNEL_PKG" ] || die "no kernel package behind $KERNEL_META (is bookworm-security in the apt sources?)"
# redis-server (its binary is redis-tools' redis-check-rdb under the name
# redis-server) is for `testbed bench-persist`, redis in an NVDIMM guest.
USERSPACE=(busybox-static libc6 libgcc-s1 libibverbs1 ibverbs-providers ibverbs-utils
           librdmacm1 libibumad3 perftest iproute2 ndctl daxctl e2fsprogs
           redis-server redis-tools)
# libelogind0 only stands in for libsystemd0 (redis-tools' dependency).
mapfile -t LIBS < <(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
    --no-breaks --no-replaces --no-enhances "${USERSPACE[@]}" 2>/dev/null |
  grep -E '^(lib|zlib)' | grep -v '^libelogind' | sort -u)

# The version apt would install of each, one apt-cache call.
declare -A VERSION=()
while read -r pkg ver; do VERSION[$pkg]=$ver; done < <(
  apt-cache policy "$KERNEL_PKG" "${USERSPACE[@]}" "${LIBS[@]}" 2>/dev/null |
  awk '/^[^ ]/{p=$1; sub(":$", "", p)} /Candidate:/{print p, $2}')
deb_of() { compgen -G "$DEBS/${1}_${VERSION[$1]//:/%3a}_*.deb" | head -n1 || true; }
fetch() {
  local want=() pkg
  for pkg in "$@"; do
    if [ -z "${VERSION[$pkg]:-}" ] || [ "${VERSION[$pkg]}" = "(none)" ]; then continue; fi
    [ -n "$(deb_of "$pkg")" ] || want+=("$pkg")
  done
  [ ${#want[@]} -eq 0 ] && return 0
  say "downloading ${#want[@]} packages"
  (cd "$DEBS" && apt-get download "${want[@]}" >&2) ||
    { apt-get update >&2 && (cd "$DEBS" && apt-get download "${want[@]}" >&2); }
}
fetch "$KERNEL_PKG" "${USERSPACE[@]}" "${LIBS[@]}"

# Skip the build when nothing it depends on changed.
stamp=$( { for p in "$KERNEL_PKG" "${USERSPACE[@]}"; do echo "$p ${VERSION[$p]:-}"; done
           cat "$HERE/guest-init.sh" "$0"; } | sha256sum | cut -c1-16)
if [ "$FORCE" != --force ] && [ -r "$OUT/stamp" ] && [ "$(cat "$OUT/stamp")" = "$stamp" ] &&
   [ -r "$OUT/initrd.cpio.gz" ]; then
  say "image up to date: $OUT"
  exit 0
fi

# Kernel and the modules the guest loads, in dependency order.
kernel_dir=$WORK/kernel
rm -rf "$kernel_dir" && mkdir -p "$kernel_dir"
dpkg-deb -x "$(deb_of "$KERNEL_PKG")" "$kernel_dir"
kver=$(ls "$kernel_dir/lib/modules")
depmod -b "$kernel_dir" "$kver"
modules=()
# nfit finds emulated NVDIMMs in the ACPI NFIT, nd_pmem makes /dev/pmemN
# (fsdax), dax_pmem + device_dax make /dev/daxX.Y (devdax).
for m in crc32_generic virtio_pci virtio_net virtio_blk ext4 9pnet_virtio 9p rdma_rxe ib_uverbs \
         rdma_ucm libnvdimm nfit nd_btt nd_pmem dax_pmem device_dax; do
  deps=$(modprobe -d "$kernel_dir" -S "$kver" --show-depends "$m" 2>/dev/null) ||
    { say "module $m: not in $KERNEL_PKG, skipped"; continue; }
  while read -r verb path _; do
    [ "$verb" = insmod ] || continue
    rel=${path#"$kernel_dir/lib/modules/$kver/"}
    [[ " ${modules[*]} " == *" $rel "* ]] || modules+=("$rel")
  done <<<"$deps"
done

# Root filesystem: the user-space packages, then libraries until every
# DT_NEEDED entry resolves.
root=$WORK/root
rm -rf "$root" && mkdir -p "$root"/usr/{bin,sbin,lib,lib64} "$root"/{proc,sys,dev,tmp,run,etc,lab}
for d in bin sbin lib lib64; do ln -s "usr/$d" "$root/$d"; done
declare -A ADDED=()
add_pkg() {
  [ -n "${ADDED[$1]:-}" ] && return 0
  local deb
  deb=$(deb_of "$1")
  [ -n "$deb" ] || die "package $1 was not downloaded"
  dpkg-deb --fsys-tarfile "$deb" | tar -C "$root" --keep-directory-symlink -xf - \
    --exclude='./usr/share/doc' --exclude='./usr/share/man' --exclude='./usr/share/locale' \
    --exclude='./usr/share/info' --exclude='./usr/include' --exclude='./usr/lib/x86_64-linux-gnu/gconv'
  ADDED[$1]=1
}
for p in "${USERSPACE[@]}"; do add_pkg "$p"; done
# Of iproute2 only `ip` and `rdma`: tc's plugins would pull in more.
find "$root/usr/bin" "$root/usr/sbin" -maxdepth 1 \( -name 'tc' -o -name 'bridge' -o -name 'ss' \
  -o -name 'nstat' -o -name 'lnstat' -o -name 'ctstat' -o -name 'rtstat' -o -name 'genl' \
  -o -name 'devlink' -o -name 'dcb' -o -name 'vdpa' -o -name 'tipc' -o -name 'arpd' \) -delete
rm -rf "$root/usr/lib/x86_64-linux-gnu/tc"

declare -A PROVIDER=()
for p in "${LIBS[@]}"; do
  deb=$(deb_of "$p")
  [ -n "$deb" ] || continue
  while read -r so; do PROVIDER[$so]=${PROVIDER[$so]:-$p}; done < <(
    dpkg-deb -c "$deb" | awk '{print ($(NF-1) == "->") ? $(NF-2) : $NF}' | grep -E '/lib[^/]*\.so[.0-9]*$' | sed 's#.*/##')
done
for _ in 1 2 3 4 5 6 7 8; do
  needed=$(find "$root/usr" -type f \( -perm -u+x -o -name '*.so*' \) -print0 |
    { xargs -0 readelf -d 2>/dev/null || true; } | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | sort -u)
  todo=()
  for so in $needed; do
    compgen -G "$root/usr/lib*/$so" >/dev/null || compgen -G "$root/usr/lib/x86_64-linux-gnu/$so" >/dev/null ||
      todo+=("$so")
  done
  [ ${#todo[@]} -eq 0 ] && break
  for so in "${todo[@]}"; do
    [ -n "${PROVIDER[$so]:-}" ] || die "no downloaded package provides $so"
    add_pkg "${PROVIDER[$so]}"
  done
done

mkdir -p "$root/lib/modules/$kver"
: >"$root/etc/lab-modules"
for rel in "${modules[@]}"; do
  dst=$root/lib/modules/$kver/${rel%.xz}
  mkdir -p "$(dirname "$dst")"
  case "$rel" in
    *.xz) xz -dc "$kernel_dir/lib/modules/$kver/$rel" >"$dst" ;;
    *) cp "$kernel_dir/lib/modules/$kver/$rel" "$dst" ;;
  esac
  echo "/lib/modules/$kver/${rel%.xz}" >>"$root/etc/lab-modules"
done
install -m 0755 "$HERE/guest-init.sh" "$root/init"
printf 'root:x:0:0:root:/root:/bin/sh\n' >"$root/etc/passwd"
printf 'root:x:0:\n' >"$root/etc/group"
printf '127.0.0.1 localhost\n' >"$root/etc/hosts"
ldconfig -r "$root"

(cd "$root" && find . | cpio -o -H newc --quiet -R 0:0 | gzip -6) >"$OUT/initrd.cpio.gz.new"
mv "$OUT/initrd.cpio.gz.new" "$OUT/initrd.cpio.gz"
cp "$kernel_dir/boot/vmlinuz-$kver" "$OUT/vmlinuz"
{
  echo "kernel $KERNEL_PKG ${VERSION[$KERNEL_PKG]}"
  for p in "${!ADDED[@]}"; do echo "package $p ${VERSION[$p]:-}"; done | sort
  printf 'module %s\n' "${modules[@]}"
} >"$OUT/manifest.txt"
echo "$stamp" >"$OUT/stamp"
say "image built: $OUT ($(du -h "$OUT/initrd.cpio.gz" | cut -f1) initramfs, kernel $kver)"
