package render

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
)

// randomSet is a mutable policy set and node inventory for TestRendererMatchesRender: pools in
// racks, local and NVMe-oF protocols (some with DH-HMAC-CHAP), placements over them.
type randomSet struct {
	rng    *rand.Rand
	serial int
	in     Input
	// versions: objects carry a UID and a resourceVersion, new on each change, as the API
	// server's do.
	versions bool
}

// touch gives m a new resourceVersion (and its UID), when the set has versions.
func (s *randomSet) touch(m *metav1.ObjectMeta) {
	if s.versions {
		m.UID = types.UID("uid-" + m.Name)
		m.ResourceVersion = s.name("rv")
	}
}

func (s *randomSet) name(prefix string) string {
	s.serial++
	return fmt.Sprintf("%s-%d", prefix, s.serial)
}

func (s *randomSet) pool() policyv1.StoragePool {
	p := policyv1.StoragePool{ObjectMeta: metav1.ObjectMeta{Name: s.name("pool")}}
	s.editPool(&p)
	s.touch(&p.ObjectMeta)
	return p
}

func (s *randomSet) editPool(p *policyv1.StoragePool) {
	switch s.rng.IntN(4) {
	case 0:
		p.Spec.NodeSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"rack": fmt.Sprintf("r%d", s.rng.IntN(4))}}
	case 1:
		p.Spec.NodeSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: "rack", Operator: metav1.LabelSelectorOpIn, Values: []string{"r0", fmt.Sprintf("r%d", s.rng.IntN(4))}}}}
	case 2:
		p.Spec.Reserve = fmt.Sprintf("%d%%", 1+s.rng.IntN(20))
	default:
		p.Spec.Backend = policyv1.Backend{LVM: &policyv1.LVMBackend{VolumeGroup: s.name("vg"), Devices: []string{"/dev/sdb"}}}
	}
	if s.rng.IntN(3) == 0 {
		o := int32(100 + s.rng.IntN(200))
		p.Spec.OvercommitPercent = &o
	}
}

func (s *randomSet) protocol() policyv1.Protocol {
	p := policyv1.Protocol{ObjectMeta: metav1.ObjectMeta{Name: s.name("proto")}}
	s.editProtocol(&p)
	s.touch(&p.ObjectMeta)
	return p
}

func (s *randomSet) editProtocol(p *policyv1.Protocol) {
	p.Spec = policyv1.ProtocolSpec{}
	switch s.rng.IntN(4) {
	case 0:
		p.Spec.Local = &policyv1.LocalProtocol{}
	case 1:
		// mostly one endpoint; now and then another, which conflicts on shared pools or nodes
		port := int32(4420)
		if s.rng.IntN(4) == 0 {
			port = 4421
		}
		p.Spec.NVMeoFTCP = &policyv1.NVMeoFTCPProtocol{Port: port, BindCIDR: "10.0.0.0/8"}
	default:
		p.Spec.NVMeoFTCP = &policyv1.NVMeoFTCPProtocol{BindCIDR: "10.0.0.0/8",
			Auth: &policyv1.NVMeoFAuth{Mode: policyv1.AuthDHHMACCHAP, KeyGeneration: int64(s.rng.IntN(3))}}
	}
}

func (s *randomSet) placement() policyv1.Placement {
	p := policyv1.Placement{ObjectMeta: metav1.ObjectMeta{Name: s.name("place")}}
	p.Spec.StorageClass.Name = s.name("sc")
	s.editPlacement(&p)
	s.touch(&p.ObjectMeta)
	return p
}

func (s *randomSet) editPlacement(p *policyv1.Placement) {
	pick := func(n int) int { return s.rng.IntN(max(n, 1)) }
	switch s.rng.IntN(5) {
	case 0:
		if len(s.in.Pools) > 0 {
			p.Spec.PoolRef.Name = s.in.Pools[pick(len(s.in.Pools))].Name
		}
	case 1:
		if len(s.in.Protocols) > 0 {
			p.Spec.ProtocolRef.Name = s.in.Protocols[pick(len(s.in.Protocols))].Name
		}
	case 2:
		p.Spec.StorageClass.Name = s.name("sc") // a rename
	case 3:
		if p.Spec.SnapshotClass == nil {
			p.Spec.SnapshotClass = &policyv1.SnapshotClassTemplate{Name: s.name("vsc"), Velero: s.rng.IntN(2) == 0, Group: s.rng.IntN(2) == 0}
		} else {
			p.Spec.SnapshotClass = nil
		}
	default:
		p.Spec.StorageClass.VolumeBindingMode = []string{"Immediate", "WaitForFirstConsumer"}[pick(2)]
		p.Spec.StorageClass.IsDefault = s.rng.IntN(5) == 0
	}
}

