package manifests

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	authv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"

	"github.com/plinth-storage/plinth/test/framework/controlplane"
)

const fieldManager = "plinth-manifests-test"

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// cluster is a started control plane with Plinth's CRDs, the third-party CRDs and the
// namespaces the manifests use.
type cluster struct {
	cp       *controlplane.ControlPlane
	cfg      *rest.Config
	dyn      dynamic.Interface
	kube     kubernetes.Interface
	mapper   meta.ResettableRESTMapper
	warnings *warnings
}

func startCluster(t *testing.T) *cluster {
	t.Helper()
	// The one controller: it type-checks ValidatingAdmissionPolicies against the schemas of the
	// kinds they match and writes the result into their status (testNodeScope reads it).
	cp := controlplane.ForTest(t, controlplane.Options{ControllerManager: true,
		Controllers: []string{"validatingadmissionpolicy-status-controller"}})
	c := clientsOf(t, cp)
	ctx := t.Context()
	var files []string
	for _, dir := range []string{crdBases, "crds"} {
		f, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
		if err != nil || len(f) == 0 {
			t.Fatalf("no CRDs in %s: %v", dir, err)
		}
		files = append(files, f...)
	}
	c.installCRDs(t, ctx, files)
	for _, ns := range []string{namespace, keys, "flux-system", "argocd"} {
		if _, err := c.kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	return c
}

// clientsOf is a cluster of cp's clients as its admin, with nothing installed.
func clientsOf(t *testing.T, cp *controlplane.ControlPlane) *cluster {
	t.Helper()
	c := &cluster{cp: cp, cfg: cp.Admin.Config, warnings: &warnings{}}
	cfg := rest.CopyConfig(cp.Admin.Config)
	cfg.WarningHandler = c.warnings
	var err error
	if c.dyn, err = dynamic.NewForConfig(cfg); err != nil {
		t.Fatal(err)
	}
	if c.kube, err = kubernetes.NewForConfig(cfg); err != nil {
		t.Fatal(err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c.mapper = restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	return c
}

func (c *cluster) installCRDs(t *testing.T, ctx context.Context, files []string) {
	t.Helper()
	var names []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		obj := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(data, &obj.Object); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if _, err := c.dyn.Resource(crdGVR).Create(ctx, obj, metav1.CreateOptions{FieldManager: fieldManager}); err != nil {
			t.Fatalf("install CRD %s: %v", filepath.Base(f), err)
		}
		names = append(names, obj.GetName())
	}
	for _, n := range names {
		waitFor(t, 60*time.Second, "CRD "+n+" Established", func() error {
			got, err := c.dyn.Resource(crdGVR).Get(ctx, n, metav1.GetOptions{})
			if err != nil {
				return err
			}
			conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
			for _, cd := range conds {
				m, _ := cd.(map[string]any)
				if m["type"] == "Established" && m["status"] == "True" {
					return nil
				}
			}
			return fmt.Errorf("not Established")
		})
	}
}

// resource maps an object to its resource, refreshing discovery while newly installed CRDs
// are not served yet.
func (c *cluster) resource(t *testing.T, o *unstructured.Unstructured) (dynamic.ResourceInterface, *meta.RESTMapping) {
	t.Helper()
	gvk := o.GroupVersionKind()
	var m *meta.RESTMapping
	waitFor(t, 30*time.Second, "discovery of "+gvk.String(), func() error {
		var err error
		m, err = c.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			c.mapper.Reset()
		}
		return err
	})
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		if o.GetNamespace() == "" {
			t.Errorf("%s is namespaced but names no namespace (it would land in the applier's namespace)", ID(o))
		}
		return c.dyn.Resource(m.Resource).Namespace(o.GetNamespace()), m
	}
	return c.dyn.Resource(m.Resource), m
}

