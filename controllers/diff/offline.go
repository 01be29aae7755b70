package diff

import (
	"context"
	"fmt"

	"github.com/fluxcd/pkg/ssa"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/plinth-storage/plinth/controllers/drift"
	"github.com/plinth-storage/plinth/controllers/inventory"
	"github.com/plinth-storage/plinth/controllers/plan"
	"github.com/plinth-storage/plinth/schema/vet"
)

// Offline compares the policy tree at paths with the one at against (for example the merge
// base and the head of a pull request), both rendered for nodes, without a cluster: the same
// report as Live minus everything that needs live usage (PVCs, volumes, capacity, and so
// the violations that need them). The plan is the controller's, made against the old render
// standing in for the cluster. Problems of either tree make a report with Problems; the error
// is for I/O.
func Offline(paths, against []string, nodes []corev1.Node) (*Report, error) {
	rep := &Report{Mode: ModeOffline, Paths: paths, Against: against}
	v, err := vet.NewVetter()
	if err != nil {
		return nil, err
	}
	after, problems, err := loadTree(v, paths)
	if err != nil {
		return nil, err
	}
	before, oldProblems, err := loadTree(v, against)
	if err != nil {
		return nil, fmt.Errorf("--against: %w", err)
	}
	if problems = append(problems, oldProblems...); len(problems) > 0 {
		rep.Problems = problems
		return rep, nil
	}
	newOut, problems := renderSet(after, nodes)
	oldOut, oldProblems := renderSet(before, nodes)
	if problems = append(problems, oldProblems...); len(problems) > 0 {
		rep.Problems = problems
		return rep, nil
	}
	newObjs, err := newOut.Unstructured()
	if err != nil {
		return nil, err
	}
	oldObjs, err := oldOut.Unstructured()
	if err != nil {
		return nil, err
	}
	src := oldRender{}
	prev := inventory.New()
	for _, u := range oldObjs {
		e, err := inventory.EntryOf(u)
		if err != nil {
			return nil, err
		}
		prev.Put(e)
		src[u.GetKind()+"/"+u.GetName()] = u
	}
	pl, err := plan.Make(context.Background(), plan.Input{Desired: newObjs, Sources: newOut.Sources, Placements: after.places, Pools: after.pools, Previous: prev}, src)
	if err != nil {
		return nil, err
	}
	b := &builder{rep: rep, before: before, after: after, sources: newOut.Sources, fallback: paths[0]}
	b.report(pl)
	b.encryption()
	rep.Policy = policyChanges(before, after, func(kind, name string) (string, int) {
		f, l, _ := before.position(kind, name, "", "")
		return f, l
	})
	b.finish()
	return rep, nil
}

// oldRender is the plan.Source of the offline mode: the old tree's render stands in for the
// cluster (by "Kind/name"); a "dry-run" compares with it, and usage is not known.
type oldRender map[string]*unstructured.Unstructured

func (o oldRender) Get(_ context.Context, gvk schema.GroupVersionKind, name string) (*unstructured.Unstructured, error) {
	if u := o[gvk.Kind+"/"+name]; u != nil {
		return u.DeepCopy(), nil
	}
	return nil, nil
}

func (oldRender) Cached(context.Context, *unstructured.Unstructured) plan.CacheState {
	return plan.CacheUnknown
}

func (o oldRender) DryRun(_ context.Context, objs []*unstructured.Unstructured) ([]plan.DryRun, error) {
	out := make([]plan.DryRun, len(objs))
	for i, u := range objs {
		old := o[u.GetKind()+"/"+u.GetName()]
		switch {
		case old == nil:
			out[i] = plan.DryRun{Action: ssa.CreatedAction}
		default:
			if fields := drift.Paths(old, u); len(fields) > 0 {
				out[i] = plan.DryRun{Action: ssa.ConfiguredAction, Fields: fields}
			} else {
				out[i] = plan.DryRun{Action: ssa.UnchangedAction}
			}
		}
	}
	return out, nil
}

func (oldRender) ClassUsage(context.Context, string) (plan.Usage, error) { return plan.Usage{}, nil }

func (oldRender) AttributesClassUsage(context.Context, string) (plan.Usage, error) {
	return plan.Usage{}, nil
}

func (oldRender) StoreUsage(context.Context, string) (plan.Usage, error) { return plan.Usage{}, nil }
