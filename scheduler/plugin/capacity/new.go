package capacity

import (
	"context"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// Resources the plugin watches, as GroupVersionResources and as the scheduler's event
// resource names (<plural>.<version>.<group>, which makes the scheduler run a dynamic
// informer to requeue pods this plugin rejected).
var (
	storesGVR     = storev1.GroupVersion.WithResource("stores")
	placementsGVR = policyv1.GroupVersion.WithResource("placements")
	protocolsGVR  = policyv1.GroupVersion.WithResource("protocols")
)

func eventResource(gvr schema.GroupVersionResource) fwk.EventResource {
	return fwk.EventResource(gvr.Resource + "." + gvr.Version + "." + gvr.Group)
}

// New is the plugin factory (k8s.io/kubernetes/pkg/scheduler/framework/runtime.PluginFactory).
// It decodes Args, starts dynamic informers on Stores, Placements and Protocols with the
// scheduler's kubeconfig (they stop with ctx), and uses the scheduler's shared informers for
// PVCs, PVs and StorageClasses (the scheduler syncs those before it schedules). It waits up
// to CacheSyncTimeout for its own informers: a pod rejected for an unsynced cache would wait
// for a Store, Placement or Protocol event that the initial list has already delivered. Past
// the timeout (no CRDs yet, an unreachable API server) it starts anyway, and PreFilter
// answers an error for pods with claims until the caches sync: the scheduler retries those
// with backoff, without waiting for an event.
func New(ctx context.Context, obj runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
	args, err := decodeArgs(obj)
	if err != nil {
		return nil, err
	}
	dc, err := dynamic.NewForConfig(h.KubeConfig())
	if err != nil {
		return nil, fmt.Errorf("%s: dynamic client: %w", Name, err)
	}
	f := h.SharedInformerFactory()
	p := &Plugin{
		args:      args,
		cache:     newView(time.Duration(args.ReservationTimeoutSeconds) * time.Second),
		pvcs:      f.Core().V1().PersistentVolumeClaims().Lister(),
		pvs:       f.Core().V1().PersistentVolumes().Lister(),
		pods:      f.Core().V1().Pods().Lister(),
		classes:   f.Storage().V1().StorageClasses().Lister(),
		nodeLabel: storev1.NameLabelValue,
	}
	if snap := h.SnapshotSharedLister(); snap != nil {
		p.nodeGone = func(node string) bool {
			_, err := snap.NodeInfos().Get(node)
			return err != nil
		}
	}
	logger := klog.FromContext(ctx)
	pvcInformer := f.Core().V1().PersistentVolumeClaims().Informer()
	if _, err := pvcInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { p.onClaim(o) },
		UpdateFunc: func(_, o any) { p.onClaim(o) },
		DeleteFunc: func(o any) {
			if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = t.Obj
			}
			if pvc, ok := o.(*corev1.PersistentVolumeClaim); ok {
				p.cache.claimDeleted(pvc.Namespace + "/" + pvc.Name)
			}
		},
	}); err != nil {
		return nil, err
	}
	f.Core().V1().PersistentVolumes().Informer()
	f.Storage().V1().StorageClasses().Informer()

	df := dynamicinformer.NewDynamicSharedInformerFactory(dc, 0)
	synced := []cache.InformerSynced{pvcInformer.HasSynced}
	watch := func(gvr schema.GroupVersionResource, upsert func(*unstructured.Unstructured), del func(*unstructured.Unstructured)) error {
		inf := df.ForResource(gvr).Informer()
		synced = append(synced, inf.HasSynced)
		_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(o any) { withUnstructured(o, upsert) },
			UpdateFunc: func(_, o any) { withUnstructured(o, upsert) },
			DeleteFunc: func(o any) { withUnstructured(o, del) },
		})
		return err
	}
	convert := func(u *unstructured.Unstructured, into any) bool {
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, into); err != nil {
			logger.Error(err, "Ignoring malformed object", "kind", u.GetKind(), "name", u.GetName())
			return false
		}
		return true
	}
	if err := watch(storesGVR, func(u *unstructured.Unstructured) {
		var st storev1.Store
		if convert(u, &st) {
			p.cache.upsertStore(&st)
		}
	}, func(u *unstructured.Unstructured) {
		var st storev1.Store
		if convert(u, &st) {
			p.cache.deleteStore(&st)
		}
	}); err != nil {
		return nil, err
	}
	if err := watch(placementsGVR, func(u *unstructured.Unstructured) {
		var pl policyv1.Placement
		if convert(u, &pl) {
			s := pl.Spec.Strategy
			if s == "" {
				s = policyv1.StrategyBinpack // the CRD default
			}
			p.cache.setStrategy(pl.Name, s, pl.Spec.Overrides != nil && slices.Contains(pl.Spec.Overrides.Allowed, policyv1.OverrideStrategy))
		}
	}, func(u *unstructured.Unstructured) { p.cache.deleteStrategy(u.GetName()) }); err != nil {
		return nil, err
	}
	if err := watch(protocolsGVR, func(u *unstructured.Unstructured) {
		var pr policyv1.Protocol
		if convert(u, &pr) {
			p.cache.setProtocol(pr.Name, protocolKind(&pr))
		}
	}, func(u *unstructured.Unstructured) { p.cache.deleteProtocol(u.GetName()) }); err != nil {
		return nil, err
	}
	p.synced = func() bool {
		for _, s := range synced {
			if !s() {
				return false
			}
		}
		return true
	}
	df.Start(ctx.Done())
	syncCtx, cancel := context.WithTimeout(ctx, CacheSyncTimeout)
	defer cancel()
	if !cache.WaitForCacheSync(syncCtx.Done(), synced[1:]...) { // [0] is the scheduler's PVC informer, not started yet
		logger.Info("Store, Placement and Protocol caches not synced yet; pods with claims are retried until they are", "waited", CacheSyncTimeout)
	}
	go p.expireLoop(ctx)
	return p, nil
}

