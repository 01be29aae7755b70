package policy

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/plinth-storage/plinth/controllers/render"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// IndexFields registers the cache indexes the reconciler lists by: PVCs and PVs by
// storageClassName and by the VolumeAttributesClasses they name, VolumeStates by storeName.
func IndexFields(ctx context.Context, mgr ctrl.Manager) error {
	fi := mgr.GetFieldIndexer()
	if err := fi.IndexField(ctx, &corev1.PersistentVolumeClaim{}, indexPVCClass, func(o client.Object) []string {
		if c := o.(*corev1.PersistentVolumeClaim).Spec.StorageClassName; c != nil && *c != "" {
			return []string{*c}
		}
		return nil
	}); err != nil {
		return err
	}
	if err := fi.IndexField(ctx, &corev1.PersistentVolume{}, indexPVClass, func(o client.Object) []string {
		if c := o.(*corev1.PersistentVolume).Spec.StorageClassName; c != "" {
			return []string{c}
		}
		return nil
	}); err != nil {
		return err
	}
	if err := fi.IndexField(ctx, &corev1.PersistentVolumeClaim{}, indexPVCAttrClass, func(o client.Object) []string {
		return claimAttributesClasses(o.(*corev1.PersistentVolumeClaim))
	}); err != nil {
		return err
	}
	if err := fi.IndexField(ctx, &corev1.PersistentVolume{}, indexPVAttrClass, func(o client.Object) []string {
		if c := o.(*corev1.PersistentVolume).Spec.VolumeAttributesClassName; c != nil && *c != "" {
			return []string{*c}
		}
		return nil
	}); err != nil {
		return err
	}
	return fi.IndexField(ctx, &storev1.VolumeState{}, indexVolumeStor, func(o client.Object) []string {
		if s := o.(*storev1.VolumeState).Spec.StoreName; s != "" {
			return []string{s}
		}
		return nil
	})
}

// The permissions the policy controller needs (RBAC markers, read by the manifests' checks).
//
// +kubebuilder:rbac:groups=policy.plinth.dev,resources=storagepools;protocols;placements,verbs=get;list;watch;patch;update
// +kubebuilder:rbac:groups=policy.plinth.dev,resources=storagepools/status;protocols/status;placements/status,verbs=get;patch;update
// +kubebuilder:rbac:groups=policy.plinth.dev,resources=placements/finalizers,verbs=update
// +kubebuilder:rbac:groups=storage.plinth.dev,resources=agents;stores,verbs=get;list;watch;create;patch;update;delete
// +kubebuilder:rbac:groups=storage.plinth.dev,resources=volumestates,verbs=get;list;watch
// +kubebuilder:rbac:groups=storage.plinth.dev,resources=agents/status;stores/status,verbs=get;patch
// +kubebuilder:rbac:groups=storage.k8s.io,resources=storageclasses,verbs=get;list;watch;create;patch;update;delete
// +kubebuilder:rbac:groups=snapshot.storage.k8s.io,resources=volumesnapshotclasses,verbs=get;list;watch;create;patch;update;delete
// +kubebuilder:rbac:groups=groupsnapshot.storage.k8s.io,resources=volumegroupsnapshotclasses,verbs=get;list;watch;create;patch;update;delete
// +kubebuilder:rbac:groups=storage.k8s.io,resources=volumeattributesclasses,verbs=get;list;watch;create;patch;update;delete
// +kubebuilder:rbac:groups="",resources=nodes;persistentvolumeclaims;persistentvolumes,verbs=get;list;watch
// +kubebuilder:rbac:groups="",namespace=plinth-system,resources=configmaps,verbs=get;create;patch;update
// +kubebuilder:rbac:groups="",namespace=plinth-system,resources=secrets,verbs=get;list;watch;create;update;delete
// +kubebuilder:rbac:groups=coordination.k8s.io,namespace=plinth-system,resources=leases,verbs=get;create;update
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=kustomize.toolkit.fluxcd.io,resources=kustomizations,verbs=get
// +kubebuilder:rbac:groups=argoproj.io,resources=applications,verbs=get
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create

