package capacity

import (
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// slotKey names one Store: its plinth.dev/pool and plinth.dev/node label values.
type slotKey struct{ pool, node string }

// slot is what the plugin knows of one (pool, node): the Store's capacity as last seen and
// the bytes booked on it by pods in flight.
type slot struct {
	hasStore  bool
	state     capState
	available int64
	// provisioned as last reported; a change after a claim is bound means the agent's
	// report now includes that claim's volume.
	provisioned int64
	reserved    int64
}

// booking is one claim's request held on one slot between Reserve and the moment the
// Store's reported capacity includes the claim's volume (or Unreserve, or the timeout).
type booking struct {
	pod   types.UID
	key   slotKey
	bytes int64
	at    time.Time
	// provisioned of the slot when booked; bound says the claim got its PV.
	provisioned int64
	bound       bool
}

// protoKind is what the plugin needs of a Protocol.
type protoKind uint8

const (
	protoUnknown protoKind = iota
	protoLocal
	protoNVMeoF
)

// view is the plugin's view of Stores, Placements and Protocols (fed by informers) and the
// ledger of in-flight bookings. One RWMutex: Filter and Score take the read lock only.
type view struct {
	mu sync.RWMutex
	// pools holds the slots by plinth.dev/pool, then plinth.dev/node label value, by value:
	// Filter and Score make one lookup by node with a string key into a map the pod's
	// PreFilter resolved, and follow no pointer, where a map by slotKey hashed and compared
	// two strings per node (the larger part of the plugin's time in the real scheduler). A
	// pool's map is never removed once made, so a map resolved in PreFilter stays current.
	pools      map[string]map[string]slot
	strategies map[string]policyv1.Strategy
	// overridable holds the Placements whose PVCs may choose their own strategy
	// (spec.overrides.allowed has strategy).
	overridable map[string]bool
	protocols   map[string]protoKind
	bookings    map[string]*booking // by claim "namespace/name"
	ttl         time.Duration
	now         func() time.Time
}

func newView(ttl time.Duration) *view {
	return &view{
		pools:       map[string]map[string]slot{},
		strategies:  map[string]policyv1.Strategy{},
		overridable: map[string]bool{},
		protocols:   map[string]protoKind{},
		bookings:    map[string]*booking{},
		ttl:         ttl,
		now:         time.Now,
	}
}

// storeKey returns the slot key of a Store from its labels (docs/design.md, "Names and keys":
// look Stores up by plinth.dev/pool and plinth.dev/node), falling back to its spec for a Store
// without them.
func storeKey(st *storev1.Store) slotKey {
	k := slotKey{pool: st.Labels[policyv1.LabelPool], node: st.Labels[policyv1.LabelNode]}
	if k.pool == "" {
		k.pool = storev1.NameLabelValue(st.Spec.Pool)
	}
	if k.node == "" {
		k.node = storev1.NameLabelValue(st.Spec.NodeName)
	}
	return k
}

// poolLocked returns the slots of a pool, making the map if create is set (else nil when
// the pool has none). Callers hold mu (the write lock when create is set).
func (c *view) poolLocked(poolKey string, create bool) map[string]slot {
	m := c.pools[poolKey]
	if m == nil && create {
		m = map[string]slot{}
		c.pools[poolKey] = m
	}
	return m
}

// slotLocked returns the slot of k (zero and false when there is none); callers hold mu.
func (c *view) slotLocked(k slotKey) (slot, bool) {
	s, ok := c.pools[k.pool][k.node]
	return s, ok
}

// poolSlots returns the slots of a pool for Filter and Score, nil when no Store of the pool
// was seen yet. The map is read under mu's read lock only.
func (c *view) poolSlots(poolKey string) map[string]slot {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.pools[poolKey]
}

// slotsOf returns the slots of d's pool: those PreFilter resolved, else the pool's current
// map (nil while no Store of it was seen). Callers hold mu's read lock.
func (c *view) slotsOf(d *poolDemand) map[string]slot {
	if d.slots != nil {
		return d.slots
	}
	return c.pools[d.poolKey]
}

// upsertStore records a Store's capacity and releases bookings it now accounts for.
func (c *view) upsertStore(st *storev1.Store) {
	k := storeKey(st)
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.poolLocked(k.pool, true)
	s := m[k.node]
	s.hasStore = true
	s.state = classify(st)
	if s.state == capOK {
		s.available = st.Status.Capacity.Available
		s.provisioned = st.Status.Capacity.Provisioned
	} else {
		s.available, s.provisioned = 0, 0
	}
	m[k.node] = s
	for _, b := range c.bookings {
		// Volumes deleted since the booking: its volume is measured from here on.
		if b.key == k && b.provisioned > s.provisioned {
			b.provisioned = s.provisioned
		}
	}
	c.releaseAccountedLocked(k)
}

// releaseAccountedLocked releases the bound bookings of slot k that the Store's report now
// accounts for, and only those: the report's provisioned bytes grew by G since the earliest
// baseline among them, and bookings are released oldest first while their bytes fit in G (a
// booking also needs the report to have grown by its own bytes since its own baseline). A
// report that counts one of two new volumes releases one booking; the other's bytes stay
// taken until a report counts them too, or the booking times out. A report that shrank
// (volumes deleted meanwhile) releases nothing and lowers the baselines (upsertStore):
// holding a booking too long only delays a pod, releasing it too early lets two pods take
// the same space. Callers hold mu's write lock.
func (c *view) releaseAccountedLocked(k slotKey) {
	s, ok := c.slotLocked(k)
	if !ok || !s.hasStore {
		return
	}
	var bound []string
	base := int64(math.MaxInt64)
	for claim, b := range c.bookings {
		if b.key == k && b.bound {
			bound = append(bound, claim)
			base = min(base, b.provisioned)
		}
	}
	growth := s.provisioned - base
	if len(bound) == 0 || growth <= 0 {
		return
	}
	slices.SortFunc(bound, func(a, b string) int {
		if c := c.bookings[a].at.Compare(c.bookings[b].at); c != 0 {
			return c
		}
		return strings.Compare(a, b)
	})
	var accounted int64
	for _, claim := range bound {
		b := c.bookings[claim]
		if accounted+b.bytes > growth || s.provisioned-b.provisioned < b.bytes {
			continue
		}
		accounted += b.bytes
		c.releaseLocked(claim)
	}
}

func (c *view) deleteStore(st *storev1.Store) {
	k := storeKey(st)
	c.mu.Lock()
	defer c.mu.Unlock()
	if s, ok := c.slotLocked(k); ok {
		if s.reserved == 0 {
			delete(c.pools[k.pool], k.node)
		} else {
			c.pools[k.pool][k.node] = slot{reserved: s.reserved}
		}
	}
}

// setStrategy records a Placement's strategy and whether its PVCs may override it.
func (c *view) setStrategy(placement string, s policyv1.Strategy, overridable bool) {
	c.mu.Lock()
	c.strategies[placement] = s
	c.overridable[placement] = overridable
	c.mu.Unlock()
}

func (c *view) deleteStrategy(placement string) {
	c.mu.Lock()
	delete(c.strategies, placement)
	delete(c.overridable, placement)
	c.mu.Unlock()
}

// strategyOverridable reports whether PVCs of placement may choose their own strategy.
func (c *view) strategyOverridable(placement string) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.overridable[placement]
}

