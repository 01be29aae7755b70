package cluster_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/plinth-storage/plinth/test/framework/cluster"
	"github.com/plinth-storage/plinth/test/framework/controlplane"
	"github.com/plinth-storage/plinth/test/prereq"
)

// busyboxImage is the reference of the busybox archive `make images` writes.
const busyboxImage = "docker.io/library/busybox:plinth"

func requireHost(t *testing.T) {
	t.Helper()
	prereq.Env(t, controlplane.EnvIntegration, "a node integration test (root, containerd, runc, containernetworking-plugins, make testbin, make images): make test-integration sets it")
	if err := cluster.CheckHost(); err != nil {
		t.Fatalf("node prerequisites: %v", err)
	}
}

// hostState is what a cluster may leave behind on the host.
type hostState struct {
	mounts  []string
	cgroups []string
	links   []string
	chains  []string
}

func snapshot(t *testing.T) hostState {
	t.Helper()
	var s hostState
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if f := strings.Fields(line); len(f) > 4 {
			s.mounts = append(s.mounts, f[4])
		}
	}
	s.cgroups, _ = filepath.Glob("/sys/fs/cgroup/*/plinth-*")
	if out, err := exec.Command("ip", "-o", "link", "show").Output(); err == nil {
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if f := strings.Fields(line); len(f) > 1 {
				s.links = append(s.links, strings.SplitN(strings.TrimSuffix(f[1], ":"), "@", 2)[0])
			}
		}
	}
	for _, bin := range []string{"iptables-save", "ip6tables-save"} {
		out, err := exec.Command(bin).Output()
		if err != nil {
			continue
		}
		table := ""
		for _, line := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(line, "*") {
				table = line[1:]
			} else if f := strings.Fields(strings.TrimPrefix(line, ":")); strings.HasPrefix(line, ":") && len(f) > 1 && f[1] == "-" {
				// user-defined chains only (policy "-"): a cluster's own chains (KUBE-*, CNI-*)
				// must go with it, while the built-in chains of a table appear for good the first
				// time anything on a fresh host uses that table
				s.chains = append(s.chains, bin+" "+table+" "+f[0])
			}
		}
	}
	for _, l := range [][]string{s.mounts, s.cgroups, s.links, s.chains} {
		sort.Strings(l)
	}
	return s
}

// added returns what is in after but not in before.
func added(before, after []string) []string {
	seen := map[string]int{}
	for _, b := range before {
		seen[b]++
	}
	var out []string
	for _, a := range after {
		if seen[a] > 0 {
			seen[a]--
			continue
		}
		out = append(out, a)
	}
	return out
}

// assertClean fails t when the cluster left a process, mount, cgroup folder,
// network link or iptables chain behind.
func assertClean(t *testing.T, before hostState, dir string, pids []int) {
	t.Helper()
	after := snapshot(t)
	for what, l := range map[string][]string{
		"mounts":          added(before.mounts, after.mounts),
		"cgroup folders":  added(before.cgroups, after.cgroups),
		"network links":   added(before.links, after.links),
		"iptables chains": added(before.chains, after.chains),
	} {
		if len(l) > 0 {
			t.Errorf("%s left after Stop: %v", what, l)
		}
	}
	for _, pid := range pids {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("pid %d still exists after Stop", pid)
		}
	}
	// containerd shims name their containerd's socket, which is under dir.
	if out, err := exec.Command("pgrep", "-a", "-f", dir).Output(); err == nil {
		t.Errorf("processes of %s still running after Stop:\n%s", dir, out)
	}
}

func TestStartFailureNamesNodeAndCleansUp(t *testing.T) {
	requireHost(t)
	// Another package's cluster (the e2e scenario) may hold the host; its mounts and links are
	// not this test's, and its run time is not this test's budget.
	if err := cluster.WaitLockFree(t.Context()); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(t.Context(), 8*time.Minute)
	defer cancel()
	// /bin/false as kubelet: containerd, the mount namespace and the cgroups
	// are made, then kubelet exits at once.
	_, err := cluster.Start(ctx, cluster.Options{
		Dir: filepath.Join(dir, "c"), Nodes: []cluster.NodeOptions{{Name: "doomed-1", Zone: "zone-a"}},
		APIServer: "https://127.0.0.1:1", CAFile: "/dev/null", Admin: &rest.Config{Host: "https://127.0.0.1:1"},
		NodeKubeconfig: func(string) (string, error) { return "/dev/null", nil },
		NodeIP:         "192.0.2.254", Kubelet: "/bin/false", StartTimeout: 30 * time.Second,
	})
	if err == nil {
		t.Fatal("Start with a kubelet that exits: no error")
	}
	t.Logf("the error users see:\n%v", err)
	for _, want := range []string{"node doomed-1", "kubelet", "last lines of"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not contain %q:\n%v", want, err)
		}
	}
	assertClean(t, before, dir, nil)
	if _, err := os.Stat(filepath.Join(dir, "c", "doomed-1")); err != nil {
		t.Errorf("Options.Dir given: the node folder should stay for reading logs: %v", err)
	}
}

