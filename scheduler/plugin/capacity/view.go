package capacity

import (
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
	mu         sync.RWMutex
	slots      map[slotKey]*slot
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
		slots:       map[slotKey]*slot{},
		strategies:  map[string]policyv1.Strategy{},
		overridable: map[string]bool{},
		protocols:   map[string]protoKind{},
		bookings:    map[string]*booking{},
		ttl:         ttl,
		now:         time.Now,
	}
}

// storeKey returns the slot key of a Store from its labels (DESIGN.md: look Stores up by
// plinth.dev/pool and plinth.dev/node), falling back to its spec for a Store without them.
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

// upsertStore records a Store's capacity and releases bookings it now accounts for.
func (c *view) upsertStore(st *storev1.Store) {
	k := storeKey(st)
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.slots[k]
	if s == nil {
		s = &slot{}
		c.slots[k] = s
	}
	s.hasStore = true
	s.state = classify(st)
	if s.state == capOK {
		s.available = st.Status.Capacity.Available
		s.provisioned = st.Status.Capacity.Provisioned
	} else {
		s.available, s.provisioned = 0, 0
	}
	for claim, b := range c.bookings {
		if b.key == k && b.bound && s.provisioned != b.provisioned {
			c.releaseLocked(claim)
		}
	}
}

func (c *view) deleteStore(st *storev1.Store) {
	k := storeKey(st)
	c.mu.Lock()
	defer c.mu.Unlock()
	if s := c.slots[k]; s != nil {
		if s.reserved == 0 {
			delete(c.slots, k)
		} else {
			*s = slot{reserved: s.reserved}
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
		s := c.slots[k]
		if s == nil {
			s = &slot{}
			c.slots[k] = s
		}
		s.reserved = addSat(s.reserved, cl.bytes)
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

// claimBound notes that a claim got its PV; the booking goes once the Store's report has
// changed since the booking (the volume is then counted in provisioned).
func (c *view) claimBound(claim string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	b := c.bookings[claim]
	if b == nil {
		return
	}
	b.bound = true
	if s := c.slots[b.key]; s == nil || !s.hasStore || s.provisioned != b.provisioned {
		c.releaseLocked(claim)
	}
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
	s := c.slots[b.key]
	if s == nil {
		return
	}
	s.reserved -= b.bytes
	if s.reserved < 0 {
		s.reserved = 0
	}
	if !s.hasStore && s.reserved == 0 {
		delete(c.slots, b.key)
	}
}

// reservedOn returns the bytes booked on (pool, node); for tests and debugging.
func (c *view) reservedOn(poolKey, node string) int64 {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if s := c.slots[slotKey{poolKey, node}]; s != nil {
		return s.reserved
	}
	return 0
}