// apply applies o with server-side apply, as `kubectl apply --server-side [--dry-run=server]`.
func (c *cluster) apply(t *testing.T, ctx context.Context, o *unstructured.Unstructured, dryRun bool) error {
	t.Helper()
	ri, _ := c.resource(t, o)
	data, err := o.MarshalJSON()
	if err != nil {
		return err
	}
	force := true
	opts := metav1.PatchOptions{FieldManager: fieldManager, Force: &force, FieldValidation: metav1.FieldValidationStrict}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	_, err = ri.Patch(ctx, o.GetName(), types.ApplyPatchType, data, opts)
	if w := c.warnings.take(); len(w) > 0 {
		err = errors.Join(err, fmt.Errorf("warnings: %v", w))
	}
	return err
}

// knownWarnings are warnings of upstream names the examples keep on purpose.
var knownWarnings = []string{
	// Argo CD's own finalizer name, as its documentation spells it.
	`metadata.finalizers: "resources-finalizer.argocd.argoproj.io": prefer a domain-qualified finalizer name`,
}

// warnings collects the API server's warnings (deprecated fields, unknown fields under
// FieldValidation Warn, finalizer names) so that a manifest that draws one fails.
type warnings struct {
	mu   sync.Mutex
	list []string
}

func (w *warnings) HandleWarningHeader(_ int, _ string, text string) {
	for _, k := range knownWarnings {
		if strings.Contains(text, k) {
			return
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.list = append(w.list, text)
}

func (w *warnings) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	l := w.list
	w.list = nil
	return l
}

// TestAPIServer runs the checks that need the real API server on one control plane.
func TestAPIServer(t *testing.T) {
	c := startCluster(t)
	t.Run("server-side dry-run", func(t *testing.T) { testServerSideDryRun(t, c) })
	t.Run("RBAC", func(t *testing.T) { testRBAC(t, c) })
	t.Run("CSI node start-up under its RBAC", func(t *testing.T) { testCSINodeStartup(t, c) })
	t.Run("move executor under the CSI controller's RBAC", func(t *testing.T) { testMoveExecutorUnderItsRBAC(t, c) })
	t.Run("node-scoped agent and CSI node", func(t *testing.T) { testNodeScope(t, c) })
	t.Run("key distribution", func(t *testing.T) { testKeyDistribution(t, c) })
	t.Run("scheduler config", func(t *testing.T) { testSchedulerConfig(t, c) })
	t.Run("Helm chart server-side dry-run", func(t *testing.T) { testHelmChartDryRun(t, c) })
	t.Run("kubectl get stores prints sizes", func(t *testing.T) { testStoreColumns(t, c) })
}

// Every object of every kustomization is accepted by the real API server (server-side apply,
// dry run, strict field validation, no warnings): schemas of built-in kinds and CRDs (Plinth's,
// the Prometheus Operator's, Flux's, Argo CD's), admission, validation.
func testServerSideDryRun(t *testing.T, c *cluster) {
	ctx := t.Context()
	b := allBuilds(t)
	dirs := make([]string, 0, len(b))
	for d := range b {
		dirs = append(dirs, d)
	}
	sort.Strings(dirs)
	total := 0
	for _, d := range dirs {
		t.Run(d, func(t *testing.T) {
			for _, o := range b[d] {
				if err := c.apply(t, ctx, o, true); err != nil {
					t.Errorf("kustomize/%s: %s rejected: %v", d, ID(o), err)
				}
				total++
			}
		})
	}
	t.Logf("%d objects of %d kustomizations accepted by server-side dry-run", total, len(dirs))
}

// review is one access question for a component's ServiceAccount.
type review struct {
	verb, group, resource, sub, ns, name string
	allowed                              bool
}

func (r review) String() string {
	res := r.resource
	if r.group != "" {
		res += "." + r.group
	}
	if r.sub != "" {
		res += "/" + r.sub
	}
	where := "cluster"
	if r.ns != "" {
		where = "namespace " + r.ns
	}
	return fmt.Sprintf("%s %s in %s", r.verb, res, where)
}

func allow(verb, group, resource, sub, ns string) review {
	return review{verb: verb, group: group, resource: resource, sub: sub, ns: ns, allowed: true}
}
func deny(verb, group, resource, sub, ns string) review {
	return review{verb: verb, group: group, resource: resource, sub: sub, ns: ns}
}

const (
	pol  = "policy.plinth.dev"
	sto  = "storage.plinth.dev"
	k8s  = "storage.k8s.io"
	snap = "snapshot.storage.k8s.io"
)

// The RBAC of kustomize/rbac (and the Argo CD Role of kustomize/argocd), applied for real, gives
// each component's ServiceAccount what its code does and refuses what it does not: the same
// questions `kubectl auth can-i --as system:serviceaccount:plinth-system:<sa>` asks
// (SelfSubjectAccessReview under impersonation).
func testRBAC(t *testing.T, c *cluster) {
	ctx := t.Context()
	b := allBuilds(t)
	objs := append([]*unstructured.Unstructured{}, b["rbac"]...)
	for _, o := range b["argocd"] {
		if o.GetAPIVersion() == "rbac.authorization.k8s.io/v1" {
			objs = append(objs, o)
		}
	}
	for _, o := range objs {
		if err := c.apply(t, ctx, o, false); err != nil {
			t.Fatalf("apply %s: %v", ID(o), err)
		}
	}
	cases := map[string][]review{
		"plinth-controller": {
			allow("watch", pol, "storagepools", "", ""), allow("patch", pol, "placements", "status", ""),
			allow("update", pol, "placements", "finalizers", ""), allow("patch", pol, "placements", "", ""),
			allow("create", sto, "stores", "", ""), allow("delete", sto, "agents", "", ""), allow("patch", sto, "stores", "", ""),
			allow("list", sto, "volumestates", "", ""), allow("delete", k8s, "storageclasses", "", ""), allow("create", k8s, "storageclasses", "", ""),
			allow("list", "", "persistentvolumeclaims", "", ""), allow("watch", "", "persistentvolumes", "", ""), allow("watch", "", "nodes", "", ""),
			allow("get", "", "configmaps", "", namespace), allow("patch", "", "configmaps", "", namespace),
			allow("update", "coordination.k8s.io", "leases", "", namespace), allow("create", "events.k8s.io", "events", "", namespace),
			allow("get", "kustomize.toolkit.fluxcd.io", "kustomizations", "", "flux-system"), allow("get", "argoproj.io", "applications", "", "argocd"),
			deny("delete", pol, "storagepools", "", ""), deny("create", pol, "placements", "", ""),
			// Liveness marks (a deleted Node, a silent agent) patch the status of Agents and
			// Stores; the controller never replaces it.
			allow("patch", sto, "stores", "status", ""), allow("patch", sto, "agents", "status", ""),
			deny("update", sto, "stores", "status", ""), deny("update", sto, "agents", "status", ""),
			deny("create", sto, "volumestates", "", ""), deny("update", sto, "volumestates", "", ""),
			deny("patch", "", "nodes", "", ""), deny("delete", "", "persistentvolumeclaims", "", "default"), deny("create", "", "persistentvolumes", "", ""),
			deny("get", "", "configmaps", "", "default"), deny("list", "argoproj.io", "applications", "", "argocd"),
			// the DH-HMAC-CHAP host Secrets of its own namespace only
			allow("create", "", "secrets", "", namespace), allow("watch", "", "secrets", "", namespace), allow("delete", "", "secrets", "", namespace),
			deny("get", "", "secrets", "", "default"), deny("list", "", "secrets", "", ""), deny("patch", "", "secrets", "", namespace),
			deny("patch", "kustomize.toolkit.fluxcd.io", "kustomizations", "", "flux-system"),
			// the key server reviews its callers' tokens
			allow("create", "authentication.k8s.io", "tokenreviews", "", ""),
		},
		"plinth-agent": {
			allow("watch", sto, "agents", "", ""), allow("patch", sto, "agents", "status", ""), allow("list", sto, "stores", "", ""),
			allow("patch", sto, "stores", "status", ""), allow("update", sto, "volumestates", "", ""), allow("patch", sto, "volumestates", "status", ""),
			allow("update", sto, "volumestates", "finalizers", ""),
			deny("update", sto, "agents", "", ""), deny("patch", sto, "stores", "", ""), deny("create", sto, "volumestates", "", ""),
			deny("delete", sto, "volumestates", "", ""), deny("list", pol, "storagepools", "", ""),
			// the Nodes, read uncached for another node presenting this node's host NQN; never written
			allow("list", "", "nodes", "", ""), allow("get", "", "nodes", "", ""), deny("patch", "", "nodes", "", ""), deny("update", "", "nodes", "", ""),
			deny("create", k8s, "storageclasses", "", ""), deny("create", "coordination.k8s.io", "leases", "", namespace),
			// no Secret at all: host keys come from the controller's key server
			deny("get", "", "secrets", "", namespace), deny("list", "", "secrets", "", namespace), deny("get", "", "secrets", "", "default"),
			deny("get", "", "secrets", "", keys),
			// the key server's CA ConfigMap by name (while kubelet has not filled its volume); no other
			{verb: "get", resource: "configmaps", ns: namespace, name: "plinth-key-server-ca", allowed: true},
			{verb: "get", resource: "configmaps", ns: namespace, name: "plinth-inventory"}, deny("list", "", "configmaps", "", namespace),
		},
		"plinth-csi-controller": {
			allow("create", sto, "volumestates", "", ""), allow("update", sto, "volumestates", "", ""), allow("delete", sto, "volumestates", "", ""),
			allow("watch", sto, "volumestates", "", ""), allow("list", sto, "stores", "", ""), allow("get", pol, "placements", "", ""),
			allow("list", "", "nodes", "", ""), allow("create", "", "persistentvolumes", "", ""), allow("delete", "", "persistentvolumes", "", ""),
			allow("update", "", "persistentvolumeclaims", "", "default"), allow("patch", "", "persistentvolumeclaims", "status", "default"),
			allow("patch", k8s, "volumeattachments", "status", ""), allow("watch", k8s, "csinodes", "", ""),
			allow("create", k8s, "csistoragecapacities", "", namespace), allow("create", "coordination.k8s.io", "leases", "", namespace),
			allow("get", "apps", "replicasets", "", namespace), allow("create", "", "events", "", "default"),
			deny("patch", sto, "volumestates", "status", ""), deny("patch", sto, "stores", "", ""), deny("update", pol, "placements", "", ""),
			deny("patch", "", "nodes", "", ""), deny("create", k8s, "csistoragecapacities", "", "default"), deny("get", "", "secrets", "", namespace),
			deny("create", k8s, "storageclasses", "", ""), deny("create", "coordination.k8s.io", "leases", "", "default"),
			// the key Secrets of encrypted volumes: created and read by name in the key namespace
			// only (a source's key copied into its snapshot's, restore's or clone's), updated by a
			// key rotation, never listed, watched, patched or deleted; no Secret of its own
			// namespace or any other; the Placement status of a key rotation, not its spec
			allow("create", "", "secrets", "", keys), allow("get", "", "secrets", "", keys), deny("list", "", "secrets", "", keys),
			deny("watch", "", "secrets", "", keys), allow("update", "", "secrets", "", keys), deny("patch", "", "secrets", "", keys),
			deny("delete", "", "secrets", "", keys), deny("create", "", "secrets", "", namespace), deny("list", "", "secrets", "", namespace),
			deny("create", "", "secrets", "", "default"), deny("update", "", "secrets", "", "default"), deny("update", "", "secrets", "", namespace),
			allow("patch", pol, "placements", "status", ""), deny("patch", pol, "placements", "", ""),
			// the move executor: the Agents read for the plan, the StoragePool's Evacuating
			// condition written; no pool spec, no Agent status
			allow("list", sto, "agents", "", ""), allow("watch", sto, "agents", "", ""), deny("patch", sto, "agents", "status", ""),
			allow("patch", pol, "storagepools", "status", ""), deny("patch", pol, "storagepools", "", ""), deny("update", pol, "storagepools", "status", ""),
			// csi-snapshotter carries out VolumeSnapshotContents; VolumeSnapshots are snapshot-controller's.
			allow("update", snap, "volumesnapshotcontents", "", ""), allow("patch", snap, "volumesnapshotcontents", "status", ""),
			allow("list", snap, "volumesnapshotclasses", "", ""), allow("get", snap, "volumesnapshots", "", "default"),
			deny("create", snap, "volumesnapshotcontents", "", ""), deny("delete", snap, "volumesnapshotcontents", "", ""),
			deny("update", snap, "volumesnapshots", "", "default"), deny("patch", snap, "volumesnapshots", "status", "default"),
		},
		"plinth-csi-node": {
			// its Node patched (label, host NQN annotation); the Nodes read for a duplicate host NQN
			allow("patch", "", "nodes", "", ""), allow("get", "", "nodes", "", ""), allow("list", "", "nodes", "", ""),
			deny("update", "", "nodes", "", ""), deny("delete", "", "nodes", "", ""),
			// VolumeStates read (volume health) and watched for the I/O limits of their tier
			// (csi/node/qos.go), which it reports in status; never their spec
			allow("get", sto, "volumestates", "", ""), allow("list", sto, "volumestates", "", ""), allow("watch", sto, "volumestates", "", ""),
			allow("update", sto, "volumestates", "status", ""), deny("update", sto, "volumestates", "", ""),
			deny("patch", sto, "volumestates", "", ""), deny("delete", sto, "volumestates", "", ""),
			deny("patch", "", "pods", "", namespace),
			// no Secret at all: its node's keys come from the controller's key server, volume keys
			// from kubelet (NodeStage's secrets)
			deny("get", "", "secrets", "", namespace), deny("list", "", "secrets", "", namespace), deny("watch", "", "secrets", "", namespace),
			deny("get", "", "secrets", "", "default"), deny("get", "", "secrets", "", keys), deny("list", "", "secrets", "", keys),
			{verb: "get", resource: "configmaps", ns: namespace, name: "plinth-key-server-ca", allowed: true},
			{verb: "get", resource: "configmaps", ns: namespace, name: "plinth-inventory"}, deny("watch", "", "configmaps", "", namespace),
		},
		"plinth-scheduler": {
			allow("list", sto, "stores", "", ""), allow("watch", pol, "placements", "", ""), allow("list", pol, "protocols", "", ""),
			allow("create", "", "pods", "binding", "default"),
			allow("create", "coordination.k8s.io", "leases", "", namespace), allow("update", "coordination.k8s.io", "leases", "", namespace),
			allow("list", k8s, "csistoragecapacities", "", ""),
			{verb: "get", resource: "configmaps", ns: "kube-system", name: "extension-apiserver-authentication", allowed: true},
			deny("update", sto, "stores", "", ""), deny("create", sto, "volumestates", "", ""), deny("get", "", "secrets", "", namespace),
			deny("patch", sto, "stores", "status", ""), deny("list", sto, "agents", "", ""), deny("list", sto, "volumestates", "", ""),
			deny("update", pol, "placements", "", ""),
		},
	}
	sas := make([]string, 0, len(cases))
	for sa := range cases {
		sas = append(sas, sa)
	}
	sort.Strings(sas)
	for _, sa := range sas {
		t.Run(sa, func(t *testing.T) {
			imp := rest.CopyConfig(c.cfg)
			imp.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + namespace + ":" + sa}
			kc, err := kubernetes.NewForConfig(imp)
			if err != nil {
				t.Fatal(err)
			}
			can := func(r review) (bool, error) {
				res, err := kc.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authv1.SelfSubjectAccessReview{
					Spec: authv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authv1.ResourceAttributes{
						Namespace: r.ns, Verb: r.verb, Group: r.group, Resource: r.resource, Subresource: r.sub, Name: r.name,
					}},
				}, metav1.CreateOptions{})
				if err != nil {
					return false, err
				}
				return res.Status.Allowed, nil
			}
			// The RBAC authorizer reads from informers: wait until the first grant is seen.
			first := cases[sa][0]
			waitFor(t, 30*time.Second, sa+" can "+first.String(), func() error {
				ok, err := can(first)
				if err == nil && !ok {
					err = fmt.Errorf("denied")
				}
				return err
			})
			for _, r := range cases[sa] {
				ok, err := can(r)
				if err != nil {
					t.Fatalf("%s: %v", r, err)
				}
				if ok != r.allowed {
					t.Errorf("%s can %s: %v, want %v", sa, r, ok, r.allowed)
				}
			}
		})
	}
}

