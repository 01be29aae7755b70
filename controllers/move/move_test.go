package move

import (
	"strings"
	"testing"
)

const gi = int64(1) << 30

func store(name, pool string, avail int64) Store {
	return Store{Name: name, Pool: pool, Node: strings.TrimPrefix(name, pool+"."), Reported: true, Available: avail,
		CapabilitiesKnown: true, Export: true, Initiator: true, ServesNVMeoF: true}
}

func evac(s Store) Store { s.Evacuate = true; return s }

func vol(id, st string, size int64, proto string) Volume {
	pool, _, _ := strings.Cut(st, ".")
	return Volume{ID: id, Store: st, TargetPool: pool, SizeBytes: size, Protocol: proto,
		Cause: Cause{Kind: "StoragePool", Name: pool, Field: "spec.evacuateNodes"}}
}

// got is "volume→target" or "volume:Blocked rule" per move, in plan order.
func summary(r *Result) []string {
	var out []string
	for _, m := range r.Moves {
		if m.Disruption == DisruptionBlocked {
			out = append(out, m.Volume+":"+m.Blocked)
		} else {
			out = append(out, m.Volume+"→"+m.Target)
		}
	}
	return out
}

func TestPlanPlacesAndRefuses(t *testing.T) {
	withSnap := vol("v-snap", "p.a", gi, ProtocolNVMeoF)
	withSnap.Snapshots = []string{"snap-2", "snap-1"}
	noInit := store("p.c", "p", 100*gi)
	noInit.Initiator = false
	noEndpoint := store("p.d", "p", 100*gi)
	noEndpoint.ServesNVMeoF = false
	srcNoExport := evac(store("p.a", "p", 0))
	srcNoExport.Export = false
	sameNodeNoInit := store("q.a", "q", 100*gi) // pool q's Store on node a
	sameNodeNoInit.Initiator = false
	unknown := store("p.u", "p", 100*gi)
	unknown.CapabilitiesKnown, unknown.Export, unknown.Initiator = false, false, false
	unreported := store("p.n", "p", 0)
	unreported.Reported = false
	draining := store("p.dr", "p", 100*gi)
	draining.Draining = true

	cases := []struct {
		name   string
		stores []Store
		vols   []Volume
		want   []string
	}{
		{"largest first onto the most room, room taken as it goes",
			[]Store{evac(store("p.a", "p", 0)), store("p.b", "p", 10*gi), store("p.c", "p", 7*gi)},
			[]Volume{vol("v1", "p.a", 2*gi, ProtocolNVMeoF), vol("v2", "p.a", 6*gi, ProtocolNVMeoF), vol("v3", "p.a", 4*gi, ProtocolNVMeoF), vol("v4", "p.a", 4*gi, ProtocolNVMeoF)},
			// v2 (6) → b (10→4); v3 (4) → c (7→3); v4 (4) → b (4→0); v1 (2) → c (3→1)
			[]string{"v2→p.b", "v3→p.c", "v4→p.b", "v1→p.c"}},
		{"no room on any target: blocked, the rest still placed",
			[]Store{evac(store("p.a", "p", 0)), store("p.b", "p", 5*gi)},
			[]Volume{vol("big", "p.a", 8*gi, ProtocolLocal), vol("small", "p.a", 5*gi, ProtocolLocal)},
			[]string{"big:NoRoom", "small→p.b"}},
		{"room runs out after earlier moves",
			[]Store{evac(store("p.a", "p", 0)), store("p.b", "p", 5*gi)},
			[]Volume{vol("x", "p.a", 3*gi, ProtocolLocal), vol("y", "p.a", 3*gi, ProtocolLocal)},
			[]string{"x→p.b", "y:NoRoom"}},
		{"evacuated, draining and unreported Stores are no targets",
			[]Store{evac(store("p.a", "p", 0)), evac(store("p.e", "p", 100*gi)), draining, unreported},
			[]Volume{vol("v", "p.a", gi, ProtocolLocal)},
			[]string{"v:NoRoom"}},
		{"NVMe-oF volume: target without an endpoint or initiator refused",
			[]Store{evac(store("p.a", "p", 0)), noInit, noEndpoint},
			[]Volume{vol("v", "p.a", gi, ProtocolNVMeoF)},
			[]string{"v:NoProtocol"}},
		{"local volume needs no endpoint on the target, only the initiator",
			[]Store{evac(store("p.a", "p", 0)), noInit, noEndpoint},
			[]Volume{vol("v", "p.a", gi, ProtocolLocal)},
			[]string{"v→p.d"}},
		{"source that cannot export refuses the copy",
			[]Store{srcNoExport, store("p.b", "p", 100*gi)},
			[]Volume{vol("v", "p.a", gi, ProtocolLocal)},
			[]string{"v:NoProtocol"}},
		{"a copy within one node needs no NVMe-oF on either side",
			[]Store{srcNoExport, sameNodeNoInit, store("q.b", "q", 200*gi)},
			[]Volume{{ID: "v", Store: "p.a", TargetPool: "q", SizeBytes: gi, Protocol: ProtocolLocal}},
			[]string{"v→q.a"}},
		{"a Store on the source's node first, even with less room",
			[]Store{store("p.a", "p", 0), store("q.a", "q", 2*gi), store("q.b", "q", 100*gi)},
			[]Volume{{ID: "big", Store: "p.a", TargetPool: "q", SizeBytes: 3 * gi, Protocol: ProtocolLocal},
				{ID: "small", Store: "p.a", TargetPool: "q", SizeBytes: gi, Protocol: ProtocolLocal}},
			[]string{"big→q.b", "small→q.a"}},
		{"unknown capabilities are not judged",
			[]Store{evac(store("p.a", "p", 0)), unknown},
			[]Volume{vol("v", "p.a", gi, ProtocolNVMeoF)},
			[]string{"v→p.u"}},
		{"snapshots refuse the move whatever the room",
			[]Store{evac(store("p.a", "p", 0)), store("p.b", "p", 100*gi)},
			[]Volume{withSnap},
			[]string{"v-snap:Snapshots"}},
		{"a volume following its Placement goes to the new pool only",
			[]Store{store("old.a", "old", 100*gi), store("new.b", "new", 3*gi), store("new.c", "new", 2*gi)},
			[]Volume{{ID: "f", Store: "old.a", TargetPool: "new", SizeBytes: 2 * gi, Protocol: ProtocolLocal}},
			[]string{"f→new.b"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, err := Plan(c.stores, c.vols, Options{AssumedRate: gi})
			if err != nil {
				t.Fatal(err)
			}
			if got := summary(r); strings.Join(got, " ") != strings.Join(c.want, " ") {
				t.Fatalf("plan %v, want %v\n%+v", got, c.want, r.Moves)
			}
			for _, m := range r.Moves {
				if (m.Disruption == DisruptionBlocked) != (m.Blocked != "") || m.Reason == "" {
					t.Errorf("move %s: disruption %s, blocked %q, reason %q", m.Volume, m.Disruption, m.Blocked, m.Reason)
				}
			}
		})
	}
}

