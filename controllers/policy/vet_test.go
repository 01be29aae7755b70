package policy

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	"github.com/plinth-storage/plinth/schema/vet"
)

func TestVetObjects(t *testing.T) {
	v, err := vet.NewVetter()
	if err != nil {
		t.Fatal(err)
	}
	pools, protos, places := testPolicy()
	pol, problems := VetObjects(v, pools, protos, places)
	if len(problems) != 0 {
		t.Fatalf("valid set has problems: %v", problems)
	}
	if len(pol.Pools) != 1 || len(pol.Placements) != 1 || pol.Placements[0].Spec.Strategy != policyv1.StrategyBinpack {
		t.Fatalf("decoded %+v", pol)
	}

	// A placement naming a missing pool and a local protocol with Immediate binding.
	bad := places[0].DeepCopy()
	bad.Spec.PoolRef.Name = "missing"
	bad.Spec.StorageClass.VolumeBindingMode = "Immediate"
	bad.Annotations = map[string]string{"kubectl.kubernetes.io/last-applied-configuration": "{}"}
	_, problems = VetObjects(v, pools, protos, []policyv1.Placement{*bad})
	by := problemsByObject(problems)
	msgs := strings.Join(by["Placement/fast"], "\n")
	for _, want := range []string{`placement/fast:`, `spec.poolRef.name: StoragePool "missing" not found`, "volumeBindingMode must be WaitForFirstConsumer"} {
		if !strings.Contains(msgs, want) {
			t.Errorf("problems %q lack %q", msgs, want)
		}
	}

	// A schema violation the CRD would not catch by itself: the label value is too long.
	long := pools[0].DeepCopy()
	long.Labels = map[string]string{"team": strings.Repeat("x", 64)}
	_, problems = VetObjects(v, []policyv1.StoragePool{*long}, protos, places)
	by = problemsByObject(problems)
	if got := strings.Join(by["StoragePool/dev"], "\n"); !strings.Contains(got, "storagepool/dev:5:11: StoragePool/dev: metadata.labels.team: invalid value") {
		t.Fatalf("problems = %v", problems)
	}
}

func testPolicy() ([]policyv1.StoragePool, []policyv1.Protocol, []policyv1.Placement) {
	pools := []policyv1.StoragePool{{
		ObjectMeta: metav1.ObjectMeta{Name: "dev"},
		Spec: policyv1.StoragePoolSpec{
			NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"plinth.dev/storage": "dev"}},
			Backend:      policyv1.Backend{File: &policyv1.FileBackend{Directory: "/var/lib/plinth"}},
		},
	}}
	protos := []policyv1.Protocol{{ObjectMeta: metav1.ObjectMeta{Name: "local"}, Spec: policyv1.ProtocolSpec{Local: &policyv1.LocalProtocol{}}}}
	places := []policyv1.Placement{{
		ObjectMeta: metav1.ObjectMeta{Name: "fast"},
		Spec: policyv1.PlacementSpec{
			PoolRef: policyv1.LocalObjectReference{Name: "dev"}, ProtocolRef: policyv1.LocalObjectReference{Name: "local"},
			StorageClass: policyv1.StorageClassTemplate{Name: "fast", VolumeBindingMode: "WaitForFirstConsumer"},
		},
	}}
	return pools, protos, places
}
