#!/usr/bin/env bash
# Builds (once, cached) what the kernel-backend tests boot under qemu: Debian's own kernel (the
# package linux-image-amd64 depends on, which ships wireguard.ko) and an initramfs with
# busybox-static and the modules WireGuard, virtio-net and 9p need. The guest's init mounts the
# host's / read-only over 9p as its root (so it runs the host's plexd, ip, wg and their
# libraries), tmpfs on /run and /tmp, the test's work directory read-write at the same path,
# and then runs the agent script the test wrote there (tests/src/qemu.rs).
#
# Usage: scripts/kernel-guest.sh        prints `vmlinuz=PATH` and `initrd=PATH`
# Cache: $PLEXSPHERE_KERNEL_CACHE, default /var/cache/plexsphere/kernel (the .deb, the extracted
# tree and <version>/{vmlinuz,initrd.img}); a second run only prints the paths.
# Needs: apt-get (the package download), dpkg-deb, depmod/modprobe (kmod), cpio, gzip,
# busybox-static; scripts/deps.sh installs them.
set -euo pipefail

cache=${PLEXSPHERE_KERNEL_CACHE:-/var/cache/plexsphere/kernel}
self=$(readlink -f "$0")
die() { echo "kernel-guest: $*" >&2; exit 1; }

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
if [[ -s $out/vmlinuz && -s $out/initrd.img && $out/initrd.img -nt $self ]]; then
  echo "vmlinuz=$out/vmlinuz"
  echo "initrd=$out/initrd.img"
  exit 0
fi

deb=$(ls -1 "$cache/${pkg}"_*.deb 2>/dev/null | tail -n 1 || true)
if [[ -z $deb ]]; then
  echo "kernel-guest: downloading $pkg into $cache" >&2
  (cd "$cache" && apt-get download -q "$pkg" >&2) ||
    die "apt-get download $pkg failed (no network or no apt lists: apt-get update)"
  deb=$(ls -1 "$cache/${pkg}"_*.deb | tail -n 1)
fi
tree=$cache/tree-$version
if [[ ! -f $tree/boot/vmlinuz-$version ]]; then
  rm -rf "$tree"
  dpkg-deb -x "$deb" "$tree"
fi
depmod -b "$tree" "$version"

stage=$(mktemp -d "$cache/initrd-stage.XXXXXX")
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage"/{bin,dev,proc,sys,newroot,modules}
cp /bin/busybox "$stage/bin/busybox"
# Every module, once, in dependency order.
: >"$stage/modules.order"
# nf_tables and what plexd's policy table uses (mesh::nft): conntrack state (nft_ct), the
# drop log's rate (nft_limit) and the log itself (nft_log, nf_log_syslog).
for m in virtio_pci virtio_net 9pnet_virtio 9p wireguard nf_tables nft_ct nft_limit nft_log nf_log_syslog; do
  modprobe -d "$tree" -S "$version" --show-depends "$m" | awk '$1 == "insmod" {print $2}'
done | awk '!seen[$0]++' | while read -r ko; do
  name=$(basename "$ko")
  cp "$ko" "$stage/modules/$name"
  echo "$name" >>"$stage/modules.order"
done
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
chmod 0755 "$stage/init"

mkdir -p "$out"
cp "$tree/boot/vmlinuz-$version" "$out/vmlinuz"
(cd "$stage" && find . | cpio -o -H newc --quiet | gzip -1) >"$out/initrd.img.tmp"
mv "$out/initrd.img.tmp" "$out/initrd.img"
echo "vmlinuz=$out/vmlinuz"
echo "initrd=$out/initrd.img"
