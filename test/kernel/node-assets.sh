#!/usr/bin/env bash
# Builds the Kubernetes-node initramfs of the backports guest (make kernel-node-assets):
# the backports initramfs of setup.sh with a second cpio archive appended (the kernel unpacks
# concatenated archives in order; a later file replaces an earlier one). The layer adds what a
# kubelet node needs and the plain guest lacks:
#   - /init = node-init.sh: copies the unpacked initramfs into a tmpfs and switch_roots into it
#     (runc pivot_roots every container out of the node's root, which fails on the initramfs'
#     rootfs), then runs setup.sh's guest-init.sh (/init.guest, unchanged);
#   - /sbin/plinth-node-up = node-up.sh, run by the test once the guest is ready: cgroup2,
#     the node's modules and sysctls, /etc/hosts, the node's folders;
#   - Debian's containerd, containerd-shim-runc-v2, ctr, runc (and libseccomp), the CNI
#     plugins of containernetworking-plugins (/usr/lib/cni, as on the host), iptables (nft)
#     with its extensions, util-linux mount/umount/findmnt/nsenter;
#   - kubelet and kube-proxy from the test bin folder (PLINTH_TESTBIN or ../../bin: make
#     testbin), stripped;
#   - the modules: overlay, bridge, br_netfilter, veth, nf_conntrack, nf_tables + nft_compat and
#     the xt_* matches kube-proxy's iptables rules use; depmod over the union with the base's.
# setup.sh's stable and backports outputs and stamps are not touched: the base is read only.
# Output: .work/backports/node/initramfs.cpio; stamp .work/backports/node/stamp = base stamp +
# sha256 of this script, node-init.sh, node-up.sh, the host packages' versions and the two
# binaries. Idempotent; needs `setup.sh backports` first.
set -euo pipefail
D=$(cd "$(dirname "$0")" && pwd)
B=$D/.work/backports
W=$B/node
BIN=${PLINTH_TESTBIN:-$(cd "$D/../.." && pwd)/bin}
start=$EPOCHREALTIME
elapsed() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN{printf "%.1f", b-a}'; }
say() { echo "kernel-node-assets: $*"; }
[ -f "$B/initramfs.cpio" ] && [ -f "$B/stamp" ] || { echo "node-assets: no backports initramfs: run test/kernel/setup.sh backports" >&2; exit 1; }
for b in kubelet kube-proxy; do
	[ -x "$BIN/$b" ] || { echo "node-assets: $BIN/$b missing (make testbin, or set PLINTH_TESTBIN)" >&2; exit 1; }
done
PKGS=(containerd runc containernetworking-plugins iptables util-linux libseccomp2)
for p in "${PKGS[@]}"; do
	dpkg-query -W -f '${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || { echo "node-assets: Debian package $p missing (hack/install-deps.sh)" >&2; exit 1; }
done
kver=$(cat "$B/kernel.version")
KDIR=$B/kernel/root
stamp="$(cat "$B/stamp") $({
	cat "$0" "$D/node-init.sh" "$D/node-up.sh" "$D/guest-init.sh"
	dpkg-query -W "${PKGS[@]}"
	sha256sum "$BIN/kubelet" "$BIN/kube-proxy" | cut -d' ' -f1
} | sha256sum | cut -c1-16)"
if [ "$(cat "$W/stamp" 2>/dev/null)" = "$stamp" ] && [ -f "$W/initramfs.cpio" ]; then
	say "up to date ($stamp) in $(elapsed "$start")s"
	exit 0
