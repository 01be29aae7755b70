package capacity

import (
	"math"
	"slices"

	fwk "k8s.io/kube-scheduler/framework"

	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// capState says whether a Store's reported capacity can be used.
type capState uint8

const (
	capOK          capState = iota // capacity reported and consistent
	capMissing                     // status.capacity absent: the agent never reported
	capInvalid                     // a negative number, or allocatable > total
	capNoRoom                      // allocatable is 0 bytes: nothing can ever be provisioned
	capStoreAbsent                 // no Store of the pool on the node
	capDraining                    // the Store left the policy and takes no new volumes
)

// Reasons the Filter reports, one per capState, so an operator can tell a node without an
// agent from a broken report from a full store. They are the first words of the
// status message; FilterReason* constants are stable for tests and docs.
const (
	FilterReasonNoStore       = "no Store of the pool on this node"
	FilterReasonNoCapacity    = "Store has not reported capacity"
	FilterReasonBadCapacity   = "Store reports invalid capacity"
	FilterReasonNoAllocatable = "Store has 0 allocatable bytes"
	FilterReasonInsufficient  = "not enough free capacity in the pool"
	FilterReasonNoInitiator   = "node is not an NVMe-oF initiator"
	FilterReasonDraining      = "Store takes no new volume (draining: its node left the pool's policy, or evacuated: the pool lists it in evacuateNodes)"
)

// classify checks a Store: draining (annotation plinth.dev/draining, or spec.evacuate) first, then its
// status.capacity. Thin pools may report available above allocatable (overcommit), so that is
// not an inconsistency.
func classify(st *storev1.Store) capState {
	c := st.Status.Capacity
	switch {
	case st.IsDraining():
		return capDraining
	case c == nil:
		return capMissing
	case c.Total < 0 || c.Allocatable < 0 || c.Provisioned < 0 || c.Available < 0 || c.Allocatable > c.Total:
		return capInvalid
	case c.Allocatable == 0:
		return capNoRoom
	}
	return capOK
}

func (s capState) reason() string {
	switch s {
	case capMissing:
		return FilterReasonNoCapacity
	case capInvalid:
		return FilterReasonBadCapacity
	case capNoRoom:
		return FilterReasonNoAllocatable
	case capStoreAbsent:
		return FilterReasonNoStore
	case capDraining:
		return FilterReasonDraining
	}
	return ""
}

// free returns the bytes a new volume may take: available minus what pods in flight have
// booked, never below 0.
func free(available, reserved int64) int64 {
	if reserved >= available {
		return 0
	}
	return available - reserved
}

// fits is the byte-exact test (no GiB rounding): a request equal to the free bytes fits, one byte
// more does not; a zero request always fits.
func fits(available, reserved, request int64) bool {
	return request <= free(available, reserved)
}

// addSat adds two non-negative byte counts, saturating at MaxInt64 instead of wrapping.
func addSat(a, b int64) int64 {
	if b > 0 && a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// scoreHoldsVolumes is the raw score of a node that already holds the pod's bound
// volumes: NormalizeScore gives it MaxNodeScore whatever the strategy.
const scoreHoldsVolumes = -1

// normalize maps raw scores (free bytes left on the node after the pod's volumes, or
// scoreHoldsVolumes) to MinNodeScore..MaxNodeScore in place. Spreadout gives the most free
// bytes the top score, Binpack the fewest. Targets are linear in bytes between the smallest
// and largest raw value; then, walking the distinct raw values in order, each gets at least
// one point more than the previous, so nodes with different free bytes get different scores
// whenever there are at most 101 distinct values (what TopoLVM's log2-of-GiB lost);
// with more, scores are still monotonic. One value only (or all equal): everyone gets the
// top score, so the plugin is neutral among them.
func normalize(scores fwk.NodeScoreList, binpack bool) {
	vals := make([]int64, 0, len(scores))
	top := int64(fwk.MaxNodeScore)
	for _, s := range scores {
		if s.Score == scoreHoldsVolumes {
			top = fwk.MaxNodeScore - 1
			continue
		}
		vals = append(vals, s.Score)
	}
	slices.Sort(vals)
	vals = slices.Compact(vals)
	k := len(vals)
	// ranks[i] is the score of vals[i] in "more free is better" order.
	ranks := make([]int64, k)
	if k > 0 {
		lo, hi := vals[0], vals[k-1]
		span := float64(hi - lo)
		prev := int64(-1)
		for i, v := range vals {
			t := top
			if span > 0 {
				t = int64(math.Round(float64(v-lo) / span * float64(top)))
			}
			if k <= int(top)+1 {
				// Strict: leave room for the k-1-i values still to come.
				t = max(t, prev+1)
				t = min(t, top-int64(k-1-i))
			} else {
				t = max(t, prev)
			}
			ranks[i] = t
			prev = t
		}
	}
	for i := range scores {
		if scores[i].Score == scoreHoldsVolumes {
			scores[i].Score = fwk.MaxNodeScore
			continue
		}
		j, _ := slices.BinarySearch(vals, scores[i].Score)
		r := ranks[j]
		if binpack && k > 1 {
			r = top - r
		}
		scores[i].Score = r
	}
}
