#!/usr/bin/env bash
# Prepares the kernel-test guests (make kernel-assets). Idempotent. Two kernels, each with its
# own assets, stamp and timing lines:
#   stable     Debian's current kernel (linux-image-amd64 through the machine's own apt
#              sources) with ZFS: every single-guest kernel suite. Output in .work/.
#   backports  bookworm-backports' kernel (linux-image-amd64 resolved through a PRIVATE apt
#              configuration in .work/backports/apt that reads only bookworm-backports from the
#              machine's Debian mirror: the machine's own apt sources, lists and default kernel
#              resolution are never changed). It has NVMe in-band authentication
#              (CONFIG_NVME_AUTH, CONFIG_NVME_TARGET_AUTH) and NVMe/TCP TLS, which the stable
#              6.1 kernel lacks; no ZFS. The two-guest suite (test/kernel/guestnode) boots it.
#              Output in .work/backports/.
# `setup.sh` does both; `setup.sh stable` or `setup.sh backports` one. For each kernel:
#   1. resolves linux-image-amd64 → linux-image-<abi>-amd64 with `apt-cache depends`
#      (never a pinned ABI), `apt-get download` + `dpkg -x` into <out>/kernel/root
#      (never into /boot), depmod, and extracts the uncompressed ELF vmlinux
#      (PVH boot, no in-guest decompression under TCG);
#   2. (stable only) has zfs.sh build (or reuse from its cache) the zfs/spl modules for that
#      kernel from Debian contrib's zfs-dkms and unpack the ZFS userland;
#   3. builds the uncompressed initramfs <out>/initramfs.cpio: busybox, kmod, lvm2 + thin
#      tools, nvme-cli, cryptsetup (LUKS2 on dm-crypt), mkfs.ext4/xfs, blkid, wipefs, losetup, make-bcache and bcache-super-show
#      (bcache-tools), (stable) zpool/zfs/zvol_id, the
#      needed modules (+ zfs), lvm.conf without udev, /etc/nvme/hostnqn, and
#      guest-init.sh as /init.
# A stamp (<out>/stamp = kernel version + sha256 of the inputs, zfs version included) skips the
# work when nothing changed. Output: <out>/vmlinux, <out>/initramfs.cpio, <out>/kernel.version.
# Host packages: hack/install-deps.sh.
set -euo pipefail
D=$(cd "$(dirname "$0")" && pwd)
flavor=${1:-all}
if [ "$flavor" = all ]; then
	"$0" stable
	exec "$0" backports
fi
start=$EPOCHREALTIME
elapsed() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN{printf "%.1f", b-a}'; }
case $flavor in
stable)
	W=$D/.work
	APT=()
	ZFS=1
	;;
backports)
	W=$D/.work/backports
	A=$W/apt
	mkdir -p "$A/sources" "$A/lists/partial" "$A/cache/archives/partial"
	# private apt: only bookworm-backports (main), from the machine's own Debian mirror
	APT=(-o "Dir::Etc::SourceList=/dev/null" -o "Dir::Etc::SourceParts=$A/sources"
		-o "Dir::State::Lists=$A/lists" -o "Dir::Cache=$A/cache" -o "APT::Get::List-Cleanup=0")
	ZFS=0
	;;
*)
	echo "usage: setup.sh [stable|backports]" >&2
	exit 2
	;;
esac
mkdir -p "$W"
say() { echo "kernel-assets[$flavor]: $*"; }

