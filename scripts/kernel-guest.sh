#!/usr/bin/env bash
# Builds (once, cached) what the kernel-backend tests boot under qemu: Debian's own kernel (the
# package linux-image-amd64 depends on, which ships wireguard.ko) and an initramfs with
# busybox-static and the modules WireGuard, virtio-net and 9p need. The guest's init mounts the
# host's / read-only over 9p as its root (so it runs the host's plexd, ip, wg and their
# libraries), tmpfs on /run and /tmp, the test's work directory read-write at the same path,
# and then runs the agent script the test wrote there (tests/src/qemu.rs).
#
# Usage: scripts/kernel-guest.sh        prints `vmlinuz=PATH` and `initrd=PATH`
#        scripts/kernel-guest.sh --disk-root
#                                      prints `vmlinuz=PATH`, `initrd=PATH` and `modules=DIR`:
#                                      the same kernel with an initrd that loads virtio-blk and
#                                      ext4 and switches to the ext4 root on /dev/vda (the
#                                      OpenStack lab's guest, scripts/openstack-lab), and the
#                                      kernel's module tree for that root
# Cache: $PLEXSPHERE_KERNEL_CACHE, default /var/cache/plexsphere/kernel (the .deb, the extracted
# tree and <version>/{vmlinuz,initrd.img}); a second run only prints the paths.
# Needs: apt-get (the package download), dpkg-deb, depmod/modprobe (kmod), cpio, gzip,
# busybox-static; scripts/deps.sh installs them.
set -euo pipefail

cache=${PLEXSPHERE_KERNEL_CACHE:-/var/cache/plexsphere/kernel}
self=$(readlink -f "$0")
die() { echo "kernel-guest: $*" >&2; exit 1; }
disk_root=0
case ${1:-} in
  "") ;;
  --disk-root) disk_root=1 ;;
  *) die "unknown argument $1 (expected nothing or --disk-root)" ;;
esac
initrd_name=initrd.img
((disk_root)) && initrd_name=initrd-disk.img

for tool in dpkg-deb depmod modprobe cpio gzip; do
  command -v "$tool" >/dev/null || die "$tool is missing: run scripts/deps.sh (packages kmod, cpio, gzip, dpkg)"
done
# The list is read whole first: under pipefail, `grep -q` stopping at its match could leave
# busybox writing to a closed pipe (SIGPIPE), and the check would fail now and then.
busybox_applets=$(/bin/busybox --list 2>/dev/null || true)
if ! grep -qx insmod <<<"$busybox_applets"; then
  die "/bin/busybox (static) is missing: apt-get install busybox-static"
fi
mkdir -p "$cache"

# The kernel package: the one linux-image-amd64 depends on; a cached .deb when apt cannot say.
pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}' || true)
if [[ -z $pkg ]]; then
  deb=$(ls -1 "$cache"/linux-image-*-amd64_*.deb 2>/dev/null | sort -V | tail -n 1 || true)
  [[ -n $deb ]] || die "apt knows no linux-image-amd64 (run apt-get update) and $cache holds no kernel package"
  pkg=$(basename "$deb" | cut -d_ -f1)
fi
version=${pkg#linux-image-}
out=$cache/$version
tree=$cache/tree-$version
report() {
  echo "vmlinuz=$out/vmlinuz"
  echo "initrd=$out/$initrd_name"
  if ((disk_root)); then echo "modules=$tree/lib/modules/$version"; fi
}
if [[ -s $out/vmlinuz && -s $out/$initrd_name && $out/$initrd_name -nt $self ]]; then
  report
  exit 0
fi

deb=$(ls -1 "$cache/${pkg}"_*.deb 2>/dev/null | tail -n 1 || true)
if [[ -z $deb ]]; then
  echo "kernel-guest: downloading $pkg into $cache" >&2
  (cd "$cache" && apt-get download -q "$pkg" >&2) ||
    die "apt-get download $pkg failed (no network or no apt lists: apt-get update)"
  deb=$(ls -1 "$cache/${pkg}"_*.deb | tail -n 1)
fi
if [[ ! -f $tree/boot/vmlinuz-$version ]]; then
  rm -rf "$tree"
  dpkg-deb -x "$deb" "$tree"
fi
depmod -b "$tree" "$version"

stage=$(mktemp -d "$cache/initrd-stage.XXXXXX")
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage"/{bin,dev,proc,sys,newroot,modules}
cp /bin/busybox "$stage/bin/busybox"
# stage_modules MODULE...: every module named and what it needs, once, in dependency order,
# in the initrd's /modules with their load order in /modules.order.
stage_modules() {
  : >"$stage/modules.order"
  local m ko name
  for m in "$@"; do
    modprobe -d "$tree" -S "$version" --show-depends "$m" | awk '$1 == "insmod" {print $2}'
  done | awk '!seen[$0]++' | while read -r ko; do
    name=$(basename "$ko")
    cp "$ko" "$stage/modules/$name"
    echo "$name" >>"$stage/modules.order"
  done
}
# pack: the staged initrd into $out/$initrd_name, and the kernel beside it.
pack() {
  chmod 0755 "$stage/init"
  mkdir -p "$out"
  cp "$tree/boot/vmlinuz-$version" "$out/vmlinuz"
  (cd "$stage" && find . | cpio -o -H newc --quiet | gzip -1) >"$out/$initrd_name.tmp"
  mv "$out/$initrd_name.tmp" "$out/$initrd_name"
  report
}

if ((disk_root)); then
  # crc32c_generic: ext4's checksums need a crc32c, which --show-depends does not list.
  stage_modules virtio_pci virtio_blk crc32c_generic ext4
  cat >"$stage/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
while read -r m; do insmod "/modules/$m" 2>/dev/null || echo "plexguest: insmod $m failed"; done </modules.order
i=0
while [ ! -b /dev/vda ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
if ! mount -t ext4 -o rw /dev/vda /newroot; then
  echo "plexguest: cannot mount /dev/vda as the root"
  sleep 5
  poweroff -f
fi
mount --move /dev /newroot/dev
umount /proc /sys
exec switch_root /newroot /sbin/init
INIT
  pack
  exit 0
fi

# nf_tables and what plexd's policy table uses (mesh::nft): conntrack state (nft_ct), the
# drop log's rate (nft_limit) and the log itself (nft_log, nf_log_syslog).
stage_modules virtio_pci virtio_net 9pnet_virtio 9p wireguard nf_tables nft_ct nft_limit nft_log nf_log_syslog
grep -q '^wireguard.ko' "$stage/modules.order" || die "no wireguard.ko in $pkg"

cat >"$stage/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
while read -r m; do insmod "/modules/$m" || echo "plexguest: insmod $m failed"; done </modules.order
work=$(sed -n 's/.*plexguest\.work=\([^ ]*\).*/\1/p' /proc/cmdline)
fail() { echo "plexguest: $*"; poweroff -f; }
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144 hostroot /newroot || fail "no hostroot share"
for d in run tmp; do mount -t tmpfs tmpfs "/newroot/$d"; done
mount -t proc proc /newroot/proc
mount -t sysfs sysfs /newroot/sys
mount -t devtmpfs devtmpfs /newroot/dev
[ -n "$work" ] || fail "no plexguest.work= on the kernel command line"
[ -d "/newroot$work" ] || mkdir -p "/newroot$work" || fail "cannot create $work"
mount -t 9p -o trans=virtio,version=9p2000.L,rw,msize=262144 work "/newroot$work" || fail "no work share"
echo "plexguest: kernel $(uname -r), root shared, work at $work"
exec chroot /newroot /bin/sh "$work/agent.sh"
INIT
pack
