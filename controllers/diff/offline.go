package diff

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/plinth-storage/plinth/controllers/drift"
	"github.com/plinth-storage/plinth/controllers/render"
	"github.com/plinth-storage/plinth/controllers/storageclass"
	"github.com/plinth-storage/plinth/schema/vet"
)

// Offline compares the policy tree at paths with the one at against (for example the merge
// base and the head of a pull request), both rendered for nodes, without a cluster: the same
// report as Live minus everything that needs live usage (PVCs, volumes, capacity, and so
// the violations). Problems of either tree make a report with Problems; the error is for I/O.
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
	old := map[string]*unstructured.Unstructured{}
	for _, u := range oldObjs {
		old[u.GetKind()+"/"+u.GetName()] = u
	}
	b := &builder{rep: rep, before: before, after: after, sources: newOut.Sources, fallback: paths[0]}
	seen := map[string]bool{}
	for _, u := range newObjs {
		key := u.GetKind() + "/" + u.GetName()
		seen[key] = true
		o := old[key]
		if o == nil {
			rep.Objects = append(rep.Objects, ObjectChange{Kind: u.GetKind(), Name: u.GetName(), Action: ActionCreate})
			if u.GetKind() == "Store" {
				b.storeAdded(u)
			}
			continue
		}
		if u.GetKind() == "StorageClass" {
			var want, was storagev1.StorageClass
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &want); err != nil {
				return nil, err
			}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &was); err != nil {
				return nil, err
			}
			changes := storageclass.Diff(&was, &want)
			if imm := storageclass.Immutable(changes); len(imm) > 0 {
				if b.replacement(&want, changes, imm) {
					continue
				}
				kept, err := render.ToUnstructured(storageclass.KeepImmutable(&want, &was))
				if err != nil {
					return nil, err
				}
				u = kept
			}
		}
		fields := drift.Paths(o, u)
		if len(fields) == 0 {
			rep.Counts.Unchanged++
			continue
		}
		rep.Objects = append(rep.Objects, ObjectChange{Kind: u.GetKind(), Name: u.GetName(), Action: ActionChange, Fields: fields})
	}
	// What left the render, in the controller's prune order (Stores, Agents, StorageClasses).
	for _, kind := range []string{"Store", "Agent", "StorageClass"} {
		for _, u := range oldObjs {
			if u.GetKind() == kind && !seen[kind+"/"+u.GetName()] {
				b.stale(u, map[string]bool{})
			}
		}
	}
	rep.Policy = policyChanges(before, after, func(kind, name string) (string, int) {
		f, l, _ := before.position(kind, name, "", "")
		return f, l
	})
	b.finish()
	return rep, nil
}