// SetupWithManager registers the indexes and the controller: every watched event enqueues
// the one policy-set request, so bursts collapse into one reconcile.
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	if err := IndexFields(ctx, mgr); err != nil {
		return err
	}
	one := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: RequestName}}}
	})
	// Policy objects: spec (generation), labels, annotations (revision), finalizers and
	// deletion; not our own status writes.
	policyChanged := builder.WithPredicates(predicate.Or(predicate.GenerationChangedPredicate{},
		predicate.LabelChangedPredicate{}, predicate.AnnotationChangedPredicate{}, finalizersChanged{}))
	owned := builder.WithPredicates(managedByPlinth{})
	createDelete := builder.WithPredicates(predicate.Funcs{
		UpdateFunc: func(event.UpdateEvent) bool { return false },
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("policy").
		WithOptions(controller.Options{MaxConcurrentReconciles: 1, SkipNameValidation: &r.SkipNameValidation}).
		Watches(&policyv1.StoragePool{}, one, policyChanged).
		Watches(&policyv1.Protocol{}, one, policyChanged).
		Watches(&policyv1.Placement{}, one, policyChanged).
		Watches(&corev1.Node{}, one, builder.WithPredicates(predicate.Or(predicate.LabelChangedPredicate{}, createDeleteOnly()))).
		Watches(&storagev1.StorageClass{}, one, owned).
		Watches(&storagev1.VolumeAttributesClass{}, one, owned).
		Watches(&storev1.Agent{}, one, builder.WithPredicates(managedByPlinth{}, predicate.GenerationChangedPredicate{})).
		Watches(&storev1.Store{}, one, owned).
		Watches(&corev1.PersistentVolumeClaim{}, one, createDelete).
		Watches(&storev1.VolumeState{}, one, createDelete).
		Complete(r)
}

func createDeleteOnly() predicate.Predicate {
	return predicate.Funcs{UpdateFunc: func(event.UpdateEvent) bool { return false }}
}

// managedByPlinth passes events of objects labelled app.kubernetes.io/managed-by=plinth
// (before or after the change, so removing the label by hand is seen too).
type managedByPlinth struct{ predicate.Funcs }

func ours(o client.Object) bool {
	return o != nil && o.GetLabels()[policyv1.LabelManagedBy] == render.ManagedBy
}

func (managedByPlinth) Create(e event.CreateEvent) bool   { return ours(e.Object) }
func (managedByPlinth) Delete(e event.DeleteEvent) bool   { return ours(e.Object) }
func (managedByPlinth) Generic(e event.GenericEvent) bool { return ours(e.Object) }
func (managedByPlinth) Update(e event.UpdateEvent) bool {
	return ours(e.ObjectOld) || ours(e.ObjectNew)
}

// finalizersChanged passes updates that change finalizers or set the deletion timestamp.
type finalizersChanged struct{ predicate.Funcs }

func (finalizersChanged) Update(e event.UpdateEvent) bool {
	if e.ObjectOld == nil || e.ObjectNew == nil {
		return false
	}
	if e.ObjectOld.GetDeletionTimestamp().IsZero() != e.ObjectNew.GetDeletionTimestamp().IsZero() {
		return true
	}
	a, b := e.ObjectOld.GetFinalizers(), e.ObjectNew.GetFinalizers()
	if len(a) != len(b) {
		return true
	}
	for i := range a {
		if a[i] != b[i] {
			return true
		}
	}
	return false
}

// claimAttributesClasses are the VolumeAttributesClasses claim c names
// (policyv1.ClaimAttributesClasses).
func claimAttributesClasses(c *corev1.PersistentVolumeClaim) []string {
	var target string
	if m := c.Status.ModifyVolumeStatus; m != nil {
		target = m.TargetVolumeAttributesClassName
	}
	return policyv1.ClaimAttributesClasses(c.Spec.VolumeAttributesClassName, c.Status.CurrentVolumeAttributesClassName, target)
}