func TestOptionsErrors(t *testing.T) {
	_, err := cluster.Start(t.Context(), cluster.Options{Nodes: []cluster.NodeOptions{{Name: "Bad_Name"}, {Name: "a"}, {Name: "a"}}})
	if err == nil {
		t.Fatal("no error for empty options")
	}
	for _, want := range []string{"APIServer is required", "Kubelet", `"Bad_Name"`, `"a": given twice`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not contain %q:\n%v", want, err)
		}
	}
}

// TestCluster starts a control plane and three real nodes, runs pods on each
// and checks logs, exec, the kubernetes Service from a pod, Bidirectional
// mount propagation, then that Stop leaves nothing behind; twice, to measure
// a first (cold) and a second (warm) start.
func TestCluster(t *testing.T) {
	requireHost(t)
	controlplane.RequireBinaries(t, controlplane.BinEtcd, controlplane.BinKubeAPIServer,
		controlplane.BinKubeControllerManager, controlplane.BinKubectl, controlplane.BinKubelet, controlplane.BinKubeProxy)
	images := controlplane.ImageArchives(t, "pause", "busybox")
	cp := controlplane.ForTest(t, controlplane.Options{Nodes: true})
	cs, err := kubernetes.NewForConfig(cp.Admin.Config)
	if err != nil {
		t.Fatal(err)
	}
	for i, phase := range []string{"cold", "warm"} {
		before := snapshot(t)
		opts, err := cp.ClusterOptions()
		if err != nil {
			t.Fatal(err)
		}
		opts.Images = images
		opts.KeepDir = true // logs to read when the test fails; removed below when it passes
		opts.Labels = map[string]string{"plinth.dev/test": "cluster"}
		opts.Nodes = cluster.DefaultNodes(3)
		for j := range opts.Nodes {
			opts.Nodes[j].Name = fmt.Sprintf("%s-%d", phase, j+1)
		}
		t0 := time.Now()
		c, err := cluster.Start(t.Context(), opts)
		if err != nil {
			t.Fatalf("%s start: %v", phase, err)
		}
		t.Logf("%s start: 3 nodes Ready in %s (Start → Ready %s)", phase, time.Since(t0).Round(time.Millisecond), c.StartDuration.Round(time.Millisecond))
		// Stop runs below; this covers a t.Fatal on the way (Stop is idempotent).
		t.Cleanup(func() { _ = c.Stop() })
		pids, dir := c.PIDs(), c.Dir
		if i == 0 {
			exercise(t, cp, cs, c)
		}
		if err := c.Stop(); err != nil {
			t.Errorf("%s Stop: %v", phase, err)
		}
		assertClean(t, before, dir, pids)
		if !t.Failed() {
			if err := os.RemoveAll(dir); err != nil {
				t.Error(err)
			}
		} else {
			t.Logf("%s cluster folder kept for its logs: %s", phase, dir)
		}
		// The Node objects stay (as when a real node dies); the next round
		// uses other names.
		if t.Failed() {
			return
		}
	}
}

