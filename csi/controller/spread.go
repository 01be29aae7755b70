package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/csi/internal/volume"
	"github.com/plinth-storage/plinth/internal/failpoint"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// Spreading the NVMe-oF volumes of one workload across a node label (Placement spreadAcross;
// docs/design.md, "Spreading remote volumes"). The workload of a claim is the project's one
// definition (the scheduler plugin's workloadOf): the pods of one controller; a claim is
// mapped to it without its pod, which with Immediate binding may not exist yet.
//
// +kubebuilder:rbac:groups="",resources=persistentvolumeclaims,verbs=get
// +kubebuilder:rbac:groups="",resources=pods,verbs=get
// +kubebuilder:rbac:groups=apps,resources=statefulsets,verbs=get;list

// workload names the workload of a claim: uid labels its VolumeStates
// (policyv1.LabelWorkload), what names it in messages ("StatefulSet ns/web").
type workload struct {
	uid, what string
}

// workloadOfClaim maps the claim pvc (metadata read by claimMeta) to its workload:
//   - a claim owned by a StatefulSet (persistentVolumeClaimRetentionPolicy Delete) is the
//     StatefulSet's;
//   - a claim of a StatefulSet's volumeClaimTemplate (name <template>-<set>-<ordinal>,
//     labels carrying the set's selector: what the StatefulSet controller makes) is the set's;
//   - a generic ephemeral volume's claim (controlled by its Pod) is the workload of the pod:
//     its controller's, or the pod's own;
//   - any other claim is a workload of its own.
//
// Errors are ErrUnavailable (the API server did not answer).
func (s *Service) workloadOfClaim(ctx context.Context, pvc *metav1.PartialObjectMetadata) (workload, error) {
	ns := pvc.Namespace
	// The StatefulSet controller's owner reference (retention policy Delete) is not marked as
	// controller in every Kubernetes version: any one names the set.
	for _, ref := range pvc.OwnerReferences {
		if ref.Kind == "StatefulSet" && strings.HasPrefix(ref.APIVersion, "apps/") {
			return workload{string(ref.UID), "StatefulSet " + ns + "/" + ref.Name}, nil
		}
	}
	if ref := metav1.GetControllerOf(pvc); ref != nil {
		switch {
		case ref.Kind == "Pod" && ref.APIVersion == "v1":
			var pod corev1.Pod
			if err := s.live.Get(ctx, client.ObjectKey{Namespace: ns, Name: ref.Name}, &pod); err != nil {
				return workload{}, volume.Errorf(volume.ErrUnavailable, "read Pod %s/%s of PVC %s: %v", ns, ref.Name, pvc.Name, err)
			}
			if c := metav1.GetControllerOf(&pod); c != nil {
				return workload{string(c.UID), c.Kind + " " + ns + "/" + c.Name}, nil
			}
			return workload{string(pod.UID), "Pod " + ns + "/" + pod.Name}, nil
		}
	}
	var sets appsv1.StatefulSetList
	if err := s.live.List(ctx, &sets, client.InNamespace(ns)); err != nil {
		return workload{}, volume.Errorf(volume.ErrUnavailable, "list StatefulSets of %s: %v", ns, err)
	}
	for i := range sets.Items {
		if set := &sets.Items[i]; claimOfSet(pvc, set) {
			return workload{string(set.UID), "StatefulSet " + ns + "/" + set.Name}, nil
		}
	}
	return workload{string(pvc.UID), "PVC " + ns + "/" + pvc.Name}, nil
}