func (c *view) setProtocol(name string, p protoKind) {
	c.mu.Lock()
	c.protocols[name] = p
	c.mu.Unlock()
}

func (c *view) deleteProtocol(name string) {
	c.mu.Lock()
	delete(c.protocols, name)
	c.mu.Unlock()
}

// placementInfo returns the strategy of a Placement (ok false when unknown) and the kind
// of a Protocol.
func (c *view) lookupPolicy(placement, protocol string) (policyv1.Strategy, bool, protoKind) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	s, ok := c.strategies[placement]
	return s, ok, c.protocols[protocol]
}

// reserve books each claim's bytes on the slot of (pool, node). A claim booked before (an
// earlier attempt of the same pod) is re-booked.
func (c *view) reserve(pod types.UID, node string, claims []claimDemand) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	for _, cl := range claims {
		c.releaseLocked(cl.claim)
		k := slotKey{pool: cl.poolKey, node: node}
		m := c.poolLocked(k.pool, true)
		s := m[k.node]
		s.reserved = addSat(s.reserved, cl.bytes)
		m[k.node] = s
		c.bookings[cl.claim] = &booking{pod: pod, key: k, bytes: cl.bytes, at: now, provisioned: s.provisioned}
	}
}

// unreserve drops every booking of the pod.
func (c *view) unreserve(pod types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for claim, b := range c.bookings {
		if b.pod == pod {
			c.releaseLocked(claim)
		}
	}
}

// claimBound notes that a claim got its PV; the booking goes once the Store's report
// accounts for its volume (releaseAccountedLocked), at once when the Store is gone.
func (c *view) claimBound(claim string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	b := c.bookings[claim]
	if b == nil {
		return
	}
	b.bound = true
	if s, ok := c.slotLocked(b.key); !ok || !s.hasStore {
		c.releaseLocked(claim)
		return
	}
	c.releaseAccountedLocked(b.key)
}

// claimDeleted drops the claim's booking.
func (c *view) claimDeleted(claim string) {
	c.mu.Lock()
	c.releaseLocked(claim)
	c.mu.Unlock()
}

// expire drops bookings older than the timeout and returns how many it dropped.
func (c *view) expire() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	now := c.now()
	for claim, b := range c.bookings {
		if now.Sub(b.at) >= c.ttl {
			c.releaseLocked(claim)
			n++
		}
	}
	return n
}

func (c *view) releaseLocked(claim string) {
	b := c.bookings[claim]
	if b == nil {
		return
	}
	delete(c.bookings, claim)
	s, ok := c.slotLocked(b.key)
	if !ok {
		return
	}
	s.reserved -= b.bytes
	if s.reserved < 0 {
		s.reserved = 0
	}
	if !s.hasStore && s.reserved == 0 {
		delete(c.pools[b.key.pool], b.key.node)
	} else {
		c.pools[b.key.pool][b.key.node] = s
	}
}

// reservedOn returns the bytes booked on (pool, node); for tests and debugging.
func (c *view) reservedOn(poolKey, node string) int64 {
	c.mu.RLock()
	defer c.mu.RUnlock()
	s, _ := c.slotLocked(slotKey{poolKey, node})
	return s.reserved
}
