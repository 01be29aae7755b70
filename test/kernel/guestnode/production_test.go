package guestnode

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/csi"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/test/framework/controlplane"
	"github.com/plinth-storage/plinth/test/framework/deploy"
)

// The storage node's thin pool, on the guest's first virtio disk (/dev/vda).
const (
	agentPool = "gthin"
	agentVG   = "plinth-g"
)

// nodeObjects keeps, of `kustomize build kustomize/default` (unpatched), what Plinth runs on
// every node: the Namespace, the CRDs, the CSIDriver, the agent's and the CSI node plugin's
// ServiceAccounts, RBAC and admission policies, and their DaemonSets. The controller, the CSI
// controller and the scheduler are left for the scenario that installs the whole chart.
func nodeObjects(t *testing.T, root string) []*unstructured.Unstructured {
	t.Helper()
	objs, err := deploy.Build(filepath.Join(root, "kustomize", "default"))
	if err != nil {
		t.Fatalf("kustomize build kustomize/default: %v", err)
	}
	var keep []*unstructured.Unstructured
	for _, o := range objs {
		k, name := o.GetKind(), o.GetName()
		node := name == "plinth-agent" || name == "plinth-csi-node"
		switch {
		case k == "Namespace" || k == "CustomResourceDefinition" || k == "CSIDriver",
			(k == "ServiceAccount" || k == "ClusterRole" || k == "ClusterRoleBinding" || k == "DaemonSet") && node,
			(k == "ValidatingAdmissionPolicy" || k == "ValidatingAdmissionPolicyBinding") &&
				(strings.HasPrefix(name, "plinth-agent-") || strings.HasPrefix(name, "plinth-csi-node-")):
			keep = append(keep, o)
		}
	}
	daemonSets := 0
	for _, o := range keep {
		if o.GetKind() == "DaemonSet" {
			daemonSets++
		}
	}
	if daemonSets != 2 {
		t.Fatalf("kustomize/default: %d of the DaemonSets plinth-agent and plinth-csi-node", daemonSets)
	}
	return keep
}