// claimOfSet says whether pvc is one the StatefulSet controller makes from a
// volumeClaimTemplate of set: named <template>-<set>-<ordinal> and labelled with the set's
// selector (k8s.io/kubernetes pkg/controller/statefulset, getPersistentVolumeClaims).
func claimOfSet(pvc *metav1.PartialObjectMetadata, set *appsv1.StatefulSet) bool {
	if set.Spec.Selector == nil || !labels.SelectorFromSet(set.Spec.Selector.MatchLabels).Matches(labels.Set(pvc.Labels)) {
		return false
	}
	for _, t := range set.Spec.VolumeClaimTemplates {
		rest, ok := strings.CutPrefix(pvc.Name, t.Name+"-"+set.Name+"-")
		if !ok {
			continue
		}
		if n, err := strconv.Atoi(rest); err == nil && n >= 0 && strconv.Itoa(n) == rest {
			return true
		}
	}
	return false
}

// workloadLocks serialises the store choice and the VolumeState create of one workload's
// spread volumes: the provisioner creates a StatefulSet's claims in parallel, and two creates
// that counted the same VolumeStates would both pick the least-loaded domain. The zero value
// is ready. One controller replica provisions at a time (the provisioner's leader election),
// so a lock in this process covers every create.
type workloadLocks struct {
	mu   sync.Mutex
	held map[string]*workloadLock // by workload uid, while some create holds or wants it
}

type workloadLock struct {
	token chan struct{} // cap 1: full while held
	users int           // holders and waiters; the entry goes with the last
}

// lock takes the lock of uid, waiting while another create holds it (a waiter hits
// failpoint CSICreateSpreadQueued first). Errors: ErrTimeout when ctx ends first.
func (l *workloadLocks) lock(ctx context.Context, uid string) (unlock func(), err error) {
	l.mu.Lock()
	if l.held == nil {
		l.held = map[string]*workloadLock{}
	}
	w, ok := l.held[uid]
	if !ok {
		w = &workloadLock{token: make(chan struct{}, 1)}
		l.held[uid] = w
	}
	w.users++
	l.mu.Unlock()
	done := func() {
		l.mu.Lock()
		if w.users--; w.users == 0 {
			delete(l.held, uid)
		}
		l.mu.Unlock()
	}
	select {
	case w.token <- struct{}{}:
	default:
		failpoint.Hit(failpoint.CSICreateSpreadQueued)
		select {
		case w.token <- struct{}{}:
		case <-ctx.Done():
			done()
			return nil, volume.Errorf(volume.ErrTimeout, "waiting for another CreateVolume of the same workload: %v", ctx.Err())
		}
	}
	return func() { <-w.token; done() }, nil
}

// spread is the spreadAcross constraint of one CreateVolume: the domains (values of key on
// the Nodes of the pool's Stores) and how many of the workload's volumes of the placement
// each holds.
type spread struct {
	key, placement string
	workload       workload
	// counts holds every eligible domain (a Store that reported capacity and is not
	// draining sits on a Node with the label), 0 included.
	counts map[string]int
	// domainOf maps a Store name to its domain ("" when its Node lacks the label).
	domainOf map[string]string
}

// countSpread fills sp for a new volume among stores (the pool's): eligible domains as the
// scheduler plugin counts them (a full Store still makes its domain eligible), and the
// workload's VolumeStates of the placement per domain, listed from the API server (not the
// cache: the create before this one, under the same lock, must be counted). A VolumeState
// being deleted no longer counts. Errors are ErrUnavailable.
func (s *Service) countSpread(ctx context.Context, sp *spread, stores []storev1.Store) error {
	sp.counts, sp.domainOf = map[string]int{}, map[string]string{}
	nodeDomain := map[string]string{}
	domain := func(node string) (string, bool) {
		if v, ok := nodeDomain[node]; ok {
			return v, v != ""
		}
		var n corev1.Node
		if err := s.kube.Get(ctx, client.ObjectKey{Name: node}, &n); err != nil {
			nodeDomain[node] = ""
			return "", false
		}
		v, ok := n.Labels[sp.key]
		if !ok {
			v = ""
		}
		nodeDomain[node] = v
		return v, ok
	}
	for i := range stores {
		st := &stores[i]
		v, ok := domain(st.Spec.NodeName)
		if !ok {
			continue
		}
		sp.domainOf[st.Name] = v
		if _, seen := sp.counts[v]; !seen && st.Status.Capacity != nil && !st.IsDraining() {
			sp.counts[v] = 0
		}
	}
	var vss storev1.VolumeStateList
	if err := s.live.List(ctx, &vss, client.MatchingLabels{policyv1.LabelWorkload: sp.workload.uid}); err != nil {
		return volume.Errorf(volume.ErrUnavailable, "list VolumeStates of %s: %v", sp.workload.what, err)
	}
	for i := range vss.Items {
		vs := &vss.Items[i]
		if vs.DeletionTimestamp != nil || vs.Spec.Policy.Placement != sp.placement {
			continue
		}
		v, ok := sp.domainOf[vs.Spec.StoreName]
		if !ok { // a Store outside the pool's list (the Placement's pool changed)
			var st storev1.Store
			if err := s.kube.Get(ctx, client.ObjectKey{Name: vs.Spec.StoreName}, &st); err != nil {
				continue
			}
			if v, ok = domain(st.Spec.NodeName); !ok {
				continue
			}
		}
		if _, eligible := sp.counts[v]; eligible {
			sp.counts[v]++
		}
	}
	return nil
}

