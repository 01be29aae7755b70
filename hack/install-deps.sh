#!/usr/bin/env bash
# Installs the Debian packages the test suites need (idempotent).
# Kernel suite: qemu (software emulation), busybox, kmod, LVM, thin tools, bcache-tools (make-bcache
# for the bcache cache of agents/lvm in the guest), nvme-cli, mkfs, cryptsetup-bin (LUKS2 volumes:
# cryptsetup is copied into the guest initramfs).
# Host suite: e2fsprogs/xfsprogs/util-linux for the file backend on loop devices; fdisk (sfdisk)
# for the raw backend's GPT partitions (host loop devices and the guest).
# test/kernel/setup.sh: xz-utils, zstd (vmlinux extraction: 6.1 is xz, 6.12 zstd; 6.12 modules are .ko.xz), binutils (strip modules), cpio.
# test/kernel/zfs.sh (zfs/spl modules for the guest kernel from Debian contrib's zfs-dkms):
# gcc-12 (Debian's kernel headers set CC=gcc-12), make, libc6-dev, libelf1 + libssl3
# (linux-kbuild tools); the ZFS userland copied into the guest needs libtirpc3, libudev1.
# make test-race: the race detector needs cgo: gcc (the gcc command; gcc-12 alone installs only
# gcc-12) and libc6-dev.
# test/manifests, test/observability: prometheus (promtool check/test rules; /usr/bin/prometheus run by the real-data test; its service is not started).
# make images / test/images: apt-get download and dpkg-deb fetch and unpack the node image's packages.
# Real nodes (test/framework/cluster) and test/images: containerd (its service is not started, see
# policy-rc.d below: each node runs its own), runc, containernetworking-plugins (bridge,
# host-local, loopback), iptables (kube-proxy), iproute2.
# test/framework/registry, test/manifests (helm install from a registry): docker-registry (CNCF
# distribution; its service is not started: each test runs its own on loopback).
# test/e2e's Argo CD phase: redis-server (Argo CD's cache; its service is not started: the test runs
# its own on loopback).
set -euo pipefail
pkgs=(qemu-system-x86 busybox-static kmod lvm2 thin-provisioning-tools bcache-tools nvme-cli cryptsetup-bin e2fsprogs xfsprogs cpio util-linux fdisk xz-utils zstd binutils coreutils git make
	gcc gcc-12 libc6-dev libelf1 libssl3 libtirpc3 libudev1 prometheus
	containerd runc containernetworking-plugins iptables iproute2 docker-registry redis-server)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	# Packages with services (prometheus, docker-registry, redis-server) must not start them here: policy-rc.d says no.
	policy=/usr/sbin/policy-rc.d
	restore=
	if [[ ! -e $policy ]]; then
		printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && restore=1
	fi
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
	[[ -z $restore ]] || rm -f "$policy"
fi
echo "packages ready: ${pkgs[*]}"
