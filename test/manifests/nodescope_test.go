package manifests

import (
	"context"
	"errors"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// nodeNameExtra is the user-info extra key under which the API server names the node of the
// pod a service-account token is bound to.
const nodeNameExtra = "authentication.kubernetes.io/node-name"

// boundToken creates a pod of ServiceAccount sa on node in the plinth-system namespace and
// returns a REST config that authenticates with a token bound to that pod (TokenRequest with
// boundObjectRef, as kubelet asks for the projected token it mounts), after checking that the
// API server put the pod's node into the token's user info.
func boundToken(t *testing.T, ctx context.Context, c *cluster, sa, pod, node string) *rest.Config {
	t.Helper()
	p, err := c.kube.CoreV1().Pods(namespace).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: pod, Namespace: namespace},
		Spec: corev1.PodSpec{ServiceAccountName: sa, NodeName: node,
			Containers: []corev1.Container{{Name: "c", Image: "plinth"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := c.kube.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, sa, &authnv1.TokenRequest{
		Spec: authnv1.TokenRequestSpec{BoundObjectRef: &authnv1.BoundObjectReference{
			Kind: "Pod", APIVersion: "v1", Name: p.Name, UID: p.UID}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token of %s bound to pod %s: %v", sa, pod, err)
	}
	cfg := rest.AnonymousClientConfig(c.cfg)
	cfg.BearerToken = tok.Status.Token
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	who, err := kc.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authnv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := who.Status.UserInfo.Extra[nodeNameExtra]; len(got) != 1 || got[0] != node {
		t.Fatalf("token of %s bound to pod %s on %s: user info extra %s = %v, want [%s]", sa, pod, node, nodeNameExtra, got, node)
	}
	return cfg
}

// applyRBAC applies kustomize/rbac (RBAC and the node-scope admission policies) and returns a
// maker of controller-runtime clients (the built-in kinds and Plinth's runtime kinds) for a
// REST config.
func applyRBAC(t *testing.T, c *cluster) func(*rest.Config) client.Client {
	t.Helper()
	for _, o := range allBuilds(t)["rbac"] {
		if err := c.apply(t, t.Context(), o, false); err != nil {
			t.Fatalf("apply %s: %v", ID(o), err)
		}
	}
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, storev1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	return func(cfg *rest.Config) client.Client {
		cl, err := client.New(cfg, client.Options{Scheme: scheme})
		if err != nil {
			t.Fatal(err)
		}
		return cl
	}
}

// write is one request of a node-scope case: what it does and whether the policies let it through.
type write struct {
	what    string
	allowed bool
	do      func(ctx context.Context, dryRun bool) error
}

// The ValidatingAdmissionPolicies of kustomize/rbac/node_scope.yaml, applied for real with the
// rest of the RBAC: an agent whose token is bound to a pod on node A writes node A's Agent,
// Store and VolumeState (status patches, the finalizer update) and is refused every write to
// node B's, and an update that would move its own VolumeState to node B; a token bound to no
// pod carries no node and is refused even on node A, and so is a request with no user extra at
// all (impersonated), with the policies' Forbidden message; the CSI node plugin bound to node A patches
// its Node's initiator label and host NQN annotation and is refused node B's Node and any other
// label of its own. The CSI node plugin of A reports its own status.appliedAttributes entry on
// A's VolumeState and on B's VolumeState published to A, and drops its stale entry from B's
// own; it is refused its entry on volumes neither of A nor published to A, node B's entry, the
// agent's phase, conditions and export address (status updates, as csi/node/qos.go writes).
func testNodeScope(t *testing.T, c *cluster) {
	ctx := t.Context()
	newClient := applyRBAC(t, c)
	admin := newClient(c.cfg)

	const nodeA, nodeB = "scope-node-a", "scope-node-b"
	// Node names over 63 bytes (label values hold 63: plinth.dev/node becomes "h-" and a hash),
	// one a dotted suffix of the other: the agent of nodeLong must not reach nodeLong's
	// sub-domain node, whose Store name "pool.x.<nodeLong>" also ends in "." + nodeLong.
	nodeLong := "scope-long-" + strings.Repeat("l", 40) + ".example.internal"
	nodeSub := "x." + nodeLong
	backend := policyv1.Backend{File: &policyv1.FileBackend{Directory: "/var/lib/plinth/volumes"}}
	for _, n := range []string{nodeA, nodeB, nodeLong, nodeSub} {
		label := map[string]string{policyv1.LabelNode: storev1.NameLabelValue(n)}
		store := storev1.StoreName("pool", n)
		objs := []client.Object{
			&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}},
			&storev1.Agent{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: label},
				Spec: storev1.AgentSpec{NodeName: n, Stores: []string{store}}},
			&storev1.Store{ObjectMeta: metav1.ObjectMeta{Name: store, Labels: label},
				Spec: storev1.StoreSpec{Pool: "pool", NodeName: n, Backend: backend}},
			&storev1.VolumeState{ObjectMeta: metav1.ObjectMeta{Name: storev1.VolumeID(n), Labels: label},
				Spec: storev1.VolumeStateSpec{CSIName: n, StoreName: store, CapacityBytes: 1 << 20, VolumeMode: "Filesystem",
					Policy: storev1.FrozenPolicy{Placement: "fast", Pool: "pool", Protocol: "local", Backend: backend,
						ProtocolSpec: policyv1.ProtocolSpec{Local: &policyv1.LocalProtocol{}}}}},
			&storev1.VolumeSnapshotState{ObjectMeta: metav1.ObjectMeta{Name: snapshotID(n), Labels: map[string]string{
				policyv1.LabelNode: storev1.NameLabelValue(n), policyv1.LabelPool: "pool"}},
				Spec: storev1.VolumeSnapshotStateSpec{CSIName: "snap-" + n, SourceVolume: storev1.VolumeID(n), StoreName: store, Pool: "pool", AccessibleNode: n,
					Freeze: &storev1.GroupFreeze{Nodes: []string{n}, TimeoutSeconds: 10}}},
		}
		for _, o := range objs {
			if err := admin.Create(ctx, o); err != nil {
				t.Fatalf("create %T %s: %v", o, o.GetName(), err)
			}
		}
	}

	// The volume of node B that node A consumes over NVMe-oF (published to A), with the agent's
	// status and node B's report; node B's own volume carries a stale report of A (unpublished).
	remote := &storev1.VolumeState{ObjectMeta: metav1.ObjectMeta{Name: storev1.VolumeID("remote-of-b"),
		Labels: map[string]string{policyv1.LabelNode: nodeB}},
		Spec: storev1.VolumeStateSpec{CSIName: "remote-of-b", StoreName: storev1.StoreName("pool", nodeB), CapacityBytes: 1 << 20,
			VolumeMode: "Filesystem", Publications: []storev1.Publication{{NodeName: nodeA, AccessMode: "SINGLE_NODE_WRITER",
				HostNQN: "nqn.2014-08.org.nvmexpress:uuid:0f6c1f7e-2d55-4a39-9a71-1b9d1d9a5c01"}}, PublicationGeneration: 1,
			Policy: storev1.FrozenPolicy{Placement: "fast", Pool: "pool", Protocol: "local", Backend: backend,
				ProtocolSpec: policyv1.ProtocolSpec{Local: &policyv1.LocalProtocol{}}}}}
	if err := admin.Create(ctx, remote); err != nil {
		t.Fatal(err)
	}
	remote.Status = storev1.VolumeStateStatus{Phase: storev1.VolumeReady, ActualBytes: 1 << 20,
		Export:            &storev1.Export{NQN: "nqn.2026-01.dev.plinth:remote-of-b", Address: "192.0.2.2", Port: 4420},
		AppliedAttributes: []storev1.AppliedAttributes{{NodeName: nodeB, Generation: 1}}}
	if err := admin.Status().Update(ctx, remote); err != nil {
		t.Fatal(err)
	}
	var ofB storev1.VolumeState
	if err := admin.Get(ctx, client.ObjectKey{Name: storev1.VolumeID(nodeB)}, &ofB); err != nil {
		t.Fatal(err)
	}
	ofB.Status.AppliedAttributes = []storev1.AppliedAttributes{{NodeName: nodeA, Generation: 1}, {NodeName: nodeB, Generation: 1}}
	if err := admin.Status().Update(ctx, &ofB); err != nil {
		t.Fatal(err)
	}

	agent := newClient(boundToken(t, ctx, c, "plinth-agent", "agent-a", nodeA))
	agentLong := newClient(boundToken(t, ctx, c, "plinth-agent", "agent-long", nodeLong))
	unbound := rest.AnonymousClientConfig(c.cfg)
	tok, err := c.kube.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, "plinth-agent", &authnv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	unbound.BearerToken = tok.Status.Token
	agentUnbound := newClient(unbound)
	// The agent's and plugin's ServiceAccounts impersonated without Impersonate-Extra headers:
	// a request whose user info has no extra at all (as from a client certificate), which the
	// policies must refuse in their own words, not with a CEL evaluation error.
	noExtra := func(sa string) client.Client {
		cfg := rest.CopyConfig(c.cfg)
		cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + namespace + ":" + sa,
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"}}
		return newClient(cfg)
	}
	agentNoExtra, csiNodeNoExtra := noExtra("plinth-agent"), noExtra("plinth-csi-node")
	csiNode := newClient(boundToken(t, ctx, c, "plinth-csi-node", "csi-node-a", nodeA))

	opts := func(dryRun bool) []client.SubResourcePatchOption {
		if dryRun {
			return []client.SubResourcePatchOption{client.DryRunAll}
		}
		return nil
	}
	statusPatch := func(cl client.Client, o client.Object, patch string) func(context.Context, bool) error {
		return func(ctx context.Context, dryRun bool) error {
			return cl.Status().Patch(ctx, o, client.RawPatch(types.MergePatchType, []byte(patch)), opts(dryRun)...)
		}
	}
	patch := func(cl client.Client, o client.Object, patch string) func(context.Context, bool) error {
		return func(ctx context.Context, dryRun bool) error {
			var o2 []client.PatchOption
			if dryRun {
				o2 = append(o2, client.DryRunAll)
			}
			return cl.Patch(ctx, o, client.RawPatch(types.MergePatchType, []byte(patch)), o2...)
		}
	}
	// update reads the object and writes it back changed, as the agent's Update does (the verb
	// RBAC grants it on VolumeStates; it has no patch there).
	update := func(cl client.Client, o client.Object, change func(client.Object)) func(context.Context, bool) error {
		return func(ctx context.Context, dryRun bool) error {
			if err := cl.Get(ctx, client.ObjectKeyFromObject(o), o); err != nil {
				return err
			}
			change(o)
			var uo []client.UpdateOption
			if dryRun {
				uo = append(uo, client.DryRunAll)
			}
			return cl.Update(ctx, o, uo...)
		}
	}
	// statusUpdate reads a VolumeState and writes its status back changed, as the node plugin's
	// report does (csi/node/qos.go: get, then an Update of the status subresource).
	statusUpdate := func(cl client.Client, name string, change func(*storev1.VolumeStateStatus)) func(context.Context, bool) error {
		return func(ctx context.Context, dryRun bool) error {
			var vs storev1.VolumeState
			if err := cl.Get(ctx, client.ObjectKey{Name: name}, &vs); err != nil {
				return err
			}
			change(&vs.Status)
			var uo []client.SubResourceUpdateOption
			if dryRun {
				uo = append(uo, client.DryRunAll)
			}
			return cl.Status().Update(ctx, &vs, uo...)
		}
	}
	// report sets node n's entry of appliedAttributes at generation gen (0: removes it).
	report := func(n string, gen int64) func(*storev1.VolumeStateStatus) {
		return func(st *storev1.VolumeStateStatus) {
			st.AppliedAttributes = slices.DeleteFunc(st.AppliedAttributes, func(a storev1.AppliedAttributes) bool { return a.NodeName == n })
			if gen > 0 {
				st.AppliedAttributes = append(st.AppliedAttributes, storev1.AppliedAttributes{NodeName: n, Generation: gen})
			}
		}
	}
	// keyGen sets status.encryption: the key generation node n re-wrapped a header to.
	keyGen := func(n string, gen int64) func(*storev1.VolumeStateStatus) {
		return func(st *storev1.VolumeStateStatus) {
			st.Encryption = &storev1.EncryptionStatus{KeyGeneration: gen, NodeName: n}
		}
	}
	addFinalizer := func(o client.Object) { o.SetFinalizers(append(o.GetFinalizers(), "plinth.dev/volume")) }
	toNodeB := func(o client.Object) {
		l := o.GetLabels()
		l[policyv1.LabelNode] = nodeB
		o.SetLabels(l)
	}
	agentOf := func(n string) client.Object { return &storev1.Agent{ObjectMeta: metav1.ObjectMeta{Name: n}} }
	storeOf := func(n string) client.Object {
		return &storev1.Store{ObjectMeta: metav1.ObjectMeta{Name: storev1.StoreName("pool", n)}}
	}
	volOf := func(n string) client.Object {
		return &storev1.VolumeState{ObjectMeta: metav1.ObjectMeta{Name: storev1.VolumeID(n)}}
	}
	volName := storev1.VolumeID
	snapOf := func(n string) client.Object {
		return &storev1.VolumeSnapshotState{ObjectMeta: metav1.ObjectMeta{Name: snapshotID(n)}}
	}
	nodeOf := func(n string) client.Object { return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}} }
	const (
		agentStatus = `{"status":{"hostNQN":"nqn.2014-08.org.nvmexpress:uuid:0f6c1f7e-2d55-4a39-9a71-1b9d1d9a5c01"}}`
		storeStatus = `{"status":{"capacity":{"total":1048576,"allocatable":1048576,"provisioned":0,"available":1048576}}}`
		volStatus   = `{"status":{"phase":"Ready","actualBytes":1048576}}`
		snapStatus  = `{"status":{"phase":"Ready","readyToUse":true,"sizeBytes":1048576}}`
		freezeA     = `{"status":{"freezes":[{"node":"scope-node-a","phase":"Frozen"}]}}`
		initiator   = `{"metadata":{"labels":{"plinth.dev/nvme-initiator":"true"},"annotations":{"plinth.dev/host-nqn":"nqn.2014-08.org.nvmexpress:uuid:0f6c1f7e-2d55-4a39-9a71-1b9d1d9a5c01"}}}`
	)
	// The agent writes the main resource only for VolumeState finalizers (agents/agent
	// volumestate_controller.go, an Update).
	cases := []write{
		{"agent A: status of Agent A", true, statusPatch(agent, agentOf(nodeA), agentStatus)},
		{"agent A: status of Store pool.A", true, statusPatch(agent, storeOf(nodeA), storeStatus)},
		{"agent A: status of VolumeState of A", true, statusPatch(agent, volOf(nodeA), volStatus)},
		{"agent A: finalizer of VolumeState of A", true, update(agent, volOf(nodeA), addFinalizer)},
		{"CSI node A: initiator label and host NQN of Node A", true, patch(csiNode, nodeOf(nodeA), initiator)},
		{"agent A: status of VolumeSnapshotState of A", true, statusPatch(agent, snapOf(nodeA), snapStatus)},
		{"agent of a long node: status of its Agent", true, statusPatch(agentLong, agentOf(nodeLong), agentStatus)},
		{"agent of a long node: status of its Store", true, statusPatch(agentLong, storeOf(nodeLong), storeStatus)},
		{"agent of a long node: status of its VolumeState", true, statusPatch(agentLong, volOf(nodeLong), volStatus)},
		{"agent of a long node: finalizer of its VolumeState", true, update(agentLong, volOf(nodeLong), addFinalizer)},
		{"agent of a long node: status of its VolumeSnapshotState", true, statusPatch(agentLong, snapOf(nodeLong), snapStatus)},
		{"CSI node A: its freeze answer on a member asking node A", true, statusPatch(csiNode, snapOf(nodeA), freezeA)},
		{"CSI node A: its appliedAttributes entry on VolumeState of A", true, statusUpdate(csiNode, volName(nodeA), report(nodeA, 1))},
		{"CSI node A: its appliedAttributes entry on a VolumeState of B published to A", true, statusUpdate(csiNode, remote.Name, report(nodeA, 1))},
		{"CSI node A: drops its stale entry from VolumeState of B", true, statusUpdate(csiNode, volName(nodeB), report(nodeA, 0))},
		{"CSI node A: its key generation report on VolumeState of A", true, statusUpdate(csiNode, volName(nodeA), keyGen(nodeA, 1))},
		{"CSI node A: its key generation report on a VolumeState of B published to A", true, statusUpdate(csiNode, remote.Name, keyGen(nodeA, 2))},

		{"agent A: status of Agent B", false, statusPatch(agent, agentOf(nodeB), agentStatus)},
		{"agent A: status of Store pool.B", false, statusPatch(agent, storeOf(nodeB), storeStatus)},
		{"agent A: status of VolumeState of B", false, statusPatch(agent, volOf(nodeB), volStatus)},
		{"agent A: finalizer of VolumeState of B", false, update(agent, volOf(nodeB), addFinalizer)},
		{"agent A: moves VolumeState of A to B", false, update(agent, volOf(nodeA), toNodeB)},
		{"agent bound to no pod: status of Agent A", false, statusPatch(agentUnbound, agentOf(nodeA), agentStatus)},
		{"agent bound to no pod: status of VolumeState of A", false, statusPatch(agentUnbound, volOf(nodeA), volStatus)},
		{"agent without user extra: status of Agent A", false, statusPatch(agentNoExtra, agentOf(nodeA), agentStatus)},
		{"agent without user extra: status of VolumeState of A", false, statusPatch(agentNoExtra, volOf(nodeA), volStatus)},
		{"CSI node without user extra: initiator label of Node A", false, patch(csiNodeNoExtra, nodeOf(nodeA), initiator)},
		{"CSI node A: initiator label of Node B", false, patch(csiNode, nodeOf(nodeB), initiator)},
		{"CSI node A: another label of Node A", false, patch(csiNode, nodeOf(nodeA), `{"metadata":{"labels":{"node-role.kubernetes.io/storage":""}}}`)},
		{"CSI node A: unschedulable Node A", false, patch(csiNode, nodeOf(nodeA), `{"spec":{"unschedulable":true}}`)},
		{"agent A: status of VolumeSnapshotState of B", false, statusPatch(agent, snapOf(nodeB), snapStatus)},
		{"agent A: status of VolumeSnapshotState of a long node", false, statusPatch(agent, snapOf(nodeLong), snapStatus)},
		{"agent of a long node: status of VolumeState of A", false, statusPatch(agentLong, volOf(nodeA), volStatus)},
		{"agent of a long node: status of the Agent of its sub-domain node", false, statusPatch(agentLong, agentOf(nodeSub), agentStatus)},
		{"agent of a long node: status of the VolumeState of its sub-domain node", false, statusPatch(agentLong, volOf(nodeSub), volStatus)},
		{"agent of a long node: finalizer of the VolumeState of its sub-domain node", false, update(agentLong, volOf(nodeSub), addFinalizer)},
		{"agent of a long node: status of the VolumeSnapshotState of its sub-domain node", false, statusPatch(agentLong, snapOf(nodeSub), snapStatus)},
		{"CSI node A: a freeze answer on a member asking node B", false, statusPatch(csiNode, snapOf(nodeB), freezeA)},
		{"CSI node A: node B's freeze answer on a member asking node A", false, statusPatch(csiNode, snapOf(nodeA), `{"status":{"freezes":[{"node":"`+nodeA+`","phase":"Frozen"},{"node":"`+nodeB+`","phase":"Thawed","reason":"Taken"}]}}`)},
		{"CSI node A: phase of a member asking node A", false, statusPatch(csiNode, snapOf(nodeA), `{"status":{"phase":"Failed"}}`)},
		{"CSI node without user extra: freeze answer on a member asking node A", false, statusPatch(csiNodeNoExtra, snapOf(nodeA), freezeA)},
		{"CSI node A: its appliedAttributes entry on VolumeState of B, not published to A", false, statusUpdate(csiNode, volName(nodeB), report(nodeA, 2))},
		{"CSI node A: its appliedAttributes entry on VolumeState of the long node", false, statusUpdate(csiNode, volName(nodeLong), report(nodeA, 1))},
		{"CSI node A: node B's entry on a VolumeState published to A", false, statusUpdate(csiNode, remote.Name, report(nodeB, 7))},
		{"CSI node A: node B's entry on VolumeState of B", false, statusUpdate(csiNode, volName(nodeB), report(nodeB, 0))},
		{"CSI node A: export address of a VolumeState published to A", false, statusUpdate(csiNode, remote.Name,
			func(st *storev1.VolumeStateStatus) { st.Export.Address = "198.51.100.66" })},
		{"CSI node A: phase of VolumeState of A", false, statusUpdate(csiNode, volName(nodeA), func(st *storev1.VolumeStateStatus) { st.Phase = storev1.VolumeFailed })},
		{"CSI node A: conditions of VolumeState of A, its own entry with them", false, statusUpdate(csiNode, volName(nodeA), func(st *storev1.VolumeStateStatus) {
			report(nodeA, 3)(st)
			st.Conditions = append(st.Conditions, metav1.Condition{Type: "Ready", Status: metav1.ConditionTrue, Reason: "Forged", LastTransitionTime: metav1.Now()})
		})},
		{"CSI node without user extra: its appliedAttributes entry on VolumeState of A", false, statusUpdate(csiNodeNoExtra, volName(nodeA), report(nodeA, 1))},
		{"CSI node A: its key generation report on VolumeState of B, not published to A", false, statusUpdate(csiNode, volName(nodeB), keyGen(nodeA, 3))},
		{"CSI node A: a key generation report as node B on VolumeState of A", false, statusUpdate(csiNode, volName(nodeA), keyGen(nodeB, 4))},
	}

	// RBAC and the admission policies are read from informers: wait (dry run, no effect) until
	// the first allowed write passes and one refused write of each policy is refused.
	var probes []write
	for _, w := range cases {
		switch w.what {
		case "agent A: status of Agent A", "agent A: status of Agent B", "agent A: status of VolumeState of B", "CSI node A: initiator label of Node B",
			"CSI node A: its appliedAttributes entry on VolumeState of B, not published to A":
			probes = append(probes, w)
		}
	}
	if len(probes) != 5 {
		t.Fatalf("%d probes, want 5", len(probes))
	}
	for _, p := range probes {
		waitFor(t, 60*time.Second, "policies in force: "+p.what, func() error {
			err := p.do(ctx, true)
			if p.allowed {
				return err
			}
			if err == nil {
				return fmt.Errorf("allowed, want refused")
			}
			if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "ValidatingAdmissionPolicy") {
				return fmt.Errorf("not refused by a policy yet: %v", err)
			}
			return nil
		})
	}

	// The API server type-checks each policy's expressions against the schemas of the kinds it
	// matches (the CRDs' and Node's) and reports mistakes as warnings in its status.
	for _, name := range []string{"plinth-agent-node-scope", "plinth-agent-volume-node-scope", "plinth-csi-node-scope", "plinth-csi-node-freeze-scope", "plinth-csi-node-volume-scope"} {
		waitFor(t, 60*time.Second, "type check of ValidatingAdmissionPolicy "+name, func() error {
			p, err := c.kube.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if p.Status.ObservedGeneration != p.Generation {
				return fmt.Errorf("status.observedGeneration %d, generation %d", p.Status.ObservedGeneration, p.Generation)
			}
			if p.Status.TypeChecking != nil && len(p.Status.TypeChecking.ExpressionWarnings) > 0 {
				t.Errorf("ValidatingAdmissionPolicy %s: type-check warnings %+v", name, p.Status.TypeChecking.ExpressionWarnings)
			}
			return nil
		})
	}

	var allowed, refused int
	for _, w := range cases {
		err := w.do(ctx, false)
		switch {
		case w.allowed && err == nil:
			allowed++
		case w.allowed:
			t.Errorf("%s: refused: %v", w.what, err)
		case err == nil:
			t.Errorf("%s: allowed, want refused by a node-scope policy", w.what)
		case !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "ValidatingAdmissionPolicy 'plinth-"):
			t.Errorf("%s: refused, but not by a node-scope policy: %v", w.what, err)
		default:
			refused++
			if !strings.Contains(err.Error(), "may ") && !strings.Contains(err.Error(), "carry no node") {
				t.Errorf("%s: refused without the policy's message: %v", w.what, err)
			}
			if strings.Contains(w.what, "without user extra") && !strings.Contains(err.Error(), "carry no node") {
				t.Errorf("%s: refused without the message of a caller that carries no node: %v", w.what, err)
			}
			t.Logf("%s: %v", w.what, err)
		}
	}
	if allowed != 17 || refused != 34 {
		t.Errorf("%d writes allowed and %d refused, want 17 and 34", allowed, refused)
	}

	// What was allowed landed, what was refused did not.
	var va, vb storev1.VolumeState
	if err := errors.Join(admin.Get(ctx, client.ObjectKeyFromObject(volOf(nodeA)), &va),
		admin.Get(ctx, client.ObjectKeyFromObject(volOf(nodeB)), &vb)); err != nil {
		t.Fatal(err)
	}
	if va.Status.Phase != storev1.VolumeReady || vb.Status.Phase != "" || len(vb.Finalizers) != 0 ||
		va.Labels[policyv1.LabelNode] != nodeA {
		t.Errorf("VolumeState of A: phase %q, labels %v; of B: phase %q, finalizers %v", va.Status.Phase, va.Labels,
			vb.Status.Phase, vb.Finalizers)
	}
	// The node plugin's reports: its own landed, the agent's status and node B's report did not move.
	var vr, vbNow storev1.VolumeState
	if err := errors.Join(admin.Get(ctx, client.ObjectKeyFromObject(remote), &vr),
		admin.Get(ctx, client.ObjectKeyFromObject(volOf(nodeB)), &vbNow)); err != nil {
		t.Fatal(err)
	}
	wantRemote := []storev1.AppliedAttributes{{NodeName: nodeB, Generation: 1}, {NodeName: nodeA, Generation: 1}}
	if !slices.Equal(vr.Status.AppliedAttributes, wantRemote) || vr.Status.Export.Address != "192.0.2.2" ||
		!slices.Equal(vbNow.Status.AppliedAttributes, []storev1.AppliedAttributes{{NodeName: nodeB, Generation: 1}}) ||
		!slices.Equal(va.Status.AppliedAttributes, []storev1.AppliedAttributes{{NodeName: nodeA, Generation: 1}}) ||
		len(va.Status.Conditions) != 0 {
		t.Errorf("published to A: appliedAttributes %v, export %+v; of B: %v; of A: %v, conditions %v", vr.Status.AppliedAttributes,
			vr.Status.Export, vbNow.Status.AppliedAttributes, va.Status.AppliedAttributes, va.Status.Conditions)
	}
	var na, nb corev1.Node
	if err := errors.Join(admin.Get(ctx, client.ObjectKey{Name: nodeA}, &na), admin.Get(ctx, client.ObjectKey{Name: nodeB}, &nb)); err != nil {
		t.Fatal(err)
	}
	if na.Labels[policyv1.LabelNVMeInitiator] != "true" || na.Spec.Unschedulable || len(nb.Labels) != 0 {
		t.Errorf("Node A labels %v unschedulable %v; Node B labels %v", na.Labels, na.Spec.Unschedulable, nb.Labels)
	}
	var vl, vsub storev1.VolumeState
	if err := errors.Join(admin.Get(ctx, client.ObjectKeyFromObject(volOf(nodeLong)), &vl),
		admin.Get(ctx, client.ObjectKeyFromObject(volOf(nodeSub)), &vsub)); err != nil {
		t.Fatal(err)
	}
	if vl.Status.Phase != storev1.VolumeReady || len(vl.Finalizers) != 1 || vsub.Status.Phase != "" || len(vsub.Finalizers) != 0 {
		t.Errorf("VolumeState of the long node: phase %q, finalizers %v; of its sub-domain node: phase %q, finalizers %v",
			vl.Status.Phase, vl.Finalizers, vsub.Status.Phase, vsub.Finalizers)
	}
	// Leave the finalizers to nobody: the cluster is shared by later subtests.
	for _, n := range []string{nodeA, nodeLong} {
		if err := admin.Patch(ctx, volOf(n), client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`))); err != nil {
			t.Fatal(err)
		}
	}
}

// snapshotID is the VolumeSnapshotState name of the test's snapshot on node n.
func snapshotID(n string) string { return "snap-" + storev1.VolumeID(n)[len(storev1.VolumeIDPrefix):] }

// TestCSINodeVolumeScopeNamesEveryStatusField: the node plugin's policy keeps every field of
// VolumeStateStatus but appliedAttributes (and encryption, its own report on a volume it
// opens) as it was by naming each one; a status field added
// later and not named there would be writable by every node plugin.
func TestCSINodeVolumeScopeNamesEveryStatusField(t *testing.T) {
	b, err := os.ReadFile("../../kustomize/rbac/node_scope.yaml")
	if err != nil {
		t.Fatal(err)
	}
	_, policy, ok := strings.Cut(string(b), "name: plinth-csi-node-volume-scope")
	if !ok {
		t.Fatal("kustomize/rbac/node_scope.yaml has no plinth-csi-node-volume-scope")
	}
	typ := reflect.TypeFor[storev1.VolumeStateStatus]()
	named := 0
	for i := range typ.NumField() {
		tag, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
		if tag == "appliedAttributes" {
			continue
		}
		named++
		if want := "object.?status.?" + tag + " == oldObject.?status.?" + tag; !strings.Contains(policy, want) {
			t.Errorf("plinth-csi-node-volume-scope lacks %q: status.%s is writable by every node plugin", want, tag)
		}
	}
	if named != 9 {
		t.Errorf("%d status fields besides appliedAttributes, want 9 (update this test with the policy)", named)
	}
}
