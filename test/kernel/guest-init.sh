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
mkdir -p /run/lvm /run/lock
# /tmp is large (sparse files of tests cost no memory until written)
mount -t tmpfs -o size=8g tmpfs /tmp
echo "PLINTH-GUEST init uptime=$(cut -d' ' -f1 /proc/uptime)s"
for m in virtio_pci virtio_blk virtio_net 9pnet_virtio 9p dm-mod dm-thin-pool dm-snapshot \
	configfs nvmet nvmet-tcp nvme-fabrics nvme-tcp nvme loop ext4 xfs; do
	modprobe "$m" || echo "PLINTH-GUEST modprobe $m failed"
done
mount -t configfs none /sys/kernel/config
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