func (s *randomSet) node(i int) corev1.Node {
	n := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: s.name("node"), Labels: map[string]string{"rack": fmt.Sprintf("r%d", i%4)}}}
	return n
}

// step makes one random change and names it.
func (s *randomSet) step() string {
	in := &s.in
	del := func(n int) int { return s.rng.IntN(n) }
	switch op := s.rng.IntN(12); {
	case op == 0:
		in.Pools = append(in.Pools, s.pool())
		return "add pool"
	case op == 1 && len(in.Pools) > 0:
		i := del(len(in.Pools))
		in.Pools = append(in.Pools[:i:i], in.Pools[i+1:]...)
		return "delete pool"
	case op <= 3 && len(in.Pools) > 0:
		i := del(len(in.Pools))
		p := in.Pools[i].DeepCopy()
		s.editPool(p)
		s.touch(&p.ObjectMeta)
		in.Pools = append(append(in.Pools[:i:i], *p), in.Pools[i+1:]...)
		return "edit pool"
	case op == 4:
		in.Protocols = append(in.Protocols, s.protocol())
		return "add protocol"
	case op == 5 && len(in.Protocols) > 0:
		i := del(len(in.Protocols))
		p := in.Protocols[i].DeepCopy()
		s.editProtocol(p)
		s.touch(&p.ObjectMeta)
		in.Protocols = append(append(in.Protocols[:i:i], *p), in.Protocols[i+1:]...)
		return "edit protocol"
	case op == 6:
		in.Placements = append(in.Placements, s.placement())
		return "add placement"
	case op == 7 && len(in.Placements) > 0:
		i := del(len(in.Placements))
		in.Placements = append(in.Placements[:i:i], in.Placements[i+1:]...)
		return "delete placement"
	case op <= 9 && len(in.Placements) > 0:
		i := del(len(in.Placements))
		p := in.Placements[i].DeepCopy()
		s.editPlacement(p)
		s.touch(&p.ObjectMeta)
		in.Placements = append(append(in.Placements[:i:i], *p), in.Placements[i+1:]...)
		return "edit placement"
	case op == 10 && len(in.Nodes) > 0:
		i := del(len(in.Nodes))
		n := in.Nodes[i].DeepCopy()
		n.Labels = map[string]string{"rack": fmt.Sprintf("r%d", s.rng.IntN(4))}
		in.Nodes = append(append(in.Nodes[:i:i], *n), in.Nodes[i+1:]...)
		return "relabel node"
	case op == 11 && len(in.Nodes) > 0 && s.rng.IntN(2) == 0:
		i := del(len(in.Nodes))
		in.Nodes = append(in.Nodes[:i:i], in.Nodes[i+1:]...)
		return "delete node"
	default:
		in.Nodes = append(in.Nodes, s.node(len(in.Nodes)))
		return "add node"
	}
}

