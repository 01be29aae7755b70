package render

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/schema/vet"
)

var update = flag.Bool("update", false, "rewrite the golden files")

func vetted(t testing.TB, paths ...string) *vet.Policies {
	t.Helper()
	set, err := vet.Load(paths...)
	if err != nil {
		t.Fatal(err)
	}
	v, err := vet.NewVetter()
	if err != nil {
		t.Fatal(err)
	}
	pol, problems := v.Vet(set)
	if len(problems) > 0 {
		t.Fatalf("policy has problems: %v", problems)
	}
	return pol
}

// TestQuickstartGolden renders examples/quickstart for its nodes.yaml and compares the bytes
// with testdata/quickstart.golden.yaml (go test -update rewrites it; review the diff).
func TestQuickstartGolden(t *testing.T) {
	pol := vetted(t, "../../examples/quickstart")
	nodes, err := LoadNodes("../../examples/quickstart/nodes.yaml")
	if err != nil {
		t.Fatal(err)
	}
	out, err := Render(Input{Pools: pol.Pools, Protocols: pol.Protocols, Placements: pol.Placements, Nodes: nodes})
	if err != nil {
		t.Fatal(err)
	}
	got, err := out.YAML()
	if err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "quickstart.golden.yaml")
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("render output differs from %s:\n%s", golden, got)
	}
	if len(out.StorageClasses) != 1 || len(out.Agents) != 1 || len(out.Stores) != 1 {
		t.Fatalf("want 1 StorageClass, 1 Agent, 1 Store; got %d, %d, %d", len(out.StorageClasses), len(out.Agents), len(out.Stores))
	}
	if out.Stores[0].Name != "dev.node-a" || out.Agents[0].Name != "node-a" {
		t.Errorf("names: store %q agent %q", out.Stores[0].Name, out.Agents[0].Name)
	}
}

func node(name string, labels map[string]string) corev1.Node {
	return corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
}

// TestDeterministic renders the production policy with the input in two orders: the bytes
// must be the same.
func TestDeterministic(t *testing.T) {
	pol := vetted(t, "../../policies/clusters/production")
	nodes := []corev1.Node{
		node("s1", map[string]string{"plinth.dev/storage": "nvme", "node-role.kubernetes.io/worker": ""}),
		node("w1", map[string]string{"node-role.kubernetes.io/worker": ""}),
		node("w2", map[string]string{"node-role.kubernetes.io/worker": ""}),
		node("cp", map[string]string{"node-role.kubernetes.io/control-plane": ""}),
	}
	in := Input{Pools: pol.Pools, Protocols: pol.Protocols, Placements: pol.Placements, Nodes: nodes}
	a, err := Render(in)
	if err != nil {
		t.Fatal(err)
	}
	rev := Input{Nodes: []corev1.Node{nodes[3], nodes[2], nodes[1], nodes[0]}}
	for i := len(pol.Pools) - 1; i >= 0; i-- {
		rev.Pools = append(rev.Pools, pol.Pools[i])
	}
	for i := len(pol.Placements) - 1; i >= 0; i-- {
		rev.Placements = append(rev.Placements, pol.Placements[i])
	}
	rev.Protocols = pol.Protocols
	b, err := Render(rev)
	if err != nil {
		t.Fatal(err)
	}
	ya, _ := a.YAML()
	yb, _ := b.YAML()
	if !bytes.Equal(ya, yb) {
		t.Errorf("render depends on input order")
	}
	// fast is on s1 only (NVMe); local-ssd on the workers without NVMe.
	var stores []string
	for _, s := range a.Stores {
		stores = append(stores, s.Name)
	}
	if got := strings.Join(stores, ","); got != "fast.s1,local-ssd.w1,local-ssd.w2" {
		t.Errorf("stores = %s", got)
	}
	for _, ag := range a.Agents {
		if ag.Name == "s1" && (ag.Spec.NVMeoF == nil || ag.Spec.NVMeoF.Port != 4420 || ag.Spec.NVMeoF.BindCIDR != "10.20.0.0/16") {
			t.Errorf("agent s1 lacks the NVMe-oF endpoint: %+v", ag.Spec)
		}
		if ag.Name != "s1" && ag.Spec.NVMeoF != nil {
			t.Errorf("agent %s serves no NVMe-oF pool but has an endpoint", ag.Name)
		}
	}
	for _, sc := range a.StorageClasses {
		if sc.ReclaimPolicy == nil || sc.VolumeBindingMode == nil || sc.AllowVolumeExpansion == nil {
			t.Errorf("StorageClass %s leaves a field to server defaults: a later explicit value would change an immutable field", sc.Name)
		}
		if sc.Name == "plinth-local" && sc.Annotations["storageclass.kubernetes.io/is-default-class"] != "true" {
			t.Errorf("plinth-local must be the default class")
		}
		if sc.Parameters[policyv1.ParamPool] == "" || sc.Parameters[policyv1.ParamFSType] == "" {
			t.Errorf("StorageClass %s parameters: %v", sc.Name, sc.Parameters)
		}
		// spreadAcross reaches plinth-scheduler as a parameter, only on the class that sets it.
		spread, has := sc.Parameters[policyv1.ParamSpreadAcross]
		if want := sc.Name == "plinth-local-zonal"; has != want || want && spread != "topology.kubernetes.io/zone" {
			t.Errorf("StorageClass %s: %s = %q (present %v)", sc.Name, policyv1.ParamSpreadAcross, spread, has)
		}
	}
	if len(a.StorageClasses) != 3 {
		t.Errorf("%d StorageClasses, want 3", len(a.StorageClasses))
	}
}

