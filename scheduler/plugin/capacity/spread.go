package capacity

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	fwk "k8s.io/kube-scheduler/framework"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
)

// Reasons the spreadAcross part of Filter reports (first words of the status message).
const (
	// FilterReasonNoSpreadLabel: the node lacks the label a Placement spreads across; it can
	// never take a volume of that Placement (UnschedulableAndUnresolvable).
	FilterReasonNoSpreadLabel = "node lacks the label its volumes spread across"
	// FilterReasonSpreadSkew: the node's domain already holds more of the workload's volumes
	// of the Placement than the least-loaded domain (Unschedulable: it may change when the
	// workload's pods go or another domain fills up).
	FilterReasonSpreadSkew = "volumes of this workload would not stay spread"
)

// spreadDemand is one spread constraint of the pod: the pod's unbound claims of one
// Placement whose StorageClass carries plinth.dev/spread-across.
type spreadDemand struct {
	placement string
	key       string // node label key
	poolKey   string // plinth.dev/pool label value of the placement's pool
	pool      string
	// counts holds, per value of key, the workload's volumes of the placement already there
	// (bound, or booked by a pod in flight); every eligible domain has an entry, 0 included.
	counts map[string]int
	// min is the smallest count over the eligible domains (-1: no eligible domain).
	min int
}

// workloadOf returns the UID that names a pod's workload: its controller owner's (the
// StatefulSet, ReplicaSet, Job...), or the pod's own when it has none.
func workloadOf(pod *corev1.Pod) types.UID {
	if ref := metav1.GetControllerOf(pod); ref != nil {
		return ref.UID
	}
	return pod.UID
}

// spreadOfClass returns the Placement and label key of a Plinth StorageClass that spreads
// its volumes (parameter plinth.dev/spread-across), or ok false.
func (p *Plugin) spreadOfClass(class string) (placement, key string, ok bool) {
	if class == "" {
		return "", "", false
	}
	sc, err := p.classes.Get(class)
	if err != nil || sc.Provisioner != policyv1.DriverName {
		return "", "", false
	}
	key = sc.Parameters[policyv1.ParamSpreadAcross]
	return sc.Parameters[policyv1.ParamPlacement], key, key != ""
}

// claimSpread returns a claim and whether its StorageClass is of placement and spreads
// across key.
func (p *Plugin) claimSpread(namespace, claim, placement, key string) (*corev1.PersistentVolumeClaim, bool) {
	pvc, err := p.pvcs.PersistentVolumeClaims(namespace).Get(claim)
	if err != nil || pvc.Spec.StorageClassName == nil {
		return nil, false
	}
	pl, k, ok := p.spreadOfClass(*pvc.Spec.StorageClassName)
	return pvc, ok && pl == placement && k == key
}

