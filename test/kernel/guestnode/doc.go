// Package guestnode runs real Kubernetes nodes inside the qemu kernel guests: each guest (the
// node flavor of the backports kernel, test/kernel/node-assets.sh) runs Debian's containerd and
// runc, the CNI bridge and kubelet v1.37 from testbin, joined as a Node to the control plane on
// the host, with the guest's own cgroups (v2), modules and mounts. On them runs Plinth in
// production shape: the chart installed with the helm CLI (production values: every image from
// Debian's docker-registry on the host, pushed as `make push` pushes), all of its pods on the
// guests, and the scenario through kubelet, in one boot (TestGuestKubelet's steps, in order): a
// StatefulSet's NVMe-oF volume with DH-HMAC-CHAP on the worker, a short and a long link cut at
// the relay under its writes, helm upgrade under mounts, helm uninstall and install again, the
// pod moved to the storage node (revocation order), a local volume grown online.
//
// The guests have no cluster DNS: the key server's Service name maps to 127.0.0.1 in their
// /etc/hosts, where cmd/svcforward (a stand-in, not part of Plinth) carries connections to the
// Service's ClusterIP. Pods reach the other node's pods through a route over the relay.
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