fi
mkdir -p "$W"
rm -f "$W/stamp"
ST=$(mktemp -d "$W/layer.XXXXXX")
trap 'rm -rf "$ST"' EXIT
mkdir -p "$ST"/{sbin,usr/bin,usr/sbin,usr/lib/cni,etc,lib/x86_64-linux-gnu}
copy_bin() { # copy_bin <path> <dest-dir>: the binary and its shared libraries (ldd)
	local src=$1 dst=$2
	mkdir -p "$ST/$dst"
	cp -L "$src" "$ST/$dst/"
	ldd "$src" 2>/dev/null | grep -oE '/[^ ]+\.so[^ ]*' | while read -r lib; do
		[ -e "$ST$lib" ] || { mkdir -p "$ST$(dirname "$lib")"; cp -L "$lib" "$ST$lib"; }
	done
}
# the container runtime: Debian's containerd 1.6 and runc, as the host's nodes use
for b in /usr/bin/containerd /usr/bin/containerd-shim-runc-v2 /usr/bin/ctr /usr/sbin/runc; do
	copy_bin "$b" "$(dirname "${b#/}")"
done
for p in bridge host-local loopback portmap; do
	cp /usr/lib/cni/$p "$ST/usr/lib/cni/"
done
# iptables (nft backend, Debian's default alternative) and its dlopen'ed extensions
copy_bin /usr/sbin/xtables-nft-multi usr/sbin
for t in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do
	ln -sf xtables-nft-multi "$ST/usr/sbin/$t"
done
mkdir -p "$ST/usr/lib/x86_64-linux-gnu"
cp -a /usr/lib/x86_64-linux-gnu/xtables "$ST/usr/lib/x86_64-linux-gnu/"
# util-linux's mount tools (kubelet's mount-utils parses their output; busybox's differ)
for b in mount umount findmnt nsenter; do
	copy_bin "$(command -v $b)" usr/bin
done
for b in kubelet kube-proxy; do
	cp "$BIN/$b" "$ST/usr/bin/$b"
	strip "$ST/usr/bin/$b"
done
# modules: the base's tree (read from its cpio) plus the node's, one depmod over both
MODS="overlay bridge br_netfilter veth nf_conntrack nf_nat nf_tables nft_compat nft_chain_nat
	nft_ct nft_masq nft_nat nft_redir nft_reject_ipv4 nft_reject_inet nft_fib_ipv4 nft_limit
	ip_tables iptable_nat iptable_filter iptable_mangle ip6_tables ip6table_nat ip6table_filter
	ip6table_mangle xt_conntrack xt_MASQUERADE xt_comment xt_mark xt_addrtype xt_statistic
	xt_nat xt_tcpudp xt_multiport xt_physdev xt_set xt_REDIRECT ipt_REJECT ip6t_REJECT"
(cd "$ST" && cpio -i -d --quiet "lib/modules/*" < "$B/initramfs.cpio")
for m in $MODS; do
	modprobe -d "$KDIR" -S "$kver" --show-depends "$m" 2>/dev/null | awk '$1=="insmod"{print $2}'
done | sort -u | while read -r ko; do
	rel=${ko#"$KDIR"}
	case $rel in *.ko.xz) rel=${rel%.xz} ;; esac
	[ -e "$ST$rel" ] && continue
	mkdir -p "$ST$(dirname "$rel")"
	case $ko in
	*.ko.xz) xz -dc "$ko" > "$ST$rel" ;;
	*) cp "$ko" "$ST$rel" ;;
	esac
	strip --strip-debug "$ST$rel"
done
depmod -b "$ST" "$kver"
cp "$D/guest-init.sh" "$ST/init.guest"
cp "$D/node-init.sh" "$ST/init"
cp "$D/node-up.sh" "$ST/sbin/plinth-node-up"
chmod +x "$ST/init" "$ST/init.guest" "$ST/sbin/plinth-node-up"
{
	cat "$B/initramfs.cpio"
	(cd "$ST" && find . -print0 | cpio --null -o -H newc --quiet)
} > "$W/initramfs.cpio.tmp"
mv "$W/initramfs.cpio.tmp" "$W/initramfs.cpio"
echo "$stamp" > "$W/stamp"
say "initramfs $(du -h "$W/initramfs.cpio" | cut -f1) built in $(elapsed "$start")s ($stamp)"
