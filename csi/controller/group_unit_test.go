package controller

import (
	"slices"
	"testing"

	"github.com/plinth-storage/plinth/csi/internal/volume"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// TestFreezeTimeout: the class parameter is whole seconds from 1 to 300, absent means the
// default, anything else is INVALID_ARGUMENT.
func TestFreezeTimeout(t *testing.T) {
	for _, tc := range []struct {
		v    string
		want int32
		ok   bool
	}{{"", policyv1.DefaultFreezeTimeoutSeconds, true}, {"1", 1, true}, {"300", 300, true},
		{"0", 0, false}, {"301", 0, false}, {"-5", 0, false}, {"10s", 0, false}, {"1.5", 0, false}} {
		params := map[string]string{}
		if tc.v != "" {
			params[policyv1.ParamFreezeTimeoutSeconds] = tc.v
		}
		got, err := freezeTimeout(params)
		if tc.ok && (err != nil || got != tc.want) || !tc.ok && volume.KindOf(err) != volume.ErrInvalid {
			t.Errorf("%q: %d, %v; want %d, ok %v", tc.v, got, err, tc.want, tc.ok)
		}
	}
}

// TestGroupFreeze: an NVMe-oF volume's freeze names its publications' nodes (sorted, once
// each); a local volume's its Store node; a raw block volume that may be in use is
// FAILED_PRECONDITION, one published nowhere is not.
func TestGroupFreeze(t *testing.T) {
	vs := func(mode string, nodes ...string) *storev1.VolumeState {
		v := &storev1.VolumeState{Spec: storev1.VolumeStateSpec{VolumeMode: mode}}
		v.Name = "vol-x"
		for _, n := range nodes {
			v.Spec.Publications = append(v.Spec.Publications, storev1.Publication{NodeName: n})
		}
		return v
	}
	f, err := groupFreeze("g", vs("Filesystem", "n2", "n1", "n2"), "", 7)
	if err != nil || !slices.Equal(f.Nodes, []string{"n1", "n2"}) || f.TimeoutSeconds != 7 {
		t.Errorf("NVMe-oF volume: %+v, %v", f, err)
	}
	if f, err := groupFreeze("g", vs("Filesystem"), "store-node", 7); err != nil || !slices.Equal(f.Nodes, []string{"store-node"}) {
		t.Errorf("local volume: %+v, %v", f, err)
	}
	if _, err := groupFreeze("g", vs("Block", "n1"), "", 7); volume.KindOf(err) != volume.ErrPrecondition {
		t.Errorf("published raw block volume: %v, want FAILED_PRECONDITION", err)
	}
	if f, err := groupFreeze("g", vs("Block"), "", 7); err != nil || len(f.Nodes) != 0 {
		t.Errorf("raw block volume published nowhere: %+v, %v", f, err)
	}
}
