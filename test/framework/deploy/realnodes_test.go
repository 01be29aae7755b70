package deploy_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	"github.com/plinth-storage/plinth/test/framework/cluster"
	"github.com/plinth-storage/plinth/test/framework/controlplane"
	"github.com/plinth-storage/plinth/test/framework/deploy"
	"github.com/plinth-storage/plinth/test/prereq"
)

// TestDeployOnRealNodes deploys Plinth as its users do — kustomize build of
// kustomize/overlays/dev (default/ with one replica per Deployment and no
// modules init container), server-side apply — on three real kubelets, and
// checks every component rolled out as a pod under the shipped RBAC: no
// Plinth container logged a "forbidden" answer, and each node's CSINode lists
// csi.plinth.dev with its topology key, written by kubelet after the node
// plugin registered itself.
func TestDeployOnRealNodes(t *testing.T) {
	// Real-node tests of several packages take turns: cluster.Start waits for the host's lock.
	prereq.Env(t, "PLINTH_INTEGRATION", "an integration test: make test-integration sets it")
	if err := cluster.CheckHost(); err != nil {
		t.Fatalf("node prerequisites: %v", err)
	}
	controlplane.RequireBinaries(t, controlplane.BinEtcd, controlplane.BinKubeAPIServer, controlplane.BinKubeControllerManager,
		controlplane.BinKubelet, controlplane.BinKubeProxy, controlplane.BinPlinthScheduler)
	images := controlplane.ImageArchives(t, "plinth", "plinth-scheduler", "csi-provisioner", "csi-attacher", "csi-resizer", "csi-snapshotter", "snapshot-controller", "pause")
	// The time another package's cluster holds the host is not this test's budget.
	if err := cluster.WaitLockFree(t.Context()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	cp := controlplane.ForTest(t, controlplane.Options{Nodes: true, Scheduler: true})
	opts, err := cp.ClusterOptions()
	if err != nil {
		t.Fatal(err)
	}
	opts.Images = images
	opts.KeepDir = true
	opts.Labels = map[string]string{"plinth.dev/storage": "dev"}
	c, err := cluster.Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Errorf("cluster stop: %v", err)
		}
		if !t.Failed() {
			os.RemoveAll(c.Dir)
		} else {
			t.Logf("node logs kept under %s", c.Dir)
		}
	})
	t.Logf("3 nodes Ready in %s", c.StartDuration.Round(time.Millisecond))

	// Relative to the package folder, where go test runs (-trimpath makes
	// runtime.Caller an import path).
	objs, err := deploy.Build(filepath.Join("..", "..", "..", "kustomize", "overlays", "dev"))
	if err != nil {
		t.Fatal(err)
	}
	res, err := deploy.Apply(ctx, cp.Admin.Config, objs, 5*time.Minute)
	cs, cerr := kubernetes.NewForConfig(cp.Admin.Config)
	if cerr != nil {
		t.Fatal(cerr)
	}
	if err != nil {
		t.Errorf("deploy: %v", err)
		dumpPods(t, cs)
		t.FailNow()
	}
	t.Logf("%s", res)
	if len(res.Workloads) != 6 {
		t.Errorf("workloads %v, want controller, agent, CSI controller, CSI node, scheduler, snapshot-controller", res.Workloads)
	}

	for _, n := range c.Nodes {
		controlplane.Eventually(t, 2*time.Minute, 250*time.Millisecond, "CSINode "+n.Name+" lists "+policyv1.DriverName, func() error {
			cn, err := cs.StorageV1().CSINodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			for _, d := range cn.Spec.Drivers {
				if d.Name == policyv1.DriverName {
					if d.NodeID != n.Name || len(d.TopologyKeys) != 1 || d.TopologyKeys[0] != policyv1.TopologyKeyNode {
						return fmt.Errorf("driver entry %+v: want node id %s and topology key %s", d, n.Name, policyv1.TopologyKeyNode)
					}
					return nil
				}
			}
			return fmt.Errorf("drivers %v", cn.Spec.Drivers)
		})
		node, err := cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if node.Labels[policyv1.TopologyKeyNode] != n.Name {
			t.Errorf("node %s: label %s=%q, want the node name (kubelet sets it from NodeGetInfo)", n.Name, policyv1.TopologyKeyNode, node.Labels[policyv1.TopologyKeyNode])
		}
	}

	// The shipped RBAC: no Plinth container (csi-snapshotter included) and no snapshot-controller
	// was refused anything.
	pods, err := cs.CoreV1().Pods("plinth-system").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 3+3+3 {
		t.Errorf("%d pods in plinth-system, want 9 (3 agents, 3 CSI node plugins, controller, CSI controller, scheduler)", len(pods.Items))
	}
	snapc, err := cs.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=snapshot-controller"})
	if err != nil {
		t.Fatal(err)
	}
	if len(snapc.Items) != 1 {
		t.Errorf("%d snapshot-controller pods in kube-system, want 1", len(snapc.Items))
	}
	for _, p := range append(pods.Items, snapc.Items...) {
		for _, ct := range p.Spec.Containers {
			data, err := cs.CoreV1().Pods(p.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: ct.Name}).DoRaw(ctx)
			if err != nil {
				t.Errorf("logs of %s/%s: %v", p.Name, ct.Name, err)
				continue
			}
			for _, l := range strings.Split(string(data), "\n") {
				if strings.Contains(l, "forbidden") {
					t.Errorf("%s/%s on %s was refused by RBAC: %s", p.Name, ct.Name, p.Spec.NodeName, l)
				}
			}
		}
	}
}

func dumpPods(t *testing.T, cs kubernetes.Interface) {
	pods, err := cs.CoreV1().Pods("plinth-system").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Log(err)
		return
	}
	for _, p := range pods.Items {
		t.Logf("pod %s on %s: %s %+v", p.Name, p.Spec.NodeName, p.Status.Phase, p.Status.ContainerStatuses)
		for _, ct := range p.Spec.Containers {
			data, _ := cs.CoreV1().Pods(p.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: ct.Name, TailLines: ptr(int64(15))}).DoRaw(context.Background())
			t.Logf("--- %s/%s:\n%s", p.Name, ct.Name, data)
		}
	}
}

func ptr[T any](v T) *T { return &v }
