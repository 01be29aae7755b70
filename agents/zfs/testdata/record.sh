exec 2>&1
zpool create -f -o ashift=12 plinthz /dev/vda || exit 1
zfs create -p plinthz/k8s/volumes
P=plinthz/k8s/volumes
T=vol-$(printf rec-thick | sha256sum | cut -c1-40)
S=vol-$(printf rec-sparse | sha256sum | cut -c1-40)
zfs create -V 268435456 -b 16384 -o plinth.dev:managed=true -o compression=lz4 $P/$T
zfs create -V 4000006144 -b 16384 -s -o plinth.dev:managed=true $P/$S
zfs create -V 16m $P/foreign
i=0; while [ ! -e /dev/zvol/$P/$S ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done
echo "=== links"; ls -l /dev/zvol/$P/ /dev/zd*
dd if=/dev/urandom of=/dev/zvol/$P/$S bs=1M count=8 conv=fsync 2>/dev/null
L="v=1;vol=$T;size=268435456;mode=Block;policy=00112233445566778899aabbccddeeff;store=rec-store"
zfs set plinth.dev:identity="$L;sum=$(printf '%s\n' $(echo "$L" | tr ';' ' ') | sha256sum | cut -c1-16)" $P/$T
F=name,type,used,available,referenced,volsize,volblocksize,refreservation,plinth.dev:managed,plinth.dev:identity
echo "=== zfs-list-parent.txt"; zfs list -Hp -o $F -t filesystem,volume -d 1 $P
echo "=== zfs-list-one.txt"; zfs list -Hp -o $F $P/$T
echo "=== zpool-list.txt"; zpool list -Hp -o name,size,allocated,free,health plinthz
echo "=== stderr.txt"
zfs list -Hp -o $F plinthz/none
zpool list -Hp -o name,size,allocated,free,health nopool
zfs create -V 1000 -b 16384 $P/odd
zfs create -V 16m $P/foreign
zfs set volsize=1099511627776 $P/$T
exec 3</dev/zvol/$P/$T
zfs destroy $P/$T
exec 3<&-
zfs create -V 1g -b 16384 -o volsize=1 $P/bad
zfs create -V 16m -o compression=nope $P/bad2
echo "=== end"
zfs destroy $P/$T; zfs destroy $P/$S; zfs destroy $P/foreign
sleep 0.5; echo "=== links after destroy"; ls -lR /dev/zvol 2>&1; ls /dev/zd* 2>&1
zpool destroy plinthz
