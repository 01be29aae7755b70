// Package deploy installs Plinth the way its users do: `kustomize build` of a
// folder of kustomize/ (a shipped base, or an overlay of one) and
// server-side apply of the result, then a wait until every workload is
// rolled out (kstatus: Deployments and DaemonSets Available at their
// generation). `plinth-dev` and the real-node end-to-end suite deploy
// through it, so what they run is what `kustomize build kustomize/default |
// kubectl apply --server-side -f -` runs.
//
// Nothing is patched on the way: RBAC is the shipped RBAC, so a verb Plinth
// lacks shows as a failing component, not as a harness that papered over it.
package deploy

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/fluxcd/cli-utils/pkg/kstatus/polling"
	"github.com/fluxcd/cli-utils/pkg/object"
	"github.com/fluxcd/pkg/ssa"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// FieldManager is the server-side apply field manager of what deploy applies
// (the name `kubectl apply --server-side` users would pick).
const FieldManager = "plinth-deploy"

// Build runs kustomize (krusty, default options: load restrictions
// root-only, no plugins) on dir and returns the objects in the order
// kustomize emits them. Errors are kustomize's, prefixed with dir.
func Build(dir string) ([]*unstructured.Unstructured, error) {
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	var objs []*unstructured.Unstructured
	for _, r := range m.Resources() {
		// Through JSON: numbers become int64/float64 as unstructured objects need them.
		data, err := r.MarshalJSON()
		if err != nil {
			return nil, fmt.Errorf("kustomize build %s: %s: %w", dir, r.CurId(), err)
		}
		obj := &unstructured.Unstructured{}
		if err := obj.UnmarshalJSON(data); err != nil {
			return nil, fmt.Errorf("kustomize build %s: %s: %w", dir, r.CurId(), err)
		}
		objs = append(objs, obj)
	}
	return objs, nil
}

// Result says what Apply did.
type Result struct {
	// Applied counts the objects applied, by kind.
	Applied map[string]int
	// Workloads are the Deployments and DaemonSets waited for, as kind/namespace/name.
	Workloads []string
	// ApplyDuration is the server-side apply of every object (CRDs and
	// Namespaces first, waited for); RolloutDuration is then → every workload Current.
	ApplyDuration, RolloutDuration time.Duration
}

// String is one line per kind and the workload list.
func (r *Result) String() string {
	var kinds []string
	for k, n := range r.Applied {
		kinds = append(kinds, fmt.Sprintf("%d %s", n, k))
	}
	sort.Strings(kinds)
	return fmt.Sprintf("applied %s (server-side, %.1fs)\nrolled out in %.1fs: %s",
		strings.Join(kinds, ", "), r.ApplyDuration.Seconds(), r.RolloutDuration.Seconds(), strings.Join(r.Workloads, ", "))
}

// Apply server-side applies objs with cfg (CRDs, ClusterRoles and
// Namespaces first, waited for, then the rest, as Flux's kustomize-controller
// does) and waits up to timeout until every Deployment and DaemonSet among
// them is rolled out. On a timeout the error names each workload that is
// not, with its kstatus message.
func Apply(ctx context.Context, cfg *rest.Config, objs []*unstructured.Unstructured, timeout time.Duration) (*Result, error) {
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		return nil, err
	}
	poller := polling.NewStatusPoller(c, c.RESTMapper(), polling.Options{})
	m := ssa.NewResourceManager(c, poller, ssa.Owner{Field: FieldManager, Group: "plinth.dev"})
	opts := ssa.DefaultApplyOptions()
	opts.WaitInterval, opts.WaitTimeout = time.Second, timeout
	res := &Result{Applied: map[string]int{}}
	t0 := time.Now()
	if _, err := m.ApplyAllStaged(ctx, objs, opts); err != nil {
		return res, fmt.Errorf("server-side apply: %w", err)
	}
	res.ApplyDuration = time.Since(t0)
	var workloads []*unstructured.Unstructured
	for _, o := range objs {
		res.Applied[o.GetKind()]++
		if k := o.GetKind(); k == "Deployment" || k == "DaemonSet" {
			workloads = append(workloads, o)
			res.Workloads = append(res.Workloads, k+"/"+o.GetNamespace()+"/"+o.GetName())
		}
	}
	t1 := time.Now()
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := m.WaitForSetWithContext(wctx, object.UnstructuredSetToObjMetadataSet(workloads), ssa.WaitOptions{Interval: time.Second, Timeout: timeout}); err != nil {
		return res, fmt.Errorf("rollout of %s: %w", strings.Join(res.Workloads, ", "), err)
	}
	res.RolloutDuration = time.Since(t1)
	return res, nil
}

// Delete removes objs (the reverse of Apply; CRDs and Namespaces last) and
// does not wait. Objects already gone are not an error.
func Delete(ctx context.Context, cfg *rest.Config, objs []*unstructured.Unstructured) error {
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		return err
	}
	m := ssa.NewResourceManager(c, nil, ssa.Owner{Field: FieldManager, Group: "plinth.dev"})
	if _, err := m.DeleteAll(ctx, objs, ssa.DeleteOptions{PropagationPolicy: "Background"}); err != nil {
		return fmt.Errorf("delete: %w", err)
	}
	return nil
}