// testProductionNodes: Expected: the shipped agent and CSI node DaemonSets (the manifests as
// kustomize builds them; Plinth's image pulled by each guest's containerd from the registry on
// the host, its mirror of ghcr.io) roll out on both guest nodes. kubelet registers the node
// plugin (plugin registration under /var/lib/kubelet, a Bidirectional mount): each guest's
// CSINode lists csi.plinth.dev, and the plugin labels its Node an NVMe initiator with the
// guest's own host NQN. The agent's modules init container loads nvmet, nvmet_tcp and
// dm_thin_pool from the guest's /lib/modules; the agent reaches the API server through the
// `kubernetes` Service (kube-proxy in the guest) with its ServiceAccount; on the storage node it
// makes the thin pool on the guest's disk and reports the Store Ready with its capacity.
func testProductionNodes(t *testing.T, cs *kubernetes.Clientset, cp *controlplane.ControlPlane, root string, nodes []*node) {
	storage := nodes[0]
	c, err := client.New(cp.Admin.Config, client.Options{Scheme: csi.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	objs := nodeObjects(t, root)
	// The Store the controller would render for a thin pool on the storage node (the
	// controller is not installed here) and the node's Agent.
	backend := policyv1.Backend{LVM: &policyv1.LVMBackend{VolumeGroup: agentVG, Devices: []string{"/dev/vda"},
		ThinPool: &policyv1.ThinPool{Name: "pool", SizePercent: 80}}}
	store := storev1.StoreName(agentPool, storage.name)
	crdsOnly := []*unstructured.Unstructured{}
	for _, o := range objs {
		if o.GetKind() == "CustomResourceDefinition" || o.GetKind() == "Namespace" {
			crdsOnly = append(crdsOnly, o)
		}
	}
	if _, err := deploy.Apply(t.Context(), cp.Admin.Config, crdsOnly, 2*time.Minute); err != nil {
		t.Fatalf("apply CRDs: %v", err)
	}
	if err := c.Create(t.Context(), &storev1.Agent{ObjectMeta: metav1.ObjectMeta{Name: storage.name, Labels: map[string]string{policyv1.LabelNode: storev1.NameLabelValue(storage.name)}},
		Spec: storev1.AgentSpec{NodeName: storage.name, Stores: []string{store}}}); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(t.Context(), &storev1.Store{ObjectMeta: metav1.ObjectMeta{Name: store, Labels: map[string]string{
		policyv1.LabelPool: storev1.NameLabelValue(agentPool), policyv1.LabelNode: storev1.NameLabelValue(storage.name)}},
		Spec: storev1.StoreSpec{Pool: agentPool, NodeName: storage.name, Backend: backend, Reserve: "5%", OvercommitPercent: 400}}); err != nil {
		t.Fatal(err)
	}
	res, err := deploy.Apply(t.Context(), cp.Admin.Config, objs, 8*time.Minute)
	if err != nil {
		pods, _ := cs.CoreV1().Pods("plinth-system").List(t.Context(), metav1.ListOptions{})
		for _, p := range pods.Items {
			t.Logf("pod %s on %s: %s %+v %+v", p.Name, p.Spec.NodeName, p.Status.Phase, p.Status.InitContainerStatuses, p.Status.ContainerStatuses)
		}
		t.Fatalf("the agent and CSI node DaemonSets: %v", err)
	}
	t.Logf("TIMING agent and CSI node DaemonSets applied and rolled out on both guests in %s (apply %s, rollout %s)", time.Since(t0).Round(time.Millisecond),
		res.ApplyDuration.Round(time.Millisecond), res.RolloutDuration.Round(time.Millisecond))
	pods, err := cs.CoreV1().Pods("plinth-system").List(t.Context(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=agent"})
	if err != nil {
		t.Fatal(err)
	}
	onNode := map[string]corev1.Pod{}
	for _, p := range pods.Items {
		onNode[p.Spec.NodeName] = p
	}
	p, ok := onNode[storage.name]
	if !ok || len(onNode) != 2 {
		t.Fatalf("agent pods on nodes %v, want one on each guest node", keys(onNode))
	}
	// Plinth's image came from the registry (the guests' containerd had none): kubelet pulled
	evs, err := cs.CoreV1().Events("plinth-system").List(t.Context(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + p.Name})
	if err != nil {
		t.Fatal(err)
	}
	var pulled []string
	for _, e := range evs.Items {
		if e.Reason == "Pulled" {
			pulled = append(pulled, e.Message)
		}
	}
	if len(pulled) == 0 || !strings.Contains(pulled[0], "Successfully pulled image") {
		t.Errorf("agent pod %s on %s: Pulled events %q, want the first a pull from the registry", p.Name, storage.name, pulled)
	} else {
		t.Logf("MEASURE %s", pulled[0])
	}
	controlplane.Eventually(t, 6*time.Minute, 2*time.Second, "store "+store+" Ready", func() error {
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
	t.Logf("TIMING store Ready %s after the apply began", time.Since(t0).Round(time.Millisecond))
	for _, n := range nodes {
		nqn := strings.TrimSpace(n.sh(t, time.Minute, "cat /etc/nvme/hostnqn"))
		controlplane.Eventually(t, 3*time.Minute, 2*time.Second, "node plugin registered on "+n.name, func() error {
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
	logs, err := cs.CoreV1().Pods("plinth-system").GetLogs(p.Name, &corev1.PodLogOptions{Container: "agent", TailLines: ptr.To[int64](5)}).DoRaw(t.Context())
	if err != nil {
		t.Errorf("agent logs through the API server: %v", err)
	}
	t.Logf("agent on %s, last lines:\n%s", storage.name, logs)
	if out := storage.sh(t, time.Minute, "lvs --noheadings -o lv_name "+agentVG); !strings.Contains(out, "pool") {
		t.Errorf("no thin pool in %s on the storage guest: %q", agentVG, out)
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
