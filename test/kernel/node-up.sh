#!/bin/sh
# plinth-node-up: makes the booted guest a Kubernetes node's host (node-assets.sh installs it;
# the test runs it once the guest is ready, before containerd and kubelet). Usage:
#   plinth-node-up <hostname>
# cgroup v2 (the guest's kernel is its own: the unified hierarchy, as current distributions
# mount it), the modules and sysctls of containerd (overlayfs), the CNI bridge and kube-proxy
# (br_netfilter, conntrack, iptables over nf_tables), /etc/hosts, /etc/machine-id, the node's
# NVMe host NQN and ID, / as a shared mount and the folders kubelet and containerd expect. Exits non-zero naming what failed.
set -e
name=${1:?usage: plinth-node-up <hostname>}
fail() { echo "plinth-node-up: $*" >&2; exit 1; }
grep -q ' / tmpfs ' /proc/mounts || fail "the root is not a tmpfs (not booted from the node initramfs?)"
if ! grep -q ' /sys/fs/cgroup cgroup2 ' /proc/mounts; then
	mount -t cgroup2 -o nsdelegate cgroup2 /sys/fs/cgroup || fail "mount cgroup2"
fi
# every controller the kernel offers, for the children of the root (kubelet's kubepods)
for c in $(cat /sys/fs/cgroup/cgroup.controllers); do
	echo "+$c" > /sys/fs/cgroup/cgroup.subtree_control || fail "enable cgroup controller $c"
done
for m in overlay bridge br_netfilter veth nf_conntrack nf_tables nft_compat nft_chain_nat xt_conntrack \
	xt_MASQUERADE xt_comment xt_mark xt_addrtype xt_statistic xt_nat xt_tcpudp xt_multiport; do
	modprobe "$m" || fail "modprobe $m"
done
grep -qw overlay /proc/filesystems || fail "no overlay filesystem after modprobe overlay"
sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1 net.bridge.bridge-nf-call-ip6tables=1 ||
	fail "sysctl"
hostname "$name"
echo "$name" > /etc/hostname
printf '127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n127.0.1.1 %s\n' "$name" > /etc/hosts
[ -s /etc/resolv.conf ] || echo "nameserver 127.0.0.1" > /etc/resolv.conf
# kubelet and cadvisor read the machine ID; one per node name
id=$(echo "$name" | md5sum | cut -c1-32)
echo "$id" > /etc/machine-id
# the node's own NVMe host identity (nvme-cli's package makes one per machine; the initramfs
# carries one for every guest): a UUID from the machine ID
uuid=$(echo "$id" | sed -E 's/^(.{8})(.{4}).(.{3}).(.{3})(.{12})$/\1-\2-4\3-8\4-\5/')
echo "nqn.2014-08.org.nvmexpress:uuid:$uuid" > /etc/nvme/hostnqn
echo "$uuid" > /etc/nvme/hostid
# mounts propagate as on a systemd host (/ shared): kubelet's Bidirectional volumes (the CSI
# node plugin's /var/lib/kubelet) need a shared mount under them
mount --make-rshared / || fail "mount --make-rshared /"
mkdir -p /var/lib/kubelet /var/lib/containerd /run/containerd /etc/containerd /etc/cni/net.d /etc/kubernetes/pki \
	/var/log/pods /var/log/containers /var/lib/cni
echo "plinth-node-up: $name ready: cgroup2 ($(cat /sys/fs/cgroup/cgroup.subtree_control)), overlay, br_netfilter, $(cat /etc/nvme/hostnqn)"
