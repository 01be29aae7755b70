package controller

import (
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A claim belongs to a StatefulSet only when it has the name the StatefulSet controller gives
// a claim of one of its templates (<template>-<set>-<ordinal>, a plain decimal ordinal) and the
// set's selector labels: a set whose name is a prefix of another's, or a look-alike claim
// without the labels, is not mistaken for it.
func TestClaimOfSet(t *testing.T) {
	set := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: "web"}, Spec: appsv1.StatefulSetSpec{
		Selector:             &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
		VolumeClaimTemplates: []corev1.PersistentVolumeClaim{{ObjectMeta: metav1.ObjectMeta{Name: "data"}}, {ObjectMeta: metav1.ObjectMeta{Name: "logs"}}}}}
	web := map[string]string{"app": "web", "tier": "x"}
	for _, tc := range []struct {
		name   string
		labels map[string]string
		want   bool
	}{
		{"data-web-0", web, true},
		{"logs-web-12", web, true},
		{"data-web-x-0", web, false}, // StatefulSet web-x's
		{"data-web-01", web, false},  // not an ordinal the controller writes
		{"data-web--1", web, false},
		{"data-web-", web, false},
		{"other-web-0", web, false},
		{"data-web-0", map[string]string{"app": "db"}, false},
		{"data-web-0", nil, false},
	} {
		pvc := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: tc.name, Labels: tc.labels}}
		if got := claimOfSet(pvc, set); got != tc.want {
			t.Errorf("claim %s labels %v: of StatefulSet web %v, want %v", tc.name, tc.labels, got, tc.want)
		}
	}
}
