#!/bin/sh
# /init of the Kubernetes-node guest (node-assets.sh puts it over guest-init.sh in the
# backports initramfs). runc pivot_roots each container out of the node's root filesystem,
# which the kernel refuses on the initramfs (rootfs cannot be unmounted or moved), so the node
# runs from a tmpfs: copy the unpacked initramfs into one, switch_root into it (busybox
# switch_root frees the initramfs' copy), then run the guest's usual init, /init.guest
# (test/kernel/guest-init.sh, unchanged).
export PATH=/sbin:/usr/sbin:/bin:/usr/bin
mkdir -p /newroot
mount -t tmpfs -o mode=0755 noderoot /newroot || { echo "PLINTH-GUEST node root: tmpfs mount failed"; poweroff -f; }
for f in /* /.[!.]*; do
	[ -e "$f" ] || continue
	[ "$f" = /newroot ] && continue
	cp -a "$f" /newroot/ || { echo "PLINTH-GUEST node root: copy of $f failed"; poweroff -f; }
done
echo "PLINTH-GUEST node root: initramfs copied into a tmpfs; switch_root"
exec switch_root /newroot /init.guest