func TestRenderErrors(t *testing.T) {
	acl := true
	pools := []policyv1.StoragePool{{
		ObjectMeta: metav1.ObjectMeta{Name: "p"},
		Spec: policyv1.StoragePoolSpec{
			NodeSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "a", Operator: "Bogus"}}},
			Backend:      policyv1.Backend{File: &policyv1.FileBackend{Directory: "/d"}},
		},
	}, {
		ObjectMeta: metav1.ObjectMeta{Name: "q"},
		Spec: policyv1.StoragePoolSpec{
			NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"s": "1"}},
			Backend:      policyv1.Backend{File: &policyv1.FileBackend{Directory: "/d"}},
		},
	}}
	protos := []policyv1.Protocol{
		{ObjectMeta: metav1.ObjectMeta{Name: "a"}, Spec: policyv1.ProtocolSpec{NVMeoFTCP: &policyv1.NVMeoFTCPProtocol{Port: 4420, BindCIDR: "10.0.0.0/8", ACL: &acl}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "b"}, Spec: policyv1.ProtocolSpec{NVMeoFTCP: &policyv1.NVMeoFTCPProtocol{Port: 4421, BindCIDR: "10.0.0.0/8", ACL: &acl}}},
	}
	placements := []policyv1.Placement{
		{ObjectMeta: metav1.ObjectMeta{Name: "x"}, Spec: policyv1.PlacementSpec{PoolRef: policyv1.LocalObjectReference{Name: "q"}, ProtocolRef: policyv1.LocalObjectReference{Name: "a"}, StorageClass: policyv1.StorageClassTemplate{Name: "x"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "y"}, Spec: policyv1.PlacementSpec{PoolRef: policyv1.LocalObjectReference{Name: "q"}, ProtocolRef: policyv1.LocalObjectReference{Name: "b"}, StorageClass: policyv1.StorageClassTemplate{Name: "y"}}},
	}
	_, err := Render(Input{Pools: pools, Protocols: protos, Placements: placements, Nodes: []corev1.Node{node("n", map[string]string{"s": "1"})}})
	if err == nil {
		t.Fatal("want errors for a bad selector and conflicting endpoints")
	}
	for _, want := range []string{"StoragePool/p: spec.nodeSelector", "Placement/y: spec.protocolRef"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

func TestParseNodes(t *testing.T) {
	cases := []struct {
		name, in, err string
		n             int
	}{
		{"list", "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Node, metadata: {name: a}}\n- {apiVersion: v1, kind: Node, metadata: {name: b}}\n", "", 2},
		{"nodelist", "apiVersion: v1\nkind: NodeList\nitems:\n- {metadata: {name: a}}\n", "", 1},
		{"stream", "apiVersion: v1\nkind: Node\nmetadata: {name: a}\n---\napiVersion: v1\nkind: Node\nmetadata: {name: b}\n", "", 2},
		{"pods", "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\n", "nodes.yaml:1: Pod is not a Node, NodeList or List", 0},
		{"list of pods", "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Pod, metadata: {name: a}}\n", "items[0] is a Pod, not a Node", 0},
		{"duplicate", "kind: List\nitems:\n- {kind: Node, metadata: {name: a}}\n- {kind: Node, metadata: {name: a}}\n", "duplicate Node \"a\"", 0},
		{"nameless", "kind: Node\nmetadata: {}\n", "Node without metadata.name", 0},
		{"empty", "", "no Node objects", 0},
		{"garbage", "kind: [\n", "invalid YAML", 0},
		{"scalar", "just text\n", "not a mapping", 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			nodes, err := ParseNodes("nodes.yaml", []byte(c.in))
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err = %v, want %q", err, c.err)
				}
				return
			}
			if err != nil || len(nodes) != c.n {
				t.Fatalf("got %d nodes, err %v; want %d", len(nodes), err, c.n)
			}
		})
	}
}