// TestRendererMatchesRender: after every change of a random sequence (edits, additions and
// deletions of pools, protocols, placements and nodes, some making the set unrenderable), the
// kept-state Renderer gives what a cold Render gives: equal objects, equal Sources, the same
// YAML bytes (every 25th step), the same error. The Renderer renders from scratch (falls back) exactly when the
// set does not render.
func TestRendererMatchesRender(t *testing.T) {
	const steps = 400
	failedAll := 0
	for _, seed := range []uint64{1, 2, 3, 4} {
		t.Run(fmt.Sprintf("seed%d", seed), func(t *testing.T) {
			// odd seeds: objects with resourceVersions (the Renderer compares those); even: without
			s := &randomSet{rng: rand.New(rand.NewPCG(seed, 21)), versions: seed%2 == 1}
			for i := 0; i < 12; i++ {
				s.in.Nodes = append(s.in.Nodes, s.node(i))
			}
			for i := 0; i < 6; i++ {
				s.in.Pools = append(s.in.Pools, s.pool())
				s.in.Protocols = append(s.in.Protocols, s.protocol())
			}
			for i := 0; i < 8; i++ {
				s.in.Placements = append(s.in.Placements, s.placement())
			}
			var r Renderer
			ops := map[string]int{}
			failed, fellBack := 0, 0
			kept := map[*unstructured.Unstructured]string{} // converted objects by pointer → their JSON when converted
			reused, steady := 0, 0
			for i := 0; i < steps; i++ {
				op := "initial"
				if i > 0 {
					op = s.step()
				}
				ops[op]++
				want, werr := Render(s.in)
				pass := r.pass
				got, gerr := r.Render(s.in)
				if !r.valid {
					fellBack++
				}
				if r.pass != pass+1 {
					t.Fatalf("step %d (%s): Renderer did not look at its kept state", i, op)
				}
				if werr != nil {
					failed++
				}
				if fmt.Sprint(werr) != fmt.Sprint(gerr) {
					t.Fatalf("step %d (%s): error %v, cold render's %v", i, op, gerr, werr)
				}
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("step %d (%s): Renderer's output differs from Render's:\n%s", i, op, firstDiff(t, got, want))
				}
				if gerr == nil {
					reused += keptConversionMatches(t, &r, got, want, kept)
					steady++
				}
				if i%25 != 0 {
					continue // the objects are equal; their bytes now and then (YAML costs more)
				}
				gy, err1 := got.YAML()
				wy, err2 := want.YAML()
				if err := errors.Join(err1, err2); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(gy, wy) {
					t.Fatalf("step %d (%s): YAML differs", i, op)
				}
			}
			// Most steps touch a few objects: most conversions are kept ones.
			if reused < steady*3 {
				t.Errorf("%d conversions reused over %d rendered steps: the kept conversion is not used", reused, steady)
			}
			if fellBack != failed {
				t.Errorf("renderer fell back %d times; the set failed to render %d times", fellBack, failed)
			}
			failedAll += failed
			for _, op := range []string{"add pool", "delete pool", "edit pool", "add protocol", "edit protocol", "add placement",
				"delete placement", "edit placement", "relabel node", "delete node", "add node"} {
				if ops[op] < 10 {
					t.Errorf("only %d steps of %q", ops[op], op)
				}
			}
			t.Logf("%d steps %v; %d did not render", steps, ops, failed)
		})
	}
	if failedAll == 0 || failedAll > 4*steps/2 {
		t.Errorf("%d of %d steps did not render: the sequences should test both paths", failedAll, 4*steps)
	}
}

// keptConversionMatches checks that r.Unstructured(got) equals want.Unstructured() object for
// object, and that a conversion handed out again (the same pointer) still holds what it held
// when first handed out (kept maps pointers to their JSON then); it returns how many were
// handed out again.
func keptConversionMatches(t *testing.T, r *Renderer, got, want *Output, kept map[*unstructured.Unstructured]string) int {
	t.Helper()
	gu, err := r.Unstructured(got)
	if err != nil {
		t.Fatal(err)
	}
	wu, err := want.Unstructured()
	if err != nil {
		t.Fatal(err)
	}
	if len(gu) != len(wu) {
		t.Fatalf("kept conversion: %d objects, cold %d", len(gu), len(wu))
	}
	reused := 0
	for i := range gu {
		if !reflect.DeepEqual(gu[i].Object, wu[i].Object) {
			t.Fatalf("kept conversion of %s/%s differs from the cold one:\n got  %v\n want %v", wu[i].GetKind(), wu[i].GetName(), gu[i].Object, wu[i].Object)
		}
		b, err := json.Marshal(gu[i].Object)
		if err != nil {
			t.Fatal(err)
		}
		if was, ok := kept[gu[i]]; ok {
			reused++
			if was != string(b) {
				t.Fatalf("kept conversion of %s/%s changed under the same pointer", wu[i].GetKind(), wu[i].GetName())
			}
		}
		kept[gu[i]] = string(b)
	}
	return reused
}

// firstDiff names the first part of two outputs that differs.
func firstDiff(t *testing.T, got, want *Output) string {
	t.Helper()
	g, w := reflect.ValueOf(*got), reflect.ValueOf(*want)
	for i := 0; i < g.NumField(); i++ {
		if !reflect.DeepEqual(g.Field(i).Interface(), w.Field(i).Interface()) {
			return fmt.Sprintf("%s:\n got  %+v\n want %+v", g.Type().Field(i).Name, g.Field(i).Interface(), w.Field(i).Interface())
		}
	}
	return "(no field differs)"
}