apt_update() {
	if [ "$flavor" = backports ]; then
		# the stanza of the machine's Debian archive (not -security), suite bookworm-backports
		if [ -f /etc/apt/sources.list.d/debian.sources ]; then
			awk 'BEGIN{RS=""; ORS="\n\n"} /Suites:/ && !/-security/ {print; exit}' /etc/apt/sources.list.d/debian.sources |
				sed -e 's/^Suites: .*/Suites: bookworm-backports/' -e 's/^Components: .*/Components: main/' > "$A/sources/bookworm-backports.sources"
		else
			grep -h '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | grep -v -- -security |
				awk '{print $1, $2, "bookworm-backports main"; exit}' > "$A/sources/bookworm-backports.list"
		fi
	fi
	local t=$EPOCHREALTIME
	apt-get "${APT[@]}" update -qq
	say "apt-get update in $(elapsed "$t")s"
}
# linux-image-amd64 -> linux-image-<abi>-amd64 (in the backports configuration: the newest
# kernel bookworm-backports carries, e.g. linux-image-6.12.95+deb12-amd64)
resolve() { apt-cache "${APT[@]}" depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}'; }
pkg=$(resolve || true)
if [ -z "$pkg" ]; then
	apt_update
	pkg=$(resolve || true)
fi
[ -n "$pkg" ] || { echo "setup: cannot resolve linux-image-amd64 ($flavor)" >&2; exit 1; }
kver=${pkg#linux-image-}

TOOLPKGS=(busybox-static kmod lvm2 thin-provisioning-tools nvme-cli e2fsprogs xfsprogs util-linux bcache-tools cryptsetup-bin)
# OpenZFS for the guest: zfs-dkms from Debian contrib, built by zfs.sh for this kernel
zver=none
if [ "$ZFS" = 1 ]; then
	zver=$("$D/zfs.sh" version)
fi
inputs_hash() {
	{
		echo "$pkg zfs $zver"
		cat "$D/setup.sh" "$D/guest-init.sh" "$D/zfs.sh"
		dpkg-query -W "${TOOLPKGS[@]}" 2>&1
	} | sha256sum | cut -c1-16
}
stamp="$kver $(inputs_hash)"
if [ "$(cat "$W/stamp" 2>/dev/null)" = "$stamp" ] && [ -f "$W/vmlinux" ] && [ -f "$W/initramfs.cpio" ]; then
	say "up to date ($stamp) in $(elapsed "$start")s"
	exit 0
fi
rm -f "$W/stamp"

# --- kernel
K=$W/kernel
if [ "$(cat "$K/version" 2>/dev/null)" != "$kver" ] || [ ! -f "$W/vmlinux" ]; then
	rm -rf "$K" "$W/vmlinux"
	mkdir -p "$K"
	# stale apt lists name a .deb the mirror no longer has: update once and retry
	t=$EPOCHREALTIME
	if ! (cd "$K" && apt-get "${APT[@]}" download "$pkg" 2>&1 | grep -v -i unsandboxed; exit "${PIPESTATUS[0]}"); then
		apt_update
		new=$(resolve || true)
		if [ "$new" != "$pkg" ]; then
			echo "setup: kernel package is now $new; re-run" >&2
			exec "$0" "$flavor"
		fi
		(cd "$K" && apt-get "${APT[@]}" download "$pkg")
	fi
	say "downloaded $pkg in $(elapsed "$t")s"
	t=$EPOCHREALTIME
	deb=$(ls "$K/${pkg}"_*.deb)
	dpkg -x "$deb" "$K/root"
	rm -f "$deb"
	depmod -b "$K/root" "$kver"
	# extract-vmlinux: the xz (6.1) or zstd (6.12) stream inside the bzImage that
	# decompresses to an ELF
	img=$K/root/boot/vmlinuz-$kver
	for magic in xz:$'\xfd7zXZ\x00' zstd:$'\x28\xb5\x2f\xfd'; do
		for pos in $(LC_ALL=C grep -abo "${magic#*:}" "$img" | cut -d: -f1); do
			case ${magic%%:*} in
			xz) tail -c +$((pos + 1)) "$img" | xz -dc --single-stream > "$W/vmlinux.tmp" 2>/dev/null || true ;;
			zstd) tail -c +$((pos + 1)) "$img" | zstd -dcq > "$W/vmlinux.tmp" 2>/dev/null || true ;;
			esac
			if [ -s "$W/vmlinux.tmp" ] && [ "$(head -c4 "$W/vmlinux.tmp" | od -An -c | tr -d ' ')" = '177ELF' ]; then
				mv "$W/vmlinux.tmp" "$W/vmlinux"
				break 2
			fi
		done
	done
	rm -f "$W/vmlinux.tmp"
	[ -f "$W/vmlinux" ] || { echo "setup: no xz- or zstd-compressed ELF in $img" >&2; exit 1; }
	echo "$kver" > "$K/version"
	say "kernel $kver unpacked, depmod, vmlinux extracted in $(elapsed "$t")s; fetched in $(elapsed "$start")s"
