package plan

import (
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
)

func obj(kind, name string, annotations, labels map[string]string, spec map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{}}
	u.SetKind(kind)
	u.SetName(name)
	u.SetAnnotations(annotations)
	u.SetLabels(labels)
	if spec != nil {
		u.Object["spec"] = spec
	}
	return u
}

func TestEffectiveReplacement(t *testing.T) {
	withPolicy := func(p policyv1.Replacement) *policyv1.Placement {
		pl := &policyv1.Placement{}
		pl.Spec.StorageClass.Replacement = p
		return pl
	}
	for _, tc := range []struct {
		name string
		pl   *policyv1.Placement
		want policyv1.Replacement
	}{
		{"no placement", nil, policyv1.ReplacementNever},
		{"unset", withPolicy(""), policyv1.ReplacementNever},
		{"Never", withPolicy(policyv1.ReplacementNever), policyv1.ReplacementNever},
		{"IfUnused", withPolicy(policyv1.ReplacementIfUnused), policyv1.ReplacementIfUnused},
		{"Always", withPolicy(policyv1.ReplacementAlways), policyv1.ReplacementAlways},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := EffectiveReplacement(tc.pl); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestReplacementAllowed(t *testing.T) {
	for _, tc := range []struct {
		policy    policyv1.Replacement
		pvcs, pvs int
		want      bool
	}{
		{policyv1.ReplacementAlways, 0, 0, true},
		{policyv1.ReplacementAlways, 3, 2, true},
		{policyv1.ReplacementIfUnused, 0, 0, true},
		{policyv1.ReplacementIfUnused, 1, 0, false},
		{policyv1.ReplacementIfUnused, 0, 1, false}, // a released PV still names the class
		{policyv1.ReplacementNever, 0, 0, false},
		{"", 0, 0, false},
	} {
		if got := ReplacementAllowed(tc.policy, tc.pvcs, tc.pvs); got != tc.want {
			t.Errorf("ReplacementAllowed(%q, %d, %d) = %v, want %v", tc.policy, tc.pvcs, tc.pvs, got, tc.want)
		}
	}
}

func TestDecidePrune(t *testing.T) {
	force := map[string]string{AnnotationPrune: PruneValueForce}
	for _, tc := range []struct {
		name                string
		live                *unstructured.Unstructured
		classUsers, volumes int
		keptNodes           map[string]bool
		want                PruneVerdict
	}{
		{"unused class", obj("StorageClass", "a", nil, nil, nil), 0, 0, nil, PruneDelete},
		{"class in use", obj("StorageClass", "a", nil, nil, nil), 2, 0, nil, PruneKeepInUse},
		{"class in use, forced", obj("StorageClass", "a", force, nil, nil), 2, 0, nil, PruneDeleteInUse},
		// PVs only (claims deleted, volumes Retained): still in use
		{"class used by PVs only", obj("StorageClass", "a", nil, nil, nil), 1, 0, nil, PruneKeepInUse},
		// a claim that asks for, holds or is moving to a tier keeps its VolumeAttributesClass
		{"attributes class named by a claim", obj("VolumeAttributesClass", "gold", nil, nil, nil), 1, 0, nil, PruneKeepInUse},
		{"unused attributes class", obj("VolumeAttributesClass", "gold", nil, nil, nil), 0, 0, nil, PruneDelete},
		{"unused class, forced", obj("StorageClass", "a", force, nil, nil), 0, 0, nil, PruneDelete},
		{"opted out by annotation", obj("StorageClass", "a", map[string]string{AnnotationPrune: PruneValueDisabled}, nil, nil), 2, 0, nil, PruneKeepOptedOut},
		{"opted out by Flux's label", obj("Store", "p.n", nil, map[string]string{"kustomize.toolkit.fluxcd.io/prune": "disabled"}, nil), 0, 3, nil, PruneKeepOptedOut},
		{"empty Store", obj("Store", "p.n", nil, nil, map[string]any{"nodeName": "n"}), 0, 0, nil, PruneDelete},
		{"Store with volumes", obj("Store", "p.n", nil, nil, map[string]any{"nodeName": "n"}), 0, 1, nil, PruneKeepDraining},
		{"volumes ignored on a class", obj("StorageClass", "a", nil, nil, nil), 0, 5, nil, PruneDelete},
		{"Agent of a draining node", obj("Agent", "n", nil, nil, map[string]any{"nodeName": "n"}), 0, 0, map[string]bool{"n": true}, PruneKeepDraining},
		{"Agent of another node", obj("Agent", "m", nil, nil, map[string]any{"nodeName": "m"}), 0, 0, map[string]bool{"n": true}, PruneDelete},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := DecidePrune(tc.live, tc.classUsers, tc.volumes, tc.keptNodes); got != tc.want {
				t.Errorf("got %s, want %s", got, tc.want)
			}
		})
	}
}

func TestCorrectDrift(t *testing.T) {
	places := map[string]*policyv1.Placement{"fast": {}}
	places["fast"].Spec.PoolRef.Name = "p"
	pools := map[string]*policyv1.StoragePool{"p": {}, "q": {}}
	pools["p"].Spec.DriftPolicy = policyv1.DriftPolicyCorrect
	pools["q"].Spec.DriftPolicy = policyv1.DriftPolicyReport
	for _, tc := range []struct {
		name string
		u    *unstructured.Unstructured
		want bool
	}{
		{"Agent always", obj("Agent", "n", nil, nil, nil), true},
		{"Store Correct", obj("Store", "p.n", nil, nil, map[string]any{"driftPolicy": "Correct"}), true},
		{"Store Report", obj("Store", "q.n", nil, nil, map[string]any{"driftPolicy": "Report"}), false},
		{"class of a Correct pool", obj("StorageClass", "c", nil, map[string]string{policyv1.LabelPlacement: "fast"}, nil), true},
		{"class of an unknown placement", obj("StorageClass", "c", nil, map[string]string{policyv1.LabelPlacement: "gone"}, nil), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := CorrectDrift(tc.u, places, pools); got != tc.want {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}