func TestPlanReasonsNameTheCause(t *testing.T) {
	withSnap := vol("v", "p.a", gi, ProtocolLocal)
	withSnap.Snapshots = []string{"s2", "s1"}
	r, err := Plan([]Store{evac(store("p.a", "p", 0)), store("p.b", "p", gi/2)},
		[]Volume{withSnap, vol("w", "p.a", gi, ProtocolLocal)}, Options{AssumedRate: gi})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"has 2 snapshots (s1, s2), which are not moved", "needs 1Gi; the most room left on an eligible Store of pool p is 512Mi (p.b"} {
		found := false
		for _, m := range r.Moves {
			found = found || strings.Contains(m.Reason, want)
		}
		if !found {
			t.Errorf("no reason says %q: %+v", want, r.Moves)
		}
	}
}

func TestPlanDisruption(t *testing.T) {
	stores := []Store{evac(store("p.a", "p", 0)), store("p.b", "p", 100*gi)}
	used := func(v Volume) Volume { v.Consumers = []string{"w1"}; return v }
	cases := []struct {
		v    Volume
		want Disruption
		says string
	}{
		{vol("n", "p.a", gi, ProtocolNVMeoF), DisruptionNone, "same volume handle"},
		{used(vol("n", "p.a", gi, ProtocolNVMeoF)), DisruptionPodRestart, "reconnects to the target under the same volume handle"},
		{vol("l", "p.a", gi, ProtocolLocal), DisruptionNone, "rebound to a new PV on node b"},
		{used(vol("l", "p.a", gi, ProtocolLocal)), DisruptionPodRestart, "node affinity is immutable"},
	}
	for _, c := range cases {
		r, err := Plan(stores, []Volume{c.v}, Options{AssumedRate: gi})
		if err != nil {
			t.Fatal(err)
		}
		if m := r.Moves[0]; m.Disruption != c.want || !strings.Contains(m.Reason, c.says) {
			t.Errorf("%s %s consumers %v: %s %q, want %s saying %q", c.v.Protocol, c.v.ID, c.v.Consumers, m.Disruption, m.Reason, c.want, c.says)
		}
	}
}

