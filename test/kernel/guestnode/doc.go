// Package guestnode is the two-guest suite: one boot of two qemu guests (the node flavor of the
// backports kernel, test/kernel/node-assets.sh), a storage node and a worker on the private
// network of test/kernel/netrelay, whose addresses become the Nodes' InternalIPs. One test,
// TestGuestKubelet, runs two phases on them in order.
//
// The hand-made phase (TestGuestKubelet/HandMade, handmade_*_test.go) makes the CSI calls
// itself, against a control plane of its own with the policy's objects made by hand: `plinth
// agent` under a restart loop on the storage guest (LVM thin on its second disk, nvmet), two
// node plugins as processes (two initiator identities), the CSI controller service in the test
// process. It runs what kubelet cannot drive: a node kept staged while its volume moves
// (fencing), the agent killed at crash points, a held write across a storage reboot,
// DH-HMAC-CHAP with key rotation through the key server, LUKS on the wire, snapshots (one, and
// a group of two taken under a node plugin's freeze) restored on another node. Its
// teardown leaves both guests with no nvmet object, NVMe controller or volume group.
//
// Then each guest runs Debian's containerd and runc, the CNI bridge and kubelet v1.37 from
// testbin, joined as a Node to the host's control plane, with the guest's own cgroups (v2),
// modules and mounts. On them runs Plinth in production shape: the chart installed with the helm
// CLI (production values: every image from Debian's docker-registry on the host, pushed as `make
// push` pushes), all of its pods on the guests, the policy committed to Git and applied by
// Flux's controllers (processes on the host), and the scenario through kubelet (the steps, in
// order): a StatefulSet's NVMe-oF volume with DH-HMAC-CHAP on the worker, a short and a long
// link cut at the relay under its writes, the storage node rebooted, helm upgrade under mounts,
// helm uninstall and install again, the pod moved to the storage node (revocation order), a
// local volume grown online, the worker without its NVMe/TCP modules (bad input).
//
// The guests have no cluster DNS: the key server's Service name maps to 127.0.0.1 in their
// /etc/hosts, where cmd/svcforward (a stand-in, not part of Plinth) carries connections to the
// Service's ClusterIP. Pods reach the other node's pods through a route over the relay.
//
// Kubelets reach the API server through test/kernel/apimux (the guest's only way out); the API
// server reaches kubelets (pod logs, exec) through its "cluster" egress selector, an HTTP
// CONNECT proxy on the host (Egress) that maps each node address to the guest's qemu hostfwd
// port — what konnectivity does for a control plane that cannot route to its nodes.
//
// The test runs with PLINTH_GUEST_KUBELET=1 after make testbin, make images and make
// kernel-node-assets; make test runs it in its own phase (make test-kernel-guestnode), the
// only one that boots two guests, with every step but the kubelet phase's storage reboot
// (StorageNodeRebootRestoresExports); make test-kernel-guestnode-full runs every step.
package guestnode