func waitFor(t *testing.T, timeout time.Duration, what string, f func() error) {
	t.Helper()
	controlplane.Eventually(t, timeout, 200*time.Millisecond, what, f)
}

// kubectl get stores shows sizes people read (Size, Provisioned, Available in binary units),
// as the API server's table for the Store CRD's printer columns gives them to kubectl; the
// bytes stay in the wide output.
func testStoreColumns(t *testing.T, c *cluster) {
	ctx := t.Context()
	gvr := schema.GroupVersionResource{Group: "storage.plinth.dev", Version: "v1alpha1", Resource: "stores"}
	st := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "storage.plinth.dev/v1alpha1", "kind": "Store",
		"metadata": map[string]any{"name": "fast.columns"},
		"spec":     map[string]any{"pool": "fast", "nodeName": "columns", "backend": map[string]any{"file": map[string]any{"directory": "/var/lib/plinth"}}},
	}}
	created, err := c.dyn.Resource(gvr).Create(ctx, st, metav1.CreateOptions{FieldManager: fieldManager})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.dyn.Resource(gvr).Delete(context.Background(), "fast.columns", metav1.DeleteOptions{}) })
	const total, avail = int64(100) << 30, int64(1<<30) * 43 / 2
	created.Object["status"] = map[string]any{
		"capacity":     map[string]any{"total": total, "allocatable": total, "provisioned": int64(0), "available": avail},
		"capacityText": map[string]any{"total": "100Gi", "provisioned": "0", "available": "21.5Gi"},
	}
	if _, err := c.dyn.Resource(gvr).UpdateStatus(ctx, created, metav1.UpdateOptions{FieldManager: fieldManager}); err != nil {
		t.Fatal(err)
	}
	raw, err := c.kube.CoreV1().RESTClient().Get().AbsPath("/apis/storage.plinth.dev/v1alpha1/stores/fast.columns").
		SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").DoRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var table metav1.Table
	if err := yaml.Unmarshal(raw, &table); err != nil {
		t.Fatal(err)
	}
	if len(table.Rows) != 1 {
		t.Fatalf("%d rows, want 1", len(table.Rows))
	}
	narrow, wide := map[string]any{}, map[string]any{}
	for i, col := range table.ColumnDefinitions {
		if col.Priority == 0 {
			narrow[col.Name] = table.Rows[0].Cells[i]
		} else {
			wide[col.Name] = table.Rows[0].Cells[i]
		}
	}
	for name, want := range map[string]any{"Size": "100Gi", "Provisioned": "0", "Available": "21.5Gi"} {
		if narrow[name] != want {
			t.Errorf("column %s = %v, want %v (columns %v)", name, narrow[name], want, narrow)
		}
	}
	if got, ok := wide["Available bytes"].(float64); !ok || int64(got) != avail {
		t.Errorf("wide column Available bytes = %v, want %d", wide["Available bytes"], avail)
	}
}
