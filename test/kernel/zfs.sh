#!/usr/bin/env bash
# OpenZFS for the kernel-test guest (called by setup.sh; see README.md "ZFS").
#
#   zfs.sh version           print the zfs-dkms version Debian contrib offers
#   zfs.sh build KVER KROOT  make sure .work/zfs/<KVER>_<zfs version>/ holds the
#                            zfs/spl modules built for KVER and the ZFS userland;
#                            print that folder
#
# Debian's contrib is read through a PRIVATE apt configuration in .work/zfs/apt
# (own sources, lists and package cache): the host's apt sources and lists are
# never changed. The modules are built the way zfs-dkms's dkms.conf builds them
# (configure --with-config=kernel, make -C module) against linux-headers-KVER
# unpacked with dpkg -x, without installing anything on the host. The result is
# cached under a version stamp (kernel version + zfs version): it is rebuilt only
# when either changes. Headers and the build tree are deleted afterwards.
# KROOT is the dpkg -x'ed guest kernel package (.work/kernel/root): the built
# modules are checked against the kernel's Module.symvers with depmod -e.
# Env: ZFS_JOBS (make -j, default nproc), ZFS_KCFLAGS (default -g0: no debug
# info; the modules are stripped anyway).
# Host packages (hack/install-deps.sh): gcc-12 (the headers set CC=gcc-12),
# make, libc6-dev, libelf1 + libssl3 (linux-kbuild), dpkg, apt, binutils, kmod.
set -euo pipefail
D=$(cd "$(dirname "$0")" && pwd)
Z=$D/.work/zfs
A=$Z/apt
mkdir -p "$A/sources" "$A/lists/partial" "$A/cache/archives/partial"
APT=(-o "Dir::Etc::SourceList=/dev/null" -o "Dir::Etc::SourceParts=$A/sources"
	-o "Dir::State::Lists=$A/lists" -o "Dir::Cache=$A/cache" -o "APT::Get::List-Cleanup=0")
elapsed() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN{printf "%.1f", b-a}'; }

contrib_update() {
	# the host's own Debian sources (deb822 or one-line), component contrib only
	if [ -f /etc/apt/sources.list.d/debian.sources ]; then
		sed 's/^Components: .*/Components: contrib/' /etc/apt/sources.list.d/debian.sources > "$A/sources/contrib.sources"
	else
		grep -h '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
			awk '{print $1, $2, $3, "contrib"}' | sort -u > "$A/sources/contrib.list"
	fi
	apt-get "${APT[@]}" update -qq >&2
}
candidate() { apt-cache "${APT[@]}" policy zfs-dkms 2>/dev/null | awk '/Candidate:/{print $2}'; }

zfs_version() {
	local v
	v=$(candidate)
	if [ -z "$v" ] || [ "$v" = "(none)" ]; then
		contrib_update
		v=$(candidate)
	fi
	[ -n "$v" ] && [ "$v" != "(none)" ] || { echo "zfs.sh: zfs-dkms not found in Debian contrib" >&2; return 1; }
	echo "$v"
}

download() { # download <dir> <apt options...> -- <packages...>: retry once after an update
	local dir=$1
	shift
	local opts=() pk=()
	while [ "$1" != -- ]; do opts+=("$1"); shift; done
	shift
	pk=("$@")
	(cd "$dir" && apt-get "${opts[@]}" download "${pk[@]}" 2>&1 | grep -v -i unsandboxed >&2; exit "${PIPESTATUS[0]}")
}

