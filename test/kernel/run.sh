#!/usr/bin/env bash
# Kernel suite (make test-kernel): builds a CGO_ENABLED=0 test binary for every
# package in test/kernel/packages.txt, boots ONE qemu guest (Debian's kernel,
# software emulation, -smp 1; see guest/ for the one qemu command line), runs
# the binaries in it one after another, streams their output here and exits
# non-zero if any failed. qemu runs under timeout(1); no qemu survives the run.
# Assets come from setup.sh (make kernel-assets).
#
# Contract for guest tests (details in README.md):
#   - Gate every test: if os.Getenv("PLINTH_KERNEL_TEST") != "1" {
#       t.Skip("kernel test: set PLINTH_KERNEL_TEST=1 (runs in the qemu guest via make test-kernel)") }
#     The binary runs as root with -test.v and TMPDIR=/tmp (tmpfs, size=8g, backed
#     by 1 GiB RAM: sparse files only); its cwd is a
#     copy of the package's testdata/ parent when the package has one, else /tmp.
#   - Disks: /dev/vda 2 GiB (agents/zfs), /dev/vdb 4 GiB (agents/lvm),
#     /dev/vdc 4 GiB (agents/nvmet), /dev/vdd 1 GiB (agents/lvm: the fast VG of the
#     bcache cache): all empty, raw, sparse. Binaries run
#     sequentially in the same guest: leave your disk as you found it is not
#     required, but use only your own disk.
#   - configfs mounted at /sys/kernel/config; modules loaded: dm_mod dm_thin_pool
#     dm_snapshot configfs nvmet nvmet_tcp nvme_fabrics nvme_tcp nvme loop ext4 xfs
#     bcache virtio_* 9p, zfs (zfs_arc_max=128 MiB). /etc/nvme/hostnqn and /etc/nvme/hostid exist.
#     /dev/zvol/<pool>/<zvol> links appear as udev would make them (zvol_id on uevents).
#   - Tools in PATH: busybox, lvm2 (all lv*/vg*/pv* names, lvm.conf without udev),
#     thin_check & co, dmsetup, nvme, mkfs.ext4, mkfs.xfs, e2fsck, resize2fs,
#     xfs_growfs, blkid, wipefs, losetup, make-bcache, bcache-super-show, modprobe, zpool,
#     zfs, /lib/udev/zvol_id.
#   - Network: lo up (127.0.0.1 for nvme-tcp); eth0 10.0.2.15 (qemu user net,
#     restricted: no outbound traffic; host services forwarded at 10.0.2.100).
# Env: KGUEST_TIMEOUT (default 30m), KGUEST_DISKS (default 2G,4G,4G,1G),
#      KGUEST_FLAVOR (default stable: Debian's 6.1 with ZFS; backports: 6.12, NVMe auth),
#      KERNEL_PACKAGES="./agents/lvm ..." to run only some packages,
#      KGUEST_SH="script" run in the guest after the binaries (kguest -sh), e.g. a benchmark:
#        cd /mnt/host/agents_lvm.test.d && PLINTH_KERNEL_TEST=1 /mnt/host/agents_lvm.test \
#          -test.run '^$' -test.bench BenchmarkGuestIdleLVM -test.benchtime 20x
set -euo pipefail
export GOFLAGS="${GOFLAGS:--buildvcs=false -trimpath}" GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
D=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$D/../.." && pwd)
W=$D/.work
cd "$ROOT"
"$D/setup.sh" # idempotent (stamp); rebuilds when guest-init.sh or the tools changed
start=$EPOCHREALTIME
rm -rf "$W/tests"
mkdir -p "$W/tests" "$W/bin"
bins=()
while read -r pkg; do
	pkg=${pkg%%#*}
	pkg=$(echo "$pkg" | xargs)
	[ -n "$pkg" ] || continue
	name=$(echo "${pkg#./}" | tr '/' '_').test
	CGO_ENABLED=0 go test -c -o "$W/tests/$name" "$pkg"
	# a package without test files yields no binary
	[ -f "$W/tests/$name" ] && bins+=("$W/tests/$name=$(go list -f '{{.Dir}}' "$pkg")")
done < <(if [ -n "${KERNEL_PACKAGES:-}" ]; then printf '%s\n' $KERNEL_PACKAGES; else cat "$D/packages.txt"; fi)
go build -o "$W/bin/kguest" ./test/kernel/cmd/kguest
awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN{printf "TIMING build-test-binaries %.1fs\n", b-a}'
sh=()
[ -z "${KGUEST_SH:-}" ] || sh=(-sh "$KGUEST_SH")
exec "$W/bin/kguest" -flavor "${KGUEST_FLAVOR:-stable}" -timeout "${KGUEST_TIMEOUT:-30m}" -disks "${KGUEST_DISKS:-2G,4G,4G,1G}" "${sh[@]}" "${bins[@]}"
