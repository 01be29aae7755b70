package policy

import (
	"context"
	"fmt"
	"strings"

	"github.com/fluxcd/pkg/ssa"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/controllers/render"
	"github.com/plinth-storage/plinth/controllers/storageclass"
)

// replace deletes live and creates desired in its place: the new object is validated
// first by a server dry-run create, the delete is preconditioned on live's UID, and an old
// object still present afterwards means "wait", not failure. It returns done=false while
// waiting.
func (r *Reconciler) replace(ctx context.Context, desired, live *storagev1.StorageClass) (bool, error) {
	want := storageclass.Replacement(desired, live)
	probe := want.DeepCopy()
	probe.Name = ""
	prefix := want.Name
	if len(prefix) > 200 {
		prefix = prefix[:200]
	}
	probe.GenerateName = prefix + "-"
	if err := r.Client.Create(ctx, probe, client.DryRunAll, client.FieldOwner(r.FieldManager)); err != nil {
		return false, fmt.Errorf("replacement StorageClass %s rejected by the API server (dry-run create): %w", want.Name, err)
	}
	uid := live.UID
	if err := r.Client.Delete(ctx, live, client.Preconditions{UID: &uid}); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return false, fmt.Errorf("delete StorageClass %s for replacement: %w", want.Name, err)
	}
	var now storagev1.StorageClass
	err := r.APIReader.Get(ctx, types.NamespacedName{Name: want.Name}, &now)
	switch {
	case err == nil && now.UID == uid:
		return false, nil // still going away
	case err == nil:
		return false, fmt.Errorf("StorageClass %s was recreated by someone else during the replacement", want.Name)
	case !apierrors.IsNotFound(err):
		return false, err
	}
	// Apply what policy renders; the preserved default-class annotation goes back to the
	// manager that owned it, so a later apply does not remove it as a field Plinth dropped.
	du, err := render.ToUnstructured(desired)
	if err != nil {
		return false, err
	}
	if _, err := r.manager.Apply(ctx, du, ssa.DefaultApplyOptions()); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return false, nil
		}
		return false, fmt.Errorf("create replacement StorageClass %s: %w", want.Name, err)
	}
	if v, ok := want.Annotations[storageclass.DefaultClassAnnotation]; ok && desired.Annotations[storageclass.DefaultClassAnnotation] == "" {
		owner := annotationOwner(live, storageclass.DefaultClassAnnotation)
		p := []byte(fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, storageclass.DefaultClassAnnotation, v))
		created := &storagev1.StorageClass{}
		created.Name = want.Name
		if err := r.Client.Patch(ctx, created, client.RawPatch(types.MergePatchType, p), client.FieldOwner(owner)); err != nil {
			return false, fmt.Errorf("restore %s on StorageClass %s: %w", storageclass.DefaultClassAnnotation, want.Name, err)
		}
	}
	return true, nil
}

// annotationOwner returns the field manager that owns annotation key on obj, or
// "plinth-preserved" when none does.
func annotationOwner(obj client.Object, key string) string {
	needle := fmt.Sprintf("%q", "f:"+key)
	for _, mf := range obj.GetManagedFields() {
		if mf.FieldsV1 != nil && strings.Contains(string(mf.FieldsV1.Raw), needle) && mf.Manager != "" {
			return mf.Manager
		}
	}
	return "plinth-preserved"
}