build() {
	local kver=$1 kroot=$2 zver out b start t
	start=$EPOCHREALTIME
	zver=$(zfs_version)
	out=$Z/${kver}_${zver}
	if [ -f "$out/stamp" ] && [ "$(cat "$out/stamp")" = "$kver $zver" ]; then
		echo "zfs: modules up to date ($kver, zfs $zver) in $(elapsed "$start")s" >&2
		echo "$out"
		return 0
	fi
	echo "zfs: building zfs $zver modules for $kver (cold: ~4.5 min on 2 idle cores)" >&2
	# one cache entry only: older kernel/zfs builds (and interrupted ones) are dead weight
	find "$Z" -mindepth 1 -maxdepth 1 ! -name apt -exec rm -rf {} +
	b=$(mktemp -d "$Z/build.XXXXXX")
	trap "rm -rf '$b'" EXIT # b is local: expand it now
	mkdir -p "$b/debs"
	t=$EPOCHREALTIME
	# headers from the host's main lists (as setup.sh fetches the kernel), zfs from contrib
	local kb="linux-kbuild-$(echo "$kver" | cut -d. -f1-2)"
	local hpk=("linux-headers-$kver" "linux-headers-${kver%-amd64}-common" "$kb")
	if ! download "$b/debs" -- "${hpk[@]}"; then
		apt-get update -qq >&2
		download "$b/debs" -- "${hpk[@]}"
	fi
	local zpk=(zfs-dkms zfsutils-linux libzfs4linux libnvpair3linux libuutil3linux)
	if ! download "$b/debs" "${APT[@]}" -- "${zpk[@]}"; then
		contrib_update
		download "$b/debs" "${APT[@]}" -- "${zpk[@]}"
	fi
	for p in "$b"/debs/linux-headers-*.deb "$b"/debs/linux-kbuild-*.deb; do dpkg -x "$p" "$b/hdr"; done
	# the arch headers' Makefile includes the -common one by absolute path
	sed -i "s|/usr/src/linux-headers-|$b/hdr/usr/src/linux-headers-|" "$b/hdr/usr/src/linux-headers-$kver/Makefile"
	dpkg -x "$b"/debs/zfs-dkms_*.deb "$b/zsrc"
	mkdir -p "$out.tmp/root"
	for p in "${zpk[@]:1}"; do dpkg -x "$b"/debs/"${p}"_*.deb "$out.tmp/root"; done
	echo "TIMING zfs-fetch $(elapsed "$t")s" >&2
	t=$EPOCHREALTIME
	local src
	src=$(ls -d "$b"/zsrc/usr/src/zfs-*)
	(cd "$src" && KCFLAGS="${ZFS_KCFLAGS--g0}" ./configure --with-config=kernel \
		--with-linux="$b/hdr/usr/src/linux-headers-${kver%-amd64}-common" \
		--with-linux-obj="$b/hdr/usr/src/linux-headers-$kver" > "$b/configure.log" 2>&1) ||
		{ tail -40 "$b/configure.log" >&2; return 1; }
	echo "TIMING zfs-configure $(elapsed "$t")s" >&2
	t=$EPOCHREALTIME
	make -C "$src/module" -j"${ZFS_JOBS:-$(nproc)}" KCFLAGS="${ZFS_KCFLAGS--g0}" > "$b/make.log" 2>&1 ||
		{ tail -40 "$b/make.log" >&2; return 1; }
	echo "TIMING zfs-make $(elapsed "$t")s" >&2
	mkdir -p "$out.tmp/extra"
	find "$src/module" -name '*.ko' | while read -r k; do
		strip --strip-debug -o "$out.tmp/extra/$(basename "$k")" "$k"
	done
	# unresolved symbols against the kernel's Module.symvers (Debian's System.map
	# is a placeholder): depmod -e on a scratch tree of the guest's modules + zfs
	mkdir -p "$b/kroot/lib/modules"
	cp -al "$kroot/lib/modules/$kver" "$b/kroot/lib/modules/"
	rm -f "$b/kroot/lib/modules/$kver"/modules.dep*
	cp -r "$out.tmp/extra" "$b/kroot/lib/modules/$kver/"
	depmod -a -e -E "$b/hdr/usr/src/linux-headers-$kver/Module.symvers" -b "$b/kroot" "$kver" 2> "$b/depmod.log"
	if grep -q 'needs unknown symbol' "$b/depmod.log"; then
		cat "$b/depmod.log" >&2
		return 1
	fi
	echo "$kver $zver" > "$out.tmp/stamp"
	mv "$out.tmp" "$out"
	echo "zfs: built $(ls "$out/extra" | wc -l) modules ($(du -sh "$out/extra" | cut -f1)) for $kver, zfs $zver in $(elapsed "$start")s" >&2
	echo "$out"
}

case ${1:-} in
version) zfs_version ;;
build) build "$2" "$3" ;;
*)
	echo "usage: zfs.sh version | build KVER KROOT" >&2
	exit 2
	;;
esac