fi

# --- zfs/spl modules and userland (cached under .work/zfs/<kver>_<zfs version>)
ZDIR=
if [ "$ZFS" = 1 ]; then
	t=$EPOCHREALTIME
	ZDIR=$("$D/zfs.sh" build "$kver" "$K/root")
	say "zfs modules ready in $(elapsed "$t")s"
fi

# --- initramfs
t0=$EPOCHREALTIME
KDIR=$K/root
ST=$(mktemp -d "$W/initramfs.XXXXXX")
trap 'rm -rf "$ST"' EXIT
mkdir -p "$ST"/{bin,sbin,etc/lvm,etc/nvme,proc,sys,dev,run,tmp,mnt,root,lib64,usr/bin,usr/sbin,lib/x86_64-linux-gnu}
cp /bin/busybox "$ST/bin/busybox"
for a in $(/bin/busybox --list); do
	[ -e "$ST/bin/$a" ] || ln -s busybox "$ST/bin/$a"
done
copy_bin() { # copy_bin <path> <dest-dir>: the binary and its shared libraries (ldd)
	local src=$1 dst=$2
	mkdir -p "$ST/$dst"
	rm -f "$ST/bin/$(basename "$src")"
	cp -L "$src" "$ST/$dst/"
	ldd "$src" 2>/dev/null | grep -oE '/[^ ]+\.so[^ ]*' | while read -r lib; do
		[ -e "$ST$lib" ] || { mkdir -p "$ST$(dirname "$lib")"; cp -L "$lib" "$ST$lib"; }
	done
}
bin_of() { command -v "$1" || { [ -x "/sbin/$1" ] && echo "/sbin/$1"; } || { [ -x "/usr/sbin/$1" ] && echo "/usr/sbin/$1"; } || { echo "setup: $1 missing (hack/install-deps.sh)" >&2; exit 1; }; }
for b in cryptsetup lvm dmsetup nvme mke2fs e2fsck resize2fs mkfs.xfs xfs_growfs pdata_tools blkid wipefs losetup sfdisk partx make-bcache bcache-super-show; do
	copy_bin "$(bin_of "$b")" sbin
done
copy_bin "$(bin_of kmod)" sbin
for t in modprobe insmod rmmod lsmod depmod modinfo; do
	rm -f "$ST/bin/$t"
	ln -sf kmod "$ST/sbin/$t"
done
ln -sf mke2fs "$ST/sbin/mkfs.ext4"
ln -sf e2fsck "$ST/sbin/fsck.ext4"
for t in thin_check thin_repair thin_dump thin_restore thin_metadata_size; do
	ln -sf pdata_tools "$ST/sbin/$t"
done
for t in pvcreate pvremove pvs pvscan pvresize pvdisplay vgcreate vgremove vgs vgchange vgscan vgdisplay \
	vgextend vgreduce lvcreate lvremove lvs lvextend lvresize lvchange lvdisplay lvrename; do
	rm -f "$ST/bin/$t"
	ln -sf lvm "$ST/sbin/$t"
