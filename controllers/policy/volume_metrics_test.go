package policy

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

func TestVolumeSeries(t *testing.T) {
	node := func(name, zone string) corev1.Node {
		n := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}}}
		if zone != "" {
			n.Labels[LabelZone] = zone
		}
		return n
	}
	store := func(name, pool, node string) storev1.Store {
		return storev1.Store{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: storev1.StoreSpec{Pool: pool, NodeName: node}}
	}
	vol := func(name, store, mode string, phase storev1.VolumePhase, bytes int64, nvme bool, hosts ...string) storev1.VolumeState {
		v := storev1.VolumeState{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:   storev1.VolumeStateSpec{StoreName: store, VolumeMode: mode, Policy: storev1.FrozenPolicy{Pool: strings.Split(store, ".")[0]}},
			Status: storev1.VolumeStateStatus{Phase: phase, ActualBytes: bytes}}
		if nvme {
			v.Spec.Policy.ProtocolSpec.NVMeoFTCP = &policyv1.NVMeoFTCPProtocol{}
		}
		for _, h := range hosts {
			v.Spec.Publications = append(v.Spec.Publications, storev1.Publication{NodeName: h})
		}
		return v
	}
	got := VolumeSeries(
		[]storev1.Store{store("fast.a", "fast", "a"), store("fast.b", "fast", "b")},
		[]corev1.Node{node("a", "z1"), node("b", "")},
		[]storev1.VolumeState{
			vol("v1", "fast.a", "Filesystem", storev1.VolumeReady, 100, false, "a"),
			vol("v2", "fast.a", "Filesystem", storev1.VolumeReady, 50, false),
			vol("v3", "fast.a", "Block", storev1.VolumeFailed, 0, false),
			vol("v4", "fast.b", "Block", "", 0, true, "a", "c"),
			vol("v5", "fast.b", "Block", storev1.VolumeReady, 10, true, "a"),
		})
	var lines []string
	for _, s := range got {
		lines = append(lines, fmt.Sprintf("%s%v %g", s.Name, s.Labels, s.Value))
	}
	want := []string{
		"plinth_nvmeof_publications[b a] 2",
		"plinth_nvmeof_publications[b c] 1",
		"plinth_store_info[fast.a fast a z1] 1",
		"plinth_store_info[fast.b fast b ] 1",
		"plinth_volume_size_bytes[fast fast.a Block] 0",
		"plinth_volume_size_bytes[fast fast.a Filesystem] 150",
		"plinth_volume_size_bytes[fast fast.b Block] 10",
		"plinth_volumes[fast fast.a Block Failed] 1",
		"plinth_volumes[fast fast.a Filesystem Ready] 2",
		"plinth_volumes[fast fast.b Block Pending] 1",
		"plinth_volumes[fast fast.b Block Ready] 1",
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Fatalf("series:\n%s\nwant:\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
}
