#!/bin/sh
# /init of the Plinth kernel-test guest (built into the initramfs by setup.sh).
# Prepares the environment guest tests rely on (see README.md), then serves
# commands from the host over the 9p share (tag plinth, mounted at /mnt/host):
#   the host writes cmd/<n>.sh (atomically, by rename); the guest runs it with
#   sh, output to cmd/<n>.out, exit code to cmd/<n>.rc (written last, by rename).
#   Commands run concurrently. cmd/poweroff ends the guest.
export PATH=/sbin:/usr/sbin:/bin:/usr/bin HOME=/root TMPDIR=/tmp PLINTH_GUEST=1
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /run
mkdir -p /run/lvm /run/lock /run/cryptsetup
# /tmp is large (sparse files of tests cost no memory until written)
mount -t tmpfs -o size=8g tmpfs /tmp
echo "PLINTH-GUEST init uptime=$(cut -d' ' -f1 /proc/uptime)s"
for m in virtio_pci virtio_blk virtio_net 9pnet_virtio 9p dm-mod dm-thin-pool dm-snapshot \
	configfs nvmet nvmet-tcp nvme-fabrics nvme-tcp nvme loop ext4 xfs bcache \
	dm-crypt xts aesni-intel algif_skcipher; do
	modprobe "$m" || echo "PLINTH-GUEST modprobe $m failed"
done
mount -t configfs none /sys/kernel/config
# OpenZFS (built by zfs.sh; only the stable kernel's initramfs has it); ARC bounded so ZFS
# leaves the 1 GiB guest to the other suites
if [ -d "/lib/modules/$(uname -r)/extra" ]; then
	modprobe zfs zfs_arc_max=134217728 || echo "PLINTH-GUEST modprobe zfs failed"
fi
mkdir -p /etc/zfs /run/udev/data
# No udev here. Two things udev gives ZFS on a node are made the same way:
# 1. /dev/zvol/<pool>/<zvol> links (udev's 60-zvol.rules): for every kernel uevent of a
#    zd device, zvol_id asks the kernel (BLKZNAME ioctl) for the zvol's name. busybox
#    uevent reads the kernel's netlink uevents and runs the handler for each, in order.
cat > /run/zvol-uevent <<'HANDLER'
#!/bin/sh
[ "$SUBSYSTEM" = block ] || exit 0
case $DEVNAME in zd*p*) exit 0 ;; zd*) ;; *) exit 0 ;; esac
dev=/dev/$DEVNAME
# remove, or add of a reused minor: first drop every link to the node
for l in $(find /dev/zvol -type l 2>/dev/null); do
	[ "$(readlink "$l")" = "$dev" ] && rm -f "$l" && rmdir -p "${l%/*}" 2>/dev/null
done
[ "$ACTION" = remove ] && exit 0
name=$(/lib/udev/zvol_id "$dev") || exit 0
mkdir -p "/dev/zvol/${name%/*}" && ln -sfn "$dev" "/dev/zvol/$name"
HANDLER
chmod +x /run/zvol-uevent
uevent /run/zvol-uevent >/dev/null 2>&1 &
ip link set lo up
if [ -e /sys/class/net/eth0 ]; then
	ip link set eth0 up
	ip addr add 10.0.2.15/24 dev eth0
	ip route add default via 10.0.2.2
fi
mkdir -p /mnt/host
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144,cache=none plinth /mnt/host ||
	{ echo "PLINTH-GUEST 9p mount failed"; poweroff -f; }
i=0
while [ ! -b /dev/vdb ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
ls /dev/vd* 2>/dev/null | tr '\n' ' ' | sed 's/^/PLINTH-GUEST disks: /'; echo
# 2. udev database entries with DEVLINKS for the virtio disks and their partitions:
#    after labelling a whole disk, zpool create waits for them (30 s, then fails).
for b in /sys/class/block/vd?; do
	[ -e "$b/dev" ] || continue
	mm=$(cat "$b/dev")
	n=0
	while [ $n -le 15 ]; do
		nm=${b##*/}
		[ $n -gt 0 ] && nm=$nm$n
		printf 'S:%s\nI:1\n' "$nm" > "/run/udev/data/b${mm%:*}:$((${mm#*:} + n))"
		n=$((n + 1))
	done
done
C=/mnt/host/cmd
mkdir -p $C
echo "$(cut -d' ' -f1 /proc/uptime)" > /mnt/host/ready
echo "PLINTH-GUEST ready uptime=$(cut -d' ' -f1 /proc/uptime)s"
cd /root 2>/dev/null || cd /
while [ ! -e $C/poweroff ]; do
	for f in $C/*.sh; do
		[ -e "$f" ] || continue
		n=${f%.sh}
		[ -e "$n.started" ] && continue
		: > "$n.started"
		( sh "$f" > "$n.out" 2>&1; echo $? > "$n.rc.tmp"; mv "$n.rc.tmp" "$n.rc" ) </dev/null &
	done
	sleep 0.1
done
echo "PLINTH-GUEST poweroff uptime=$(cut -d' ' -f1 /proc/uptime)s"
sync
poweroff -f
