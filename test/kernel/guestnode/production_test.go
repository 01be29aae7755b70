package guestnode

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/test/framework/controlplane"
	"github.com/plinth-storage/plinth/test/framework/registry"
	"github.com/plinth-storage/plinth/test/framework/wait"
)

// The storage node's thin pool, on the guest's first virtio disk (/dev/vda).
const (
	agentPool = "gthin"
	agentVG   = "plinth-g"
	// plinthNS is where the chart puts every object; the release's record is in releaseNS.
	plinthNS  = "plinth-system"
	releaseNS = "default"
)

// helm runs the helm CLI of the test bin folder (helm.sh/helm/v4, make testbin) with its own
// config, cache and data folders against the admin kubeconfig.
type helm struct{ path, home, kubeconfig string }

func (h helm) run(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, h.path, args...)
	cmd.Env = append(os.Environ(), "HELM_CONFIG_HOME="+filepath.Join(h.home, "config"),
		"HELM_CACHE_HOME="+filepath.Join(h.home, "cache"), "HELM_DATA_HOME="+filepath.Join(h.home, "data"),
		"KUBECONFIG="+h.kubeconfig)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("helm %s: %v\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// productionValues are the chart's values of a production install from a private registry on a
// small cluster: every image of values.yaml at the path and tag `make push` gives it in reg (as
// the nodes reach reg), one replica of each Deployment (guestReplicas) and longer Lease timings
// (guestLeaderElection). Nothing else changes.
func productionValues(t *testing.T, root, reg string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "charts", "plinth", "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var vals struct {
		Images map[string]struct{ Repository, Tag string }
	}
	if err := yaml.Unmarshal(data, &vals); err != nil {
		t.Fatal(err)
	}
	images := map[string]any{}
	for n, im := range vals.Images {
		tag, err := registry.Target(im.Repository+":"+im.Tag, reg, false)
		if err != nil {
			t.Fatal(err)
		}
		images[n] = map[string]string{"repository": tag.Context().Name(), "tag": tag.TagStr()}
	}
	if len(images) != 6 {
		t.Fatalf("values.yaml names %d images, want 6", len(images))
	}
	one := map[string]any{"replicas": guestReplicas}
	out, err := yaml.Marshal(map[string]any{"images": images, "controller": one, "csiController": one, "scheduler": one,
		"leaderElection": guestLeaderElection})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// guestReplicas is the replicas value of the chart's three Deployments on the guests. Each
// guest is one emulated vCPU: with the shipped two replicas of each (eight CSI sidecars), a
// loaded host left the guests' processes so little CPU that the sidecars lost their leader
// leases to API timeouts and containerd's container creates hit their deadline, turning every
// step into a wait on restarts. The dev overlay on the host's kubelets sets one replica too, so
// no test runs the shipped standby under a kubelet.
const guestReplicas = 1

// guestLeaderElection is the chart's leaderElection value on the guests: the guests' API
// requests go through the emulated network to the host's API server, and under host load a
// Lease renewal took longer than the shipped 10 s renew deadline, so the leaders (CSI sidecars
// above all) stepped down and their containers restarted, over and over. These timings are
// OpenShift's for slow clusters; the install step checks every Lease carries them.
var guestLeaderElection = map[string]string{"leaseDuration": "137s", "renewDeadline": "107s", "retryPeriod": "26s"}

// startServiceForward points each guest's stand-in for cluster DNS at the key server
// Service's ClusterIP (svcforward on keyServerHost's 127.0.0.1:keyServerPort), replacing the
// forwarder a previous install started.
func startServiceForward(t *testing.T, cs *kubernetes.Clientset, nodes []*node) {
	t.Helper()
	svc, err := cs.CoreV1().Services(plinthNS).Get(t.Context(), "plinth-key-server", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		// a reinstall makes the Service anew (another ClusterIP): the old forwarder goes first
		n.sh(t, time.Minute, fmt.Sprintf(`if [ -f /run/svcforward.pid ]; then p=$(cat /run/svcforward.pid); kill $p; while kill -0 $p 2>/dev/null; do sleep 0.1; done; fi
(svcforward -listen 127.0.0.1:%d -to %s:%d >>/var/log/svcforward.log 2>&1 & echo $! > /run/svcforward.pid)`,
			keyServerPort, svc.Spec.ClusterIP, keyServerPort))
	}
}

// poll is wait.Poll under t's context; a timeout fails t with the condition's last reason.
func poll(t *testing.T, timeout, interval time.Duration, what string, f func() error) {
	t.Helper()
	if err := wait.Poll(t.Context(), timeout, interval, f); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// rolledOut checks every Deployment and DaemonSet of plinth-system: want of each (the
// DaemonSets on both guests; the Deployments their replicas), all updated and ready. It
// returns how many of each kind it saw.
func rolledOut(ctx context.Context, cs *kubernetes.Clientset) (deployments, daemonSets int, err error) {
	dss, err := cs.AppsV1().DaemonSets(plinthNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, 0, err
	}
	for _, ds := range dss.Items {
		if ds.Status.ObservedGeneration < ds.Generation || ds.Status.DesiredNumberScheduled != 2 ||
			ds.Status.UpdatedNumberScheduled != 2 || ds.Status.NumberReady != 2 {
			return 0, 0, fmt.Errorf("DaemonSet %s: desired %d, updated %d, ready %d (generation %d observed %d)", ds.Name,
				ds.Status.DesiredNumberScheduled, ds.Status.UpdatedNumberScheduled, ds.Status.NumberReady, ds.Generation, ds.Status.ObservedGeneration)
		}
	}
	deps, err := cs.AppsV1().Deployments(plinthNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, 0, err
	}
	for _, d := range deps.Items {
		if !deploymentDone(&d) {
			return 0, 0, fmt.Errorf("Deployment %s: replicas %d, updated %d, available %d (generation %d observed %d)", d.Name,
				d.Status.Replicas, d.Status.UpdatedReplicas, d.Status.AvailableReplicas, d.Generation, d.Status.ObservedGeneration)
		}
	}
	return len(deps.Items), len(dss.Items), nil
}

func deploymentDone(d *appsv1.Deployment) bool {
	want := ptr.Deref(d.Spec.Replicas, 1)
	return d.Status.ObservedGeneration >= d.Generation && d.Status.UpdatedReplicas == want &&
		d.Status.AvailableReplicas == want && d.Status.Replicas == want
}

// podStates lists plinth-system's pods (node, phase, container states) for a failure message.
func podStates(ctx context.Context, cs *kubernetes.Clientset) string {
	pods, err := cs.CoreV1().Pods(plinthNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, p := range pods.Items {
		fmt.Fprintf(&b, "\n  %s on %s: %s", p.Name, p.Spec.NodeName, p.Status.Phase)
		for _, c := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
			switch {
			case c.State.Waiting != nil:
				fmt.Fprintf(&b, " %s=waiting(%s: %s)", c.Name, c.State.Waiting.Reason, c.State.Waiting.Message)
			case c.State.Terminated != nil:
				fmt.Fprintf(&b, " %s=terminated(%s %d)", c.Name, c.State.Terminated.Reason, c.State.Terminated.ExitCode)
			default:
				fmt.Fprintf(&b, " %s=running ready=%t restarts=%d", c.Name, c.Ready, c.RestartCount)
			}
		}
	}
	return b.String()
}

// checkLeases: every leader of the chart holds its Lease in plinth-system with the lease
// duration of the leaderElection value: Plinth's controller and move executor, the CSI
// controller's four sidecars and the scheduler (7 Leases). Restarts of the chart's containers
// so far are logged (MEASURE), the count leader step-downs would raise.
func checkLeases(t *testing.T, cs kubernetes.Interface) {
	t.Helper()
	// the value's lease duration in seconds, as a Lease records it
	lease, err := time.ParseDuration(guestLeaderElection["leaseDuration"])
	if err != nil {
		t.Fatal(err)
	}
	wantSeconds := int32(lease / time.Second)
	var names []string
	bad := map[string]string{}
	poll(t, 5*time.Minute, 2*time.Second, "7 Leases in "+plinthNS, func() error {
		leases, err := cs.CoordinationV1().Leases(plinthNS).List(t.Context(), metav1.ListOptions{})
		if err != nil {
			return err
		}
		names = names[:0]
		for _, l := range leases.Items {
			if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" {
				continue // released
			}
			if d := l.Spec.LeaseDurationSeconds; d == nil || *d != wantSeconds {
				bad[l.Name] = fmt.Sprint(d)
			}
			names = append(names, l.Name)
		}
		if len(names) < 7 {
			return fmt.Errorf("held Leases %v", names)
		}
		return nil
	})
	if len(names) != 7 {
		t.Errorf("held Leases in %s: %v, want 7 (controller, move executor, four sidecars, scheduler)", plinthNS, names)
	}
	for name, d := range bad {
		t.Errorf("Lease %s: leaseDurationSeconds %s, want %d (the leaderElection value)", name, d, wantSeconds)
	}
	pods, err := cs.CoreV1().Pods(plinthNS).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var restarts []string
	for _, p := range pods.Items {
		for _, c := range p.Status.ContainerStatuses {
			if c.RestartCount > 0 {
				restarts = append(restarts, fmt.Sprintf("%s/%s %d", p.Name, c.Name, c.RestartCount))
			}
		}
	}
	t.Logf("MEASURE container restarts in %s after install: %d containers %v", plinthNS, len(restarts), restarts)
}

// testHelmInstall: Expected: `helm lint` passes the chart; `helm install` of charts/plinth
// with production values (every image from the registry, as the nodes reach it, and one replica
// of each Deployment: productionValues) rolls the whole chart out on the two guest nodes: the
// controller, CSI controller and scheduler Deployments and the agent and CSI node DaemonSets (one pod on
// each guest), every image pulled by the guests' containerd from the registry. With the policy
// (a StoragePool on the storage guest's thin pool and its classes, guestPolicy) committed to
// Git and applied by Flux (commitPolicy), the controller in its pod renders
// the Store and Agent; the agent's modules init container has loaded nvmet, nvmet_tcp and
// dm_thin_pool from the guest's /lib/modules, it makes the thin pool on the guest's disk and
// reports the Store Ready with its capacity. kubelet registers the node plugin on both guests
// (CSINode lists csi.plinth.dev) and the plugin labels its Node an NVMe initiator with the
// guest's own host NQN.
func testHelmInstall(t *testing.T, s *scene) {
	cs, c, nodes, storage := s.cs, s.c, s.nodes, s.storage()
	controlplane.RequireBinaries(t, "helm")
	path, err := controlplane.BinaryPath("", "helm")
	if err != nil {
		t.Fatal(err)
	}
	// in the scene's folder: the later steps upgrade and reinstall
	home := filepath.Join(s.work, "helm")
	if err := os.MkdirAll(home, 0o755); err != nil {
		t.Fatal(err)
	}
	s.helm = helm{path: path, home: home, kubeconfig: s.cp.Admin.Kubeconfig}
	h := s.helm
	chart := filepath.Join(s.root, "charts", "plinth")
	values := filepath.Join(home, "values.yaml")
	if err := os.WriteFile(values, productionValues(t, s.root, guestRegistry), 0o644); err != nil {
		t.Fatal(err)
	}
	s.chart, s.values = chart, values
	if out := h.run(t, "lint", chart, "-f", values); !strings.Contains(out, "0 chart(s) failed") {
		t.Errorf("helm lint:\n%s", out)
	}
	t0 := time.Now()
	h.run(t, "install", "plinth", chart, "--namespace", releaseNS, "-f", values)
	startServiceForward(t, cs, nodes)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("plinth-system pods:%s", podStates(context.Background(), cs))
		}
	})
	var deps, dss int
	poll(t, 20*time.Minute, 2*time.Second, "the chart rolled out on the guests", func() (err error) {
		deps, dss, err = rolledOut(t.Context(), cs)
		return err
	})
	if deps != 3 || dss != 2 {
		t.Errorf("rolled out %d Deployments and %d DaemonSets, want 3 (controller, CSI controller, scheduler) and 2 (agent, CSI node)", deps, dss)
	}
	t.Logf("TIMING helm install → every Deployment and DaemonSet ready on the guests %s", time.Since(t0).Round(time.Millisecond))

	// Every image came from the registry (the guests' containerd had none of them): kubelet pulled.
	evs, err := cs.CoreV1().Events(plinthNS).List(t.Context(), metav1.ListOptions{FieldSelector: "reason=Pulled"})
	if err != nil {
		t.Fatal(err)
	}
	pulled := map[string]bool{}
	for _, e := range evs.Items {
		if strings.Contains(e.Message, "Successfully pulled image \""+guestRegistry+"/") {
			pulled[strings.Split(e.Message, "\"")[1]] = true
		}
	}
	if len(pulled) != 6 {
		t.Errorf("images pulled from %s: %d %v, want the chart's 6", guestRegistry, len(pulled), keys(pulled))
	}

	// The policy, committed to Git and applied by Flux: a thin pool on the storage guest and its
	// classes (guestPolicy); the controller renders its Store and Agent.
	commitPolicy(t, s, guestPolicy(storage.name))
	store := storev1.StoreName(agentPool, storage.name)
	poll(t, 6*time.Minute, 2*time.Second, "store "+store+" Ready", func() error {
		var st storev1.Store
		if err := c.Get(t.Context(), client.ObjectKey{Name: store}, &st); err != nil {
			return err
		}
		if !apimeta.IsStatusConditionTrue(st.Status.Conditions, "Ready") || st.Status.Capacity == nil {
			return fmt.Errorf("store %s not ready: %+v", store, st.Status.Conditions)
		}
		t.Logf("store %s Ready: capacity %+v", store, *st.Status.Capacity)
		return nil
	})
	t.Logf("TIMING store Ready %s after helm install", time.Since(t0).Round(time.Millisecond))
	checkLeases(t, cs)
	for _, n := range nodes {
		nqn := strings.TrimSpace(n.sh(t, time.Minute, "cat /etc/nvme/hostnqn"))
		poll(t, 3*time.Minute, 2*time.Second, "node plugin registered on "+n.name, func() error {
			cn, err := cs.StorageV1().CSINodes().Get(t.Context(), n.name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			var drivers []string
			for _, d := range cn.Spec.Drivers {
				drivers = append(drivers, d.Name)
			}
			if !slices.Contains(drivers, policyv1.DriverName) {
				return fmt.Errorf("CSINode %s drivers %v, want %s", n.name, drivers, policyv1.DriverName)
			}
			nd, err := cs.CoreV1().Nodes().Get(t.Context(), n.name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if nd.Annotations[policyv1.AnnotationHostNQN] != nqn || nd.Labels[policyv1.LabelNVMeInitiator] != "true" {
				return fmt.Errorf("node %s: host NQN annotation %q (guest has %q), initiator label %q", n.name,
					nd.Annotations[policyv1.AnnotationHostNQN], nqn, nd.Labels[policyv1.LabelNVMeInitiator])
			}
			return nil
		})
	}
	if out := storage.sh(t, time.Minute, "lvs --noheadings -o lv_name "+agentVG); !strings.Contains(out, "pool") {
		t.Errorf("no thin pool in %s on the storage guest: %q", agentVG, out)
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
