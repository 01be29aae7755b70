// Package guestnode runs real Kubernetes nodes inside the qemu kernel guests: each guest (the
// node flavor of the backports kernel, test/kernel/node-assets.sh) runs Debian's containerd and
// runc, the CNI bridge and kubelet v1.37 from testbin, joined as a Node to the control plane on
// the host, with the guest's own cgroups (v2), modules and mounts. It is the base the
// production-shape scenario (Helm from a registry onto guest kubelets, NVMe-oF through the
// real kubelet) builds on.
//
// The two guests are the crossnode pair (test/kernel/crossnode): a storage node and a worker
// on the private network of test/kernel/netrelay, whose addresses are the Nodes' InternalIPs.
// Kubelets reach the API server through test/kernel/apimux (the guest's only way out); the API
// server reaches kubelets (pod logs, exec) through its "cluster" egress selector, an HTTP
// CONNECT proxy on the host (Egress) that maps each node address to the guest's qemu hostfwd
// port — what konnectivity does for a control plane that cannot route to its nodes.
//
// The test runs with PLINTH_GUEST_KUBELET=1 after make testbin, make images and make
// kernel-node-assets; make test runs it in its own phase after the crossnode one
// (make test-kernel-guestnode).
package guestnode