func TestPlanScheduleAndRates(t *testing.T) {
	a, b, c := evac(store("p.a", "p", 0)), store("p.b", "p", 100*gi), store("p.c", "p", 100*gi)
	vols := []Volume{vol("v1", "p.a", 4*gi, ProtocolLocal), vol("v2", "p.a", 3*gi, ProtocolLocal), vol("v3", "p.a", 2*gi, ProtocolLocal)}

	t.Run("one move at a time per Store by default, assumed rate", func(t *testing.T) {
		r, err := Plan([]Store{a, b, c}, vols, Options{AssumedRate: gi})
		if err != nil {
			t.Fatal(err)
		}
		// the source's one slot serialises: 4 s, then 3 s, then 2 s
		starts := []int64{0, 4, 7}
		for i, m := range r.Moves {
			if m.StartSeconds != starts[i] || m.RateMeasured || m.RateBytesPerSecond != gi {
				t.Errorf("move %s: start %d rate %d measured %v, want start %d at the assumed rate", m.Volume, m.StartSeconds, m.RateBytesPerSecond, m.RateMeasured, starts[i])
			}
		}
		if r.Seconds != 9 || r.Bytes != 9*gi || r.AssumedRate != gi {
			t.Errorf("total %d s %d bytes assumed %d, want 9 s, 9Gi, assumed 1Gi/s", r.Seconds, r.Bytes, r.AssumedRate)
		}
	})
	t.Run("maxParallel on every Store runs copies at once; the slower measured rate counts", func(t *testing.T) {
		a2, b2, c2 := a, b, c
		a2.MaxParallel, b2.MaxParallel, c2.MaxParallel = 2, 2, 2
		a2.RateBytesPerSecond, b2.RateBytesPerSecond = 2*gi, gi/2
		r, err := Plan([]Store{a2, b2, c2}, vols, Options{AssumedRate: gi})
		if err != nil {
			t.Fatal(err)
		}
		// v1 4Gi → b at 0.5Gi/s (8 s) from 0; v2 3Gi → c at 2Gi/s (2 s) from 0; v3 2Gi → c (room: b 96, c 97) from 2 s, 1 s
		want := map[string][3]int64{"v1": {0, 8, gi / 2}, "v2": {0, 2, 2 * gi}, "v3": {2, 1, 2 * gi}}
		for _, m := range r.Moves {
			w := want[m.Volume]
			if m.StartSeconds != w[0] || m.DurationSeconds != w[1] || m.RateBytesPerSecond != w[2] || !m.RateMeasured {
				t.Errorf("move %s → %s: start %d duration %d rate %d, want %v", m.Volume, m.Target, m.StartSeconds, m.DurationSeconds, m.RateBytesPerSecond, w)
			}
		}
		if r.Seconds != 8 || r.AssumedRate != 0 {
			t.Errorf("total %d s, assumed %d; want 8 s, nothing assumed", r.Seconds, r.AssumedRate)
		}
	})
	t.Run("a rate must be given", func(t *testing.T) {
		if _, err := Plan(nil, nil, Options{}); err == nil {
			t.Fatal("no error without a rate")
		}
	})
}

func TestPlanPoolCapacity(t *testing.T) {
	a := evac(store("p.a", "p", 1*gi))
	a.Provisioned = 9 * gi
	b := store("p.b", "p", 10*gi)
	b.Provisioned = 2 * gi
	o := store("q.a", "q", 5*gi)
	o.Provisioned = 1 * gi
	follow := Volume{ID: "f", Store: "q.a", TargetPool: "p", SizeBytes: gi, Protocol: ProtocolLocal}
	r, err := Plan([]Store{a, b, o}, []Volume{vol("v1", "p.a", 6*gi, ProtocolLocal), vol("v2", "p.a", 3*gi, ProtocolLocal), follow}, Options{AssumedRate: gi})
	if err != nil {
		t.Fatal(err)
	}
	// v1 (6) → b (10→4); v2 (3) → b (4→1); f (1) → b (1→0)
	want := []PoolCapacity{
		{Pool: "p", ProvisionedBefore: 11 * gi, ProvisionedAfter: 12 * gi, AvailableBefore: 11 * gi, AvailableAfter: 0, MovesIn: 3, MovesOut: 2, Left: 0},
		{Pool: "q", ProvisionedBefore: 1 * gi, ProvisionedAfter: 0, AvailableBefore: 5 * gi, AvailableAfter: 6 * gi, MovesIn: 0, MovesOut: 1},
	}
	if len(r.Pools) != len(want) {
		t.Fatalf("pools %+v", r.Pools)
	}
	for i := range want {
		if r.Pools[i] != want[i] {
			t.Errorf("pool %s: %+v, want %+v", want[i].Pool, r.Pools[i], want[i])
		}
	}
}