done
# ZFS userland from the zfsutils-linux/libzfs4linux packages (dpkg -x'ed by zfs.sh):
# zpool, zfs and udev's zvol_id; their libraries map from ZDIR/root to /
copy_zbin() { # copy_zbin <path below ZDIR/root> <dest-dir>
	local src=$ZDIR/root/$1 dst=$2
	mkdir -p "$ST/$dst"
	rm -f "$ST/bin/$(basename "$src")"
	cp -L "$src" "$ST/$dst/"
	LD_LIBRARY_PATH=$ZDIR/root/lib/x86_64-linux-gnu ldd "$src" 2>/dev/null | grep -oE '/[^ ]+\.so[^ ]*' | while read -r lib; do
		rel=${lib#"$ZDIR/root"}
		[ -e "$ST$rel" ] || { mkdir -p "$ST$(dirname "$rel")"; cp -L "$lib" "$ST$rel"; }
	done
}
if [ -n "$ZDIR" ]; then
	copy_zbin sbin/zpool sbin
	copy_zbin sbin/zfs sbin
	copy_zbin lib/udev/zvol_id lib/udev
	mkdir -p "$ST/etc/zfs"
fi
# lvm without udev, systemd, lvmetad, lvmpolld, devices file
cat > "$ST/etc/lvm/lvm.conf" <<'CONF'
config { checks = 1 }
devices {
  use_devicesfile = 0
  obtain_device_list_from_udev = 0
  external_device_info_source = "none"
  scan = [ "/dev" ]
}
activation {
  udev_sync = 0
  udev_rules = 0
  verify_udev_operations = 1
  monitoring = 0
}
global {
  use_lvmlockd = 0
  use_lvmpolld = 0
  thin_check_executable = "/sbin/thin_check"
}
CONF
echo "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-000000000001" > "$ST/etc/nvme/hostnqn"
echo "00000000-0000-4000-8000-000000000001" > "$ST/etc/nvme/hostid"
echo "root:x:0:0:root:/root:/bin/sh" > "$ST/etc/passwd"
echo "root:x:0:" > "$ST/etc/group"
# modules and their dependencies (nvme-auth and nvme-keyring where the kernel has them);
# signatures stripped and xz-compressed modules (6.12) unpacked: faster load under TCG
MODS="virtio_pci virtio_blk virtio_net virtio_console dm-mod dm-thin-pool dm-snapshot configfs
	nvmet nvmet-tcp nvme-tcp nvme-fabrics nvme-core nvme loop ext4 xfs 9p 9pnet_virtio crc32c_intel bcache
	dm-crypt xts aesni-intel algif_skcipher"
mkdir -p "$ST/lib/modules/$kver"
for m in $MODS; do
	modprobe -d "$KDIR" -S "$kver" --show-depends "$m" 2>/dev/null | awk '$1=="insmod"{print $2}'
done | sort -u | while read -r ko; do
	rel=${ko#"$KDIR"}
	mkdir -p "$ST$(dirname "$rel")"
	case $rel in
	*.ko.xz) rel=${rel%.xz}; xz -dc "$ko" > "$ST$rel" ;;
	*) cp "$ko" "$ST$rel" ;;
	esac
	strip --strip-debug "$ST$rel"
done
if [ -n "$ZDIR" ]; then
	# zfs, spl and their siblings (no in-tree dependencies); already stripped by zfs.sh
	mkdir -p "$ST/lib/modules/$kver/extra"
	cp "$ZDIR"/extra/*.ko "$ST/lib/modules/$kver/extra/"
fi
M=$KDIR/lib/modules/$kver
cp "$M/modules.order" "$M/modules.builtin" "$M/modules.builtin.modinfo" "$ST/lib/modules/$kver/"
depmod -b "$ST" "$kver"
cp "$D/guest-init.sh" "$ST/init"
chmod +x "$ST/init"
(cd "$ST" && find . -print0 | cpio --null -o -H newc --quiet) > "$W/initramfs.cpio.tmp"
mv "$W/initramfs.cpio.tmp" "$W/initramfs.cpio"
echo "$kver" > "$W/kernel.version"
echo "$stamp" > "$W/stamp"
say "initramfs $(du -h "$W/initramfs.cpio" | cut -f1) built in $(elapsed "$t0")s; total $(elapsed "$start")s ($stamp)"