// CacheSyncTimeout bounds how long New waits for the Store, Placement and Protocol caches.
const CacheSyncTimeout = 30 * time.Second

func protocolKind(pr *policyv1.Protocol) protoKind {
	switch {
	case pr.Spec.NVMeoFTCP != nil:
		return protoNVMeoF
	case pr.Spec.Local != nil:
		return protoLocal
	}
	return protoUnknown
}

func withUnstructured(o any, fn func(*unstructured.Unstructured)) {
	if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = t.Obj
	}
	if u, ok := o.(*unstructured.Unstructured); ok {
		fn(u)
	}
}

func (p *Plugin) onClaim(o any) {
	if pvc, ok := o.(*corev1.PersistentVolumeClaim); ok && pvc.Spec.VolumeName != "" {
		p.cache.claimBound(pvc.Namespace + "/" + pvc.Name)
	}
}

// EventsToRegister lists what may make a pod this plugin rejected schedulable: Store
// capacity reported or changed, Placements and Protocols appearing, new nodes or node
// labels (the NVMe-oF initiator label, a spreadAcross label), new claims and classes, pods
// leaving or being un-assumed (their bookings are released, a workload's counts per domain
// drop), and pods assigned to a node (a workload's least-loaded domain may have filled up,
// letting the others take the next volume).
func (p *Plugin) EventsToRegister(context.Context) ([]fwk.ClusterEventWithHint, error) {
	return []fwk.ClusterEventWithHint{
		{Event: fwk.ClusterEvent{Resource: eventResource(storesGVR), ActionType: fwk.Add | fwk.Update}},
		{Event: fwk.ClusterEvent{Resource: eventResource(placementsGVR), ActionType: fwk.Add | fwk.Update}},
		{Event: fwk.ClusterEvent{Resource: eventResource(protocolsGVR), ActionType: fwk.Add | fwk.Update}},
		{Event: fwk.ClusterEvent{Resource: fwk.Node, ActionType: fwk.Add | fwk.UpdateNodeLabel}},
		{Event: fwk.ClusterEvent{Resource: fwk.PersistentVolumeClaim, ActionType: fwk.Add | fwk.Update}},
		{Event: fwk.ClusterEvent{Resource: fwk.StorageClass, ActionType: fwk.Add}},
		{Event: fwk.ClusterEvent{Resource: fwk.Pod, ActionType: fwk.Delete}},
		{Event: fwk.ClusterEvent{Resource: fwk.AssignedPod, ActionType: fwk.Add}},
	}, nil
}
