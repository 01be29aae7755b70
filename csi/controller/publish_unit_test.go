package controller

import (
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/plinth-storage/plinth/csi/internal/volume"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// A node's plinth.dev/max-volumes-per-node refuses the publish that would exceed it, counting
// the other volumes published to that node only; a volume already there republishes.
func TestAttachLimit(t *testing.T) {
	node := &corev1.Node{}
	node.Name = "node-1"
	vol := func(name string, nodes ...string) storev1.VolumeState {
		vs := storev1.VolumeState{}
		vs.Name = name
		for _, n := range nodes {
			vs.Spec.Publications = append(vs.Spec.Publications, storev1.Publication{NodeName: n})
		}
		return vs
	}
	vss := []storev1.VolumeState{vol("vol-a", "node-1"), vol("vol-b", "node-2", "node-1"), vol("vol-c", "node-2"), vol("vol-d")}
	for _, tc := range []struct {
		limit, id string
		want      error
	}{
		{"", "vol-new", nil},
		{"3", "vol-new", nil},
		{"2", "vol-new", volume.ErrAttachLimit},
		{"2", "vol-a", nil}, // already published there
		{"2", "vol-c", volume.ErrAttachLimit},
		{"0", "vol-new", nil},
		{"x", "vol-new", nil},
	} {
		node.Annotations = map[string]string{}
		if tc.limit != "" {
			node.Annotations[policyv1.AnnotationMaxVolumes] = tc.limit
		}
		if err := attachLimitError(node, vss, tc.id); volume.KindOf(err) != tc.want {
			t.Errorf("limit %q, publish %s: %v, want kind %v", tc.limit, tc.id, err, tc.want)
		}
	}
}
