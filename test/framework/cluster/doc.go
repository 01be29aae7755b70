// Package cluster runs real Kubernetes nodes on this host for tests and for
// `plinth-dev`: N kubelets, each with its own containerd (Debian's
// containerd 1.6 and runc), CNI bridge, cgroup root and mount namespace, and
// one kube-proxy for the host, joined to a control plane the caller runs.
// It imports nothing under test/: the API server URL, CA and credentials are
// inputs (test/framework/controlplane with Options.Nodes provides all of them).
//
// # Starting a cluster
//
//	cp := controlplane.ForTest(t, controlplane.Options{Nodes: true})
//	opts, err := cp.ClusterOptions() // API server, CA, admin, node and kube-proxy credentials, binaries
//	opts.Images = []string{"bin/images/pause.tar", "bin/images/busybox.tar", ...} // `make images`
//	opts.Nodes = cluster.DefaultNodes(3) // plinth-node-1..3 in zone-a..c; or your own names, zones, labels
//	c, err := cluster.Start(ctx, opts)
//	defer c.Stop()
//
// Pods then run on c.Nodes[i].Name (a scheduler is the caller's: the control
// plane runs none, so DaemonSet and Deployment pods stay Pending until one
// runs); images from the archives are used with imagePullPolicy Never or
// IfNotPresent; Node.Import or Cluster.Import loads more later.
//
// Start checks the host (CheckHost: root, containerd, runc, util-linux,
// iptables, iproute2, containernetworking-plugins, cgroup v1), starts
// kube-proxy, then per node: its cgroup root, its mount namespace, its CNI
// config, containerd, the image archives (Options.Images: at least the
// sandbox image registry.k8s.io/pause:3.10, as nothing is pulled), kubelet;
// and waits until every Node is Ready. A containerd or kubelet that does not
// come up fails Start with an error naming the node and ending with the
// tail of its log. Only one cluster runs per host at a time (a lock in
// /run): kube-proxy owns the host's Service rules.
//
// # One host, N nodes that each look like a node
//
// kubelet keeps state at fixed paths (/var/lib/kubelet/device-plugins,
// /var/log/pods) and Plinth's DaemonSets mount hostPath /var/lib/kubelet
// (plugins/, plugins_registry/, pods/) as every CSI node plugin does. N
// kubelets with N different --root-dir values would need N different
// manifests. Instead each node runs its containerd and kubelet (and so every
// container, which containerd creates from its own mount namespace) in a
// mount namespace of its own (`unshare --mount=<node dir>/mntns
// --propagation unchanged`, entered with nsenter) where /var/lib/kubelet is
// the node's folder <Dir>/<node>/kubelet, bind-mounted. So is each path in
// nodePaths: /var/lib/cni, /var/log/pods, /var/log/containers, /run/netns,
// /run/containerd (the runtime's fixed paths), /var/lib/plinth and /etc/nvme
// (the shipped agent's and CSI node plugin's per-node state and host NQN),
// and Options.NodePaths. kubelet runs with its default
// --root-dir=/var/lib/kubelet.
//
// DaemonSet hostPaths are therefore the standard ones, unchanged:
// /var/lib/kubelet (or its plugins/<driver>, plugins_registry, pods
// subfolders) with mountPropagation Bidirectional for the CSI node plugin;
// /var/lib/plinth and /etc/nvme are the node's own; /dev, /sys, /run/udev,
// /run/lvm, /etc/lvm, /lib/modules are the host's, shared by every node (one
// kernel). Any other hostPath is the host's own folder shared by every node
// unless listed in Options.NodePaths. Mounts made under a per-node path
// other than /var/lib/kubelet stay inside the node (private propagation).
//
// Mount propagation: the node's root folder is bind-mounted onto itself and
// made shared on the host before the namespace is made, so the namespace's
// /var/lib/kubelet is its peer. A mount a CSI node plugin makes under
// /var/lib/kubelet (Bidirectional) shows on the host under
// Node.RootDir, and in every container of that node that mounts it; the
// rest of the host's mounts are private (as on this host), so nothing else a
// node mounts leaks out. Node.Enter gives the nsenter prefix to look at a
// node as its pods do.
//
// # Network
//
// All nodes share the host's network namespace (kubelets serve on NodeIP,
// different ports). Each node's pods get their own bridge (plinth-br<i>)
// and subnet (10.244.<i>.0/24) from the bridge and host-local plugins. Pods
// reach the API server through the `kubernetes` Service with their
// ServiceAccount token: the API server advertises the host's own address
// (HostIP, a pod's packets to it arrive through the bridge) and one
// kube-proxy in iptables mode DNATs 10.0.0.1:443 to it. The host address
// rather than a dummy interface: it exists, needs no clean-up, and kubelets
// need a non-loopback address anyway. busybox's wget cannot complete a TLS
// handshake with kube-apiserver; clients in pods are Go programs (Plinth's
// own, kubectl). IP forwarding is left as the host has
// it, so pods on different nodes do not reach each other; pods reach the
// host (API server, kubelets).
//
// # Clean-up
//
// Stop ends kube-proxy and the kubelets, then per node containerd and every
// process left in the node's mount namespace (shims) or cgroups (pods), by
// PID; releases the namespace (its pod network namespaces and rootfs mounts
// go with it), unmounts what is under the node's root folder, removes the
// cgroup folders and the bridge, and deletes the KUBE-* and CNI-* iptables
// chains that did not exist before Start.
package cluster
