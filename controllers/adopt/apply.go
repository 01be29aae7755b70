package adopt

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// FieldManager is the field manager of the objects adopt creates.
const FieldManager = "plinth-adopt"

// Result is what Apply did for one adoption.
type Result struct {
	Claim    string `json:"claim"`
	VolumeID string `json:"volumeID"`
	// Ready is true when the agent reported the adopted VolumeState Ready in time.
	Ready bool `json:"ready"`
	// Error is why the adoption is not done ("" when it is).
	Error string `json:"error,omitempty"`
}

// Apply does plan p: for each adoption, creates its VolumeState (the agent admits it as the
// volume's next lifecycle: see storev1.AnnotationAdoptedFrom), then its pre-bound PV, then
// waits at most readyTimeout for every VolumeState to be Ready. An object that exists already
// is left as it is (a second Apply of the same plan creates nothing). Nothing is written for
// ambiguous, orphan or missing entries. The error is for the API server; per-volume failures
// are in the results.
func Apply(ctx context.Context, c client.Client, p *Plan, readyTimeout time.Duration) ([]Result, error) {
	res := make([]Result, len(p.Adopt))
	for i, a := range p.Adopt {
		res[i] = Result{Claim: a.Claim, VolumeID: a.VolumeID}
		if err := c.Create(ctx, a.VolumeState.DeepCopy(), client.FieldOwner(FieldManager)); err != nil && !apierrors.IsAlreadyExists(err) {
			res[i].Error = fmt.Sprintf("create VolumeState: %v", err)
			continue
		}
		if a.PersistentVolume != nil {
			if err := c.Create(ctx, a.PersistentVolume.DeepCopy(), client.FieldOwner(FieldManager)); err != nil && !apierrors.IsAlreadyExists(err) {
				res[i].Error = fmt.Sprintf("create PV: %v", err)
			}
		}
	}
	err := wait.PollUntilContextTimeout(ctx, time.Second, readyTimeout, true, func(ctx context.Context) (bool, error) {
		all := true
		for i := range res {
			if res[i].Ready || res[i].Error != "" {
				continue
			}
			var vs storev1.VolumeState
			if err := c.Get(ctx, client.ObjectKey{Name: res[i].VolumeID}, &vs); err != nil {
				if apierrors.IsNotFound(err) {
					return false, err
				}
				all = false
				continue
			}
			if vs.Status.Phase == storev1.VolumeReady && vs.Status.ObservedGeneration == vs.Generation {
				res[i].Ready = true
			} else {
				all = false
			}
		}
		return all, nil
	})
	if err != nil {
		for i := range res {
			if !res[i].Ready && res[i].Error == "" {
				res[i].Error = "VolumeState not Ready in time: see its conditions (kubectl get volumestate " + res[i].VolumeID + " -o yaml)"
			}
		}
		if ctx.Err() != nil {
			return res, ctx.Err()
		}
	}
	return res, nil
}