func exercise(t *testing.T, cp *controlplane.ControlPlane, cs kubernetes.Interface, c *cluster.Cluster) {
	ctx := t.Context()
	for _, n := range c.Nodes {
		node, err := cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := node.Labels[cluster.ZoneLabel]; got != n.Zone || got == "" {
			t.Errorf("node %s: zone label %q, want %q", n.Name, got, n.Zone)
		}
		if node.Labels["plinth.dev/test"] != "cluster" {
			t.Errorf("node %s: labels %v lack plinth.dev/test=cluster", n.Name, node.Labels)
		}
	}
	// Nodes register without taints; the not-ready taint the
	// TaintNodesByCondition admission plugin adds at registration goes once
	// the node-lifecycle controller sees the node Ready.
	for _, n := range c.Nodes {
		eventually(t, "node "+n.Name+" untainted", func() error {
			node, err := cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if len(node.Spec.Taints) != 0 {
				return fmt.Errorf("taints %v", node.Spec.Taints)
			}
			return nil
		})
	}

	kubectl, err := controlplane.BinaryPath("", controlplane.BinKubectl)
	if err != nil {
		t.Fatal(err)
	}
	kctl := func(args ...string) (string, error) {
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		var out, stderr bytes.Buffer
		cmd := exec.CommandContext(cctx, kubectl, append([]string{"--kubeconfig", cp.Admin.Kubeconfig}, args...)...)
		cmd.Stdout, cmd.Stderr = &out, &stderr
		if err := cmd.Run(); err != nil {
			return out.String(), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, stderr.String())
		}
		return out.String(), nil
	}

	// The project's kubectl (a real client-go, dynamically linked) is run
	// inside the pods from read-only hostPath mounts of its folder and the
	// host's libc: busybox's wget cannot complete a TLS handshake with
	// kube-apiserver (alert 40).
	var hostMounts []corev1.VolumeMount
	var hostVolumes []corev1.Volume
	for i, p := range []string{filepath.Dir(kubectl), "/lib64", "/lib/x86_64-linux-gnu"} {
		name := fmt.Sprintf("host-%d", i)
		mp := p
		if i == 0 {
			mp = "/kbin"
		}
		hostMounts = append(hostMounts, corev1.VolumeMount{Name: name, MountPath: mp, ReadOnly: true})
		hostVolumes = append(hostVolumes, corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: p}}})
	}

	// One busybox pod per node (nodeName: no scheduler runs here).
	for _, n := range c.Nodes {
		createPod(t, cs, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "bb-" + n.Name, Namespace: "default"},
			Spec: corev1.PodSpec{
				NodeName:                      n.Name,
				TerminationGracePeriodSeconds: ptr(int64(0)),
				Containers: []corev1.Container{{
					Name: "bb", Image: busyboxImage, ImagePullPolicy: corev1.PullNever,
					Command: []string{"sh", "-c", "echo hello-from-$NODE; exec sleep 3600"},
					Env: []corev1.EnvVar{
						{Name: "NODE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
						{Name: "HOME", Value: "/tmp"},
					},
					VolumeMounts: hostMounts,
				}},
				Volumes: hostVolumes,
			},
		})
	}
	for _, n := range c.Nodes {
		waitRunning(t, cs, "bb-"+n.Name)
		out, err := kctl("logs", "bb-"+n.Name)
		if err != nil {
			t.Errorf("node %s: %v", n.Name, err)
		} else if !strings.Contains(out, "hello-from-"+n.Name) {
			t.Errorf("node %s: kubectl logs = %q", n.Name, out)
		}
		out, err = kctl("exec", "bb-"+n.Name, "--", "cat", "/etc/hostname")
		if err != nil {
			t.Errorf("node %s: %v", n.Name, err)
		} else if strings.TrimSpace(out) != "bb-"+n.Name {
			t.Errorf("node %s: kubectl exec cat /etc/hostname = %q", n.Name, out)
		}
	}

	// The kubernetes Service from a pod's network namespace, authenticated by
	// the pod's ServiceAccount token and verified with the mounted
	// kube-root-ca.crt: kubectl's in-cluster config dials
	// KUBERNETES_SERVICE_HOST:PORT (10.0.0.1:443, which kube-proxy forwards
	// to the API server); `auth whoami` is a SelfSubjectReview, answered with
	// the identity the API server saw.
	for _, n := range c.Nodes {
		out, err := kctl("exec", "bb-"+n.Name, "--", "/kbin/kubectl", "auth", "whoami", "-o", "jsonpath={.status.userInfo.username}")
		if err != nil {
			t.Errorf("node %s: API server through the kubernetes Service: %v", n.Name, err)
		} else if strings.TrimSpace(out) != "system:serviceaccount:default:default" {
			t.Errorf("node %s: kubectl auth whoami in the pod = %q, want the default ServiceAccount", n.Name, out)
		}
	}

	// A privileged hostNetwork pod's Bidirectional mount under
	// /var/lib/kubelet shows on the host, under that node's root folder only.
	n1 := c.Nodes[0]
	bidir := corev1.MountPropagationBidirectional
	createPod(t, cs, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "mounter", Namespace: "default"},
		Spec: corev1.PodSpec{
			NodeName: n1.Name, HostNetwork: true, TerminationGracePeriodSeconds: ptr(int64(0)),
			AutomountServiceAccountToken: ptr(false),
			Containers: []corev1.Container{{
				Name: "m", Image: busyboxImage, ImagePullPolicy: corev1.PullNever,
				Command:         []string{"sh", "-c", "mkdir -p /host/t && mount -t tmpfs plinth-bidir /host/t && echo marker > /host/t/f && echo mounted && exec sleep 3600"},
				SecurityContext: &corev1.SecurityContext{Privileged: ptr(true)},
				VolumeMounts:    []corev1.VolumeMount{{Name: "kl", MountPath: "/host", MountPropagation: &bidir}},
			}},
			Volumes: []corev1.Volume{{Name: "kl", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{
				Path: cluster.KubeletRootDir + "/plinth-test", Type: ptr(corev1.HostPathDirectoryOrCreate)}}}},
		},
	})
	waitRunning(t, cs, "mounter")
	hostPath := filepath.Join(n1.RootDir, "plinth-test", "t")
	eventually(t, "mounter pod mounts its tmpfs", func() error {
		out, err := kctl("logs", "mounter")
		if err != nil || !strings.Contains(out, "mounted") {
			return fmt.Errorf("log %q %v", out, err)
		}
		return nil
	})
	if m, err := cluster.MountsUnder(hostPath); err != nil || len(m) != 1 {
		t.Errorf("host mounts at %s: %v %v, want the pod's tmpfs", hostPath, m, err)
	}
	if data, err := os.ReadFile(filepath.Join(hostPath, "f")); err != nil || string(data) != "marker\n" {
		t.Errorf("host reads %s/f: %q %v", hostPath, data, err)
	}
	if m, _ := cluster.MountsUnder(cluster.KubeletRootDir); len(m) != 0 {
		t.Errorf("the host's own %s has mounts %v: a node's mount leaked", cluster.KubeletRootDir, m)
	}
	other := c.Nodes[1]
	out, err := exec.Command("nsenter", "--mount="+other.MountNamespace, "--", "cat", "/proc/self/mountinfo").Output()
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(out, []byte(cluster.KubeletRootDir+"/plinth-test/t ")) {
		t.Errorf("node %s sees node %s's pod mount under its own %s", other.Name, n1.Name, cluster.KubeletRootDir)
	}

	// Node services killed and started again (as their systemd units restart on a real node):
	// the node's pod keeps its one container (no restart), answers exec through the new
	// kubelet and containerd, and the node stays Ready.
	pod := "bb-" + n1.Name
	containerID := func() (string, int32) {
		p, err := cs.CoreV1().Pods("default").Get(ctx, pod, metav1.GetOptions{})
		if err != nil || len(p.Status.ContainerStatuses) != 1 {
			t.Fatalf("pod %s: %v %+v", pod, err, p.Status)
		}
		return p.Status.ContainerStatuses[0].ContainerID, p.Status.ContainerStatuses[0].RestartCount
	}
	id0, _ := containerID()
	for _, restart := range []struct {
		what string
		do   func(context.Context, string, bool) error
	}{{"kubelet", c.RestartKubelet}, {"containerd", c.RestartContainerd}} {
		oldPIDs := c.PIDs()
		if err := restart.do(ctx, n1.Name, true); err != nil {
			t.Fatalf("restart %s: %v", restart.what, err)
		}
		if slices.Equal(oldPIDs, c.PIDs()) {
			t.Errorf("restart %s: the node's PIDs did not change (%v)", restart.what, oldPIDs)
		}
		eventually(t, "exec in "+pod+" after the "+restart.what+" restart", func() error {
			out, err := kctl("exec", pod, "--", "cat", "/etc/hostname")
			if err != nil {
				return err
			}
			if strings.TrimSpace(out) != pod {
				return fmt.Errorf("hostname %q", out)
			}
			return nil
		})
		if id, restarts := containerID(); id != id0 || restarts != 0 {
			t.Errorf("after the %s restart: container %s (restarts %d), want %s unchanged with 0 restarts", restart.what, id, restarts, id0)
		}
	}
	if err := c.WaitReady(ctx); err != nil {
		t.Errorf("nodes after the restarts: %v", err)
	}
}

func createPod(t *testing.T, cs kubernetes.Interface, pod *corev1.Pod) {
	t.Helper()
	// The ServiceAccount admission plugin refuses pods until the
	// serviceaccount controller has made the namespace's default account.
	eventually(t, "create pod "+pod.Name, func() error {
		_, err := cs.CoreV1().Pods(pod.Namespace).Create(t.Context(), pod, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
		return err
	})
}

func waitRunning(t *testing.T, cs kubernetes.Interface, name string) {
	t.Helper()
	eventually(t, "pod "+name+" Running", func() error {
		p, err := cs.CoreV1().Pods("default").Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Status.Phase != corev1.PodRunning {
			return fmt.Errorf("phase %s, status %+v", p.Status.Phase, p.Status)
		}
		return nil
	})
}

// eventually polls f every 250 ms until it returns nil; after 2 minutes it fails t.
func eventually(t *testing.T, what string, f func() error) {
	t.Helper()
	controlplane.Eventually(t, 2*time.Minute, 250*time.Millisecond, what, f)
}

func ptr[T any](v T) *T { return &v }