func TestStoreNameLong(t *testing.T) {
	pools := []policyv1.StoragePool{{
		ObjectMeta: metav1.ObjectMeta{Name: "pool"},
		Spec: policyv1.StoragePoolSpec{
			NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"s": "1"}},
			Backend:      policyv1.Backend{File: &policyv1.FileBackend{Directory: "/d"}},
		},
	}}
	long := strings.Repeat("n", 250)
	out, err := Render(Input{Pools: pools, Nodes: []corev1.Node{node(long, map[string]string{"s": "1"})}})
	if err != nil {
		t.Fatal(err)
	}
	st := out.Stores[0]
	if len(st.Name) > 253 || len(st.Labels[policyv1.LabelNode]) > 63 || st.Labels[policyv1.LabelNode] != storev1.NameLabelValue(long) || st.Spec.NodeName != long {
		t.Errorf("store %q (len %d) labels %v", st.Name, len(st.Name), st.Labels)
	}
}

// A Protocol with DH-HMAC-CHAP marks the Agents of the nodes of its pools: they need target
// authentication in the kernel. Another pool's nodes, and Protocols without it, are unmarked.
// The keyGeneration is not rendered: the agents learn a rotation from the key server, and a
// raised keyGeneration leaves the Agents as they were (no second road to the agent).
func TestRenderAgentAuth(t *testing.T) {
	acl := true
	file := policyv1.Backend{File: &policyv1.FileBackend{Directory: "/d"}}
	pools := []policyv1.StoragePool{
		{ObjectMeta: metav1.ObjectMeta{Name: "secure"}, Spec: policyv1.StoragePoolSpec{NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"s": "1"}}, Backend: file}},
		{ObjectMeta: metav1.ObjectMeta{Name: "open"}, Spec: policyv1.StoragePoolSpec{NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"o": "1"}}, Backend: file}},
	}
	protos := []policyv1.Protocol{
		{ObjectMeta: metav1.ObjectMeta{Name: "auth"}, Spec: policyv1.ProtocolSpec{NVMeoFTCP: &policyv1.NVMeoFTCPProtocol{Port: 4420, BindCIDR: "10.0.0.0/8", ACL: &acl,
			Auth: &policyv1.NVMeoFAuth{Mode: policyv1.AuthDHHMACCHAP, KeyGeneration: 4}}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "plain"}, Spec: policyv1.ProtocolSpec{NVMeoFTCP: &policyv1.NVMeoFTCPProtocol{Port: 4420, BindCIDR: "10.0.0.0/8", ACL: &acl,
			Auth: &policyv1.NVMeoFAuth{Mode: policyv1.AuthNone, KeyGeneration: 7}}}},
	}
	placements := []policyv1.Placement{
		{ObjectMeta: metav1.ObjectMeta{Name: "x"}, Spec: policyv1.PlacementSpec{PoolRef: policyv1.LocalObjectReference{Name: "secure"}, ProtocolRef: policyv1.LocalObjectReference{Name: "auth"}, StorageClass: policyv1.StorageClassTemplate{Name: "x"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "y"}, Spec: policyv1.PlacementSpec{PoolRef: policyv1.LocalObjectReference{Name: "open"}, ProtocolRef: policyv1.LocalObjectReference{Name: "plain"}, StorageClass: policyv1.StorageClassTemplate{Name: "y"}}},
	}
	out, err := Render(Input{Pools: pools, Protocols: protos, Placements: placements,
		Nodes: []corev1.Node{node("s1", map[string]string{"s": "1"}), node("o1", map[string]string{"o": "1"})}})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, a := range out.Agents {
		if a.Spec.NVMeoF == nil {
			t.Fatalf("Agent %s has no NVMe-oF endpoint", a.Name)
		}
		got[a.Name] = a.Spec.NVMeoF.Auth
	}
	if !got["s1"] || got["o1"] || len(got) != 2 {
		t.Errorf("Agents' nvmeof.auth: %v, want s1 true, o1 false", got)
	}
	protos[0].Spec.NVMeoFTCP.Auth.KeyGeneration = 5
	raised, err := Render(Input{Pools: pools, Protocols: protos, Placements: placements,
		Nodes: []corev1.Node{node("s1", map[string]string{"s": "1"}), node("o1", map[string]string{"o": "1"})}})
	if err != nil {
		t.Fatal(err)
	}
	if !equality.Semantic.DeepEqual(raised.Agents, out.Agents) {
		t.Errorf("keyGeneration 4 → 5 changed the rendered Agents: %+v, was %+v", raised.Agents, out.Agents)
	}
}