// leastLoaded returns the Stores of stores in the domains holding the fewest of the
// workload's volumes (at most one apart after this one lands there), and the domains by name.
func (sp *spread) leastLoaded(stores []storev1.Store) ([]storev1.Store, []string) {
	least := -1
	for _, c := range sp.counts {
		if least < 0 || c < least {
			least = c
		}
	}
	var out []storev1.Store
	var domains []string
	for v, c := range sp.counts {
		if c == least {
			domains = append(domains, v)
		}
	}
	slices.Sort(domains)
	for _, st := range stores {
		if v, ok := sp.domainOf[st.Name]; ok && slices.Contains(domains, v) {
			out = append(out, st)
		}
	}
	return out, domains
}

// describe is the counts for messages: "zone=a: 2, zone=b: 1".
func (sp *spread) describe() string {
	var vs []string
	for v, c := range sp.counts {
		vs = append(vs, fmt.Sprintf("%s=%s: %d", sp.key, v, c))
	}
	slices.Sort(vs)
	return strings.Join(vs, ", ")
}

// spreadStore chooses the store of a spread NVMe-oF volume among stores (the pool's): counted
// by countSpread, restricted to the least-loaded domains, then ordered as chooseStore orders
// any NVMe-oF volume (strategy, capacity). Stores on Nodes without the label take none of
// these volumes. No eligible domain, or no room in the least-loaded ones, is
// ErrInsufficientCapacity naming the counts: the volume waits rather than doubling up in a
// domain that already holds more (maxSkew 1, as plinth-scheduler does for local volumes).
func (s *Service) spreadStore(ctx context.Context, sp *spread, stores []storev1.Store, strategy policyv1.Strategy, req *csipb.TopologyRequirement, required, limit int64) (*storev1.Store, int64, error) {
	if err := s.countSpread(ctx, sp, stores); err != nil {
		return nil, 0, err
	}
	if len(sp.counts) == 0 {
		return nil, 0, volume.Errorf(volume.ErrInsufficientCapacity,
			"Placement %s spreads across %s, but no Store of its pool that reported capacity is on a Node with that label", sp.placement, sp.key)
	}
	least, domains := sp.leastLoaded(stores)
	store, size, err := chooseStore(least, true, strategy, req, required, limit)
	if errors.Is(err, volume.ErrInsufficientCapacity) {
		return nil, 0, volume.Errorf(volume.ErrInsufficientCapacity,
			"volumes of %s would not stay spread across %s: the least-loaded %s (counts %s) have no Store with %d bytes available",
			sp.workload.what, sp.key, strings.Join(domains, ", "), sp.describe(), required)
	}
	if err != nil {
		return nil, 0, err
	}
	failpoint.Hit(failpoint.CSICreateSpreadCounted)
	return store, size, nil
}