// countSpread fills d.counts and d.min for pod. Domains are the values of d.key on the
// nodes the pod may use (its nodeSelector and required node affinity) that have a Store of
// the pool able to take volumes (reported, consistent, not draining): a zone without such a
// node can hold none of the volumes and must not hold the others back. A full Store still
// makes its domain eligible, as a topologySpreadConstraint counts a full zone.
//
// Counted are the volumes of the placement of the pod's siblings (same namespace and
// workload): a sibling in the scheduler's snapshot (bound, or assumed while its volumes are
// being provisioned) counts each such claim on the node of its bound PV, or on the sibling's
// node while unbound; a sibling not in the snapshot (pending again) counts its bound claims
// on their PVs' nodes. Each claim counts once.
func (p *Plugin) countSpread(pod *corev1.Pod, nodes []fwk.NodeInfo, d *spreadDemand) {
	required := nodeaffinity.GetRequiredNodeAffinity(pod)
	domainOf := make(map[string]string, len(nodes)) // node name → label value
	d.counts = map[string]int{}
	p.cache.mu.RLock()
	for _, ni := range nodes {
		n := ni.Node()
		if n == nil {
			continue
		}
		v, ok := n.Labels[d.key]
		if !ok {
			continue
		}
		domainOf[n.Name] = v
		if _, eligible := d.counts[v]; eligible {
			continue
		}
		if match, _ := required.Match(n); !match {
			continue
		}
		if s, ok := p.cache.pools[d.poolKey][p.nodeLabel(n.Name)]; ok && s.hasStore && s.state == capOK {
			d.counts[v] = 0
		}
	}
	p.cache.mu.RUnlock()

	workload := workloadOf(pod)
	counted := map[string]bool{} // claim names
	count := func(node string) {
		// Volumes in a domain without an eligible node do not make it eligible.
		if v, ok := domainOf[node]; ok {
			if _, eligible := d.counts[v]; eligible {
				d.counts[v]++
			}
		}
	}
	sibling := func(q *corev1.Pod) bool {
		return q.Namespace == pod.Namespace && q.UID != pod.UID && workloadOf(q) == workload
	}
	inSnapshot := map[types.UID]bool{}
	for _, ni := range nodes {
		n := ni.Node()
		if n == nil {
			continue
		}
		for _, pi := range ni.GetPods() {
			q := pi.GetPod()
			if !sibling(q) {
				continue
			}
			inSnapshot[q.UID] = true
			claimNames(q, func(name string) bool {
				if counted[name] {
					return true
				}
				pvc, ok := p.claimSpread(q.Namespace, name, d.placement, d.key)
				if !ok {
					return true
				}
				counted[name] = true
				node := n.Name
				if pvc.Spec.VolumeName != "" {
					if bn := p.boundNode(pvc.Spec.VolumeName); bn != "" {
						node = bn
					}
				}
				count(node)
				return true
			})
		}
	}
	if p.pods != nil {
		siblings, _ := p.pods.Pods(pod.Namespace).List(labels.Everything())
		for _, q := range siblings {
			if inSnapshot[q.UID] || !sibling(q) {
				continue
			}
			claimNames(q, func(name string) bool {
				if counted[name] {
					return true
				}
				pvc, ok := p.claimSpread(q.Namespace, name, d.placement, d.key)
				if !ok || pvc.Spec.VolumeName == "" {
					return true
				}
				if bn := p.boundNode(pvc.Spec.VolumeName); bn != "" {
					counted[name] = true
					count(bn)
				}
				return true
			})
		}
	}
	d.min = -1
	for _, c := range d.counts {
		if d.min < 0 || c < d.min {
			d.min = c
		}
	}
}

// filterSpread checks the pod's spread constraints on node: the node must carry each key,
// and its domain must hold no more of the workload's volumes of the placement than the
// least-loaded eligible domain (for one volume per pod this is maxSkew 1: after placing,
// no domain holds more than one volume above another).
func filterSpread(spreads []spreadDemand, node *corev1.Node) *fwk.Status {
	for i := range spreads {
		d := &spreads[i]
		v, ok := node.Labels[d.key]
		if !ok {
			return fwk.NewStatus(fwk.UnschedulableAndUnresolvable,
				fmt.Sprintf("%s (Placement %s spreads across %s)", FilterReasonNoSpreadLabel, d.placement, d.key))
		}
		if c := d.counts[v]; d.min >= 0 && c > d.min {
			return fwk.NewStatus(fwk.Unschedulable,
				fmt.Sprintf("%s (Placement %s spreads across %s: %s=%s holds %d of the workload's volumes, %s holds %d)",
					FilterReasonSpreadSkew, d.placement, d.key, d.key, v, c, leastLoaded(d), d.min))
		}
	}
	return nil
}

// leastLoaded names the least-loaded domains of d ("zone=a" or "zone=a, zone=b", at most 3).
func leastLoaded(d *spreadDemand) string {
	var vs []string
	for v, c := range d.counts {
		if c == d.min {
			vs = append(vs, d.key+"="+v)
		}
	}
	slices.Sort(vs)
	if len(vs) > 3 {
		vs = append(vs[:3], "...")
	}
	return strings.Join(vs, ", ")
}
