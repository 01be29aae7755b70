package policy

import (
	"math/rand/v2"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	"github.com/plinth-storage/plinth/schema/vet"
)

// TestKeptVetterMatchesVetObjects: over a random sequence of changes to live policy objects
// (spec edits that make them valid or not on their own, or clash with others: duplicate
// StorageClass names, missing references, local protocols with Immediate binding; label
// changes; status-only writes; deletions and additions), a KeptVetter gives exactly what
// VetObjects gives with nothing kept — the same policies and the same problems at the same
// positions — and judges again only the objects whose resourceVersion changed.
func TestKeptVetterMatchesVetObjects(t *testing.T) {
	v, err := vet.NewVetter()
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(7, 21))
	basePools, baseProtos, basePlaces := testPolicy()
	serial := 0
	next := func() string { serial++; return strconv.Itoa(serial) }
	var pools []policyv1.StoragePool
	var protos []policyv1.Protocol
	var places []policyv1.Placement
	newPool := func() policyv1.StoragePool {
		p := *basePools[0].DeepCopy()
		p.Name, p.UID, p.ResourceVersion = "pool-"+next(), types.UID("uid-"+next()), next()
		return p
	}
	newProto := func() policyv1.Protocol {
		p := *baseProtos[0].DeepCopy()
		p.Name, p.UID, p.ResourceVersion = "proto-"+next(), types.UID("uid-"+next()), next()
		return p
	}
	newPlace := func() policyv1.Placement {
		p := *basePlaces[0].DeepCopy()
		p.Name, p.UID, p.ResourceVersion = "place-"+next(), types.UID("uid-"+next()), next()
		p.Spec.StorageClass.Name = "sc-" + next()
		if len(pools) > 0 {
			p.Spec.PoolRef.Name = pools[rng.IntN(len(pools))].Name
		}
		if len(protos) > 0 {
			p.Spec.ProtocolRef.Name = protos[rng.IntN(len(protos))].Name
		}
		return p
	}
	for range 5 {
		pools = append(pools, newPool())
		protos = append(protos, newProto())
	}
	for range 10 {
		places = append(places, newPlace())
	}
	kv := NewKeptVetter(v)
	changed, withProblems := 0, 0
	bad := func() int { // 1 now and then: an edit that breaks, else one that mends
		if rng.IntN(6) == 0 {
			return 1
		}
		return 0
	}
	const steps = 150
	for step := 0; step < steps; step++ {
		what := "initial"
		if step > 0 {
			changed = 1
			switch op := rng.IntN(10); {
			case op == 0:
				pools = append(pools, newPool())
				what = "add pool"
			case op == 1 && len(places) > 1:
				i := rng.IntN(len(places))
				places = append(places[:i:i], places[i+1:]...)
				changed, what = 0, "delete placement"
			case op == 2:
				places = append(places, newPlace())
				what = "add placement"
			case op == 3:
				i := rng.IntN(len(pools))
				p := pools[i].DeepCopy()
				p.ResourceVersion = next() // a status write: same spec
				pools[i] = *p
				what = "status write"
			case op == 4:
				i := rng.IntN(len(pools))
				p := pools[i].DeepCopy()
				p.Spec.Backend.File.Directory = []string{"/var/lib/plinth", "relative/path"}[bad()]
				p.ResourceVersion = next()
				pools[i] = *p
				what = "edit pool"
			case op == 5:
				i := rng.IntN(len(protos))
				p := protos[i].DeepCopy()
				p.Labels = map[string]string{"team": strings.Repeat("x", []int{3, 64}[bad()])}
				p.ResourceVersion = next()
				protos[i] = *p
				what = "label protocol"
			default:
				i := rng.IntN(len(places))
				p := places[i].DeepCopy()
				switch rng.IntN(4) {
				case 0:
					p.Spec.StorageClass.Name = []string{"sc-" + next(), places[rng.IntN(len(places))].Spec.StorageClass.Name}[bad()]
				case 1:
					p.Spec.PoolRef.Name = []string{pools[rng.IntN(len(pools))].Name, "missing"}[bad()]
				case 2:
					p.Spec.StorageClass.VolumeBindingMode = []string{"WaitForFirstConsumer", "Immediate"}[bad()]
				default:
					p.Spec.StorageClass.Name = "sc-" + next()
				}
				p.ResourceVersion = next()
				places[i] = *p
				what = "edit placement"
			}
		}
		judged := kv.judged
		got, gotProblems := kv.VetObjects(pools, protos, places)
		want, wantProblems := VetObjects(v, pools, protos, places)
		if !reflect.DeepEqual(gotProblems, wantProblems) {
			t.Fatalf("step %d (%s): problems\n%v\nwant\n%v", step, what, gotProblems, wantProblems)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("step %d (%s): policies differ from VetObjects'", step, what)
		}
		if step > 0 && kv.judged-judged != changed {
			t.Fatalf("step %d (%s): judged %d objects, want %d", step, what, kv.judged-judged, changed)
		}
		if len(wantProblems) > 0 {
			withProblems++
		}
		if len(kv.kept) != len(pools)+len(protos)+len(places) {
			t.Fatalf("step %d (%s): %d verdicts kept for %d objects", step, what, len(kv.kept), len(pools)+len(protos)+len(places))
		}
	}
	if withProblems < steps/10 || withProblems > steps*9/10 {
		t.Errorf("%d of %d steps had problems: the sequence should test valid and invalid sets", withProblems, steps)
	}
	t.Logf("%d of %d steps with problems", withProblems, steps)
}
