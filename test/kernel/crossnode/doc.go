// Package crossnode holds the two-guest NVMe-oF suite (its tests only): a storage guest
// (`plinth agent`: LVM thin pool, nvmet export) and a worker guest (two `plinth csi --mode node`
// instances, each its own initiator identity) — two qemu guests, two kernels — on a private
// network made of qemu socket netdevs through test/kernel/netrelay on the host, which the tests
// cut and restore. The CSI controller service runs in the test process on the host; every part
// reaches the host's kube-apiserver (guests through test/kernel/apimux).
//
// Both guests boot bookworm-backports' kernel (test/kernel/setup.sh "backports", 6.12): it has
// NVMe in-band authentication, which Debian bookworm's 6.1 lacks.
//
// It runs with PLINTH_GUEST_CROSSNODE=1 after make testbin and make kernel-assets (make
// test-kernel does both); both guests boot once for every test of the suite.
package crossnode
