package storageclass

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func sc(fsType string, expand bool, reclaim corev1.PersistentVolumeReclaimPolicy, mode storagev1.VolumeBindingMode) *storagev1.StorageClass {
	return &storagev1.StorageClass{
		ObjectMeta:           metav1.ObjectMeta{Name: "fast"},
		Provisioner:          "csi.plinth.dev",
		Parameters:           map[string]string{"plinth.dev/pool": "vg0", "csi.storage.k8s.io/fstype": fsType},
		ReclaimPolicy:        &reclaim,
		VolumeBindingMode:    &mode,
		AllowVolumeExpansion: &expand,
	}
}

// TestFsTypeChangeNeedsReplacement: fsType changes need a replacement, allowVolumeExpansion is
// patched in place; the same for provisioner, reclaimPolicy and volumeBindingMode.
func TestFsTypeChangeNeedsReplacement(t *testing.T) {
	live := sc("xfs", false, corev1.PersistentVolumeReclaimDelete, storagev1.VolumeBindingWaitForFirstConsumer)
	v2 := sc("ext4", true, corev1.PersistentVolumeReclaimDelete, storagev1.VolumeBindingWaitForFirstConsumer)
	changes := Diff(live, v2)
	if len(changes) != 2 {
		t.Fatalf("changes = %v", changes)
	}
	if c := changes[0]; c.Field != "allowVolumeExpansion" || c.Immutable || c.Live != "false" || c.Desired != "true" {
		t.Errorf("allowVolumeExpansion change: %+v", c)
	}
	if c := changes[1]; c.Field != "parameters.csi.storage.k8s.io/fstype" || !c.Immutable {
		t.Errorf("fsType change: %+v", c)
	}
	if got := Describe(Immutable(changes)); got != `parameters.csi.storage.k8s.io/fstype: "xfs" → "ext4"` {
		t.Errorf("Describe = %s", got)
	}

	cases := []struct {
		name    string
		desired *storagev1.StorageClass
		field   string
	}{
		{"reclaimPolicy", sc("xfs", false, corev1.PersistentVolumeReclaimRetain, storagev1.VolumeBindingWaitForFirstConsumer), "reclaimPolicy"},
		{"volumeBindingMode", sc("xfs", false, corev1.PersistentVolumeReclaimDelete, storagev1.VolumeBindingImmediate), "volumeBindingMode"},
		{"provisioner", func() *storagev1.StorageClass {
			s := sc("xfs", false, corev1.PersistentVolumeReclaimDelete, storagev1.VolumeBindingWaitForFirstConsumer)
			s.Provisioner = "other.csi"
			return s
		}(), "provisioner"},
		{"new parameter", func() *storagev1.StorageClass {
			s := sc("xfs", false, corev1.PersistentVolumeReclaimDelete, storagev1.VolumeBindingWaitForFirstConsumer)
			s.Parameters["plinth.dev/protocol"] = "local"
			return s
		}(), "parameters.plinth.dev/protocol"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			im := Immutable(Diff(live, c.desired))
			if len(im) != 1 || im[0].Field != c.field {
				t.Fatalf("immutable = %v", im)
			}
		})
	}
}

// TestServerDefaultsAreNoChange: a live class the server defaulted (reclaimPolicy Delete,
// volumeBindingMode Immediate) equals a desired class that states those defaults.
func TestServerDefaultsAreNoChange(t *testing.T) {
	live := sc("ext4", false, corev1.PersistentVolumeReclaimDelete, storagev1.VolumeBindingImmediate)
	live.ReclaimPolicy, live.VolumeBindingMode, live.AllowVolumeExpansion = nil, nil, nil
	desired := sc("ext4", false, corev1.PersistentVolumeReclaimDelete, storagev1.VolumeBindingImmediate)
	if ch := Diff(live, desired); len(ch) != 0 {
		t.Fatalf("defaults reported as changes: %v", ch)
	}
	desired = sc("ext4", false, corev1.PersistentVolumeReclaimDelete, storagev1.VolumeBindingWaitForFirstConsumer)
	if im := Immutable(Diff(live, desired)); len(im) != 1 || im[0].Field != "volumeBindingMode" {
		t.Fatalf("an explicit WaitForFirstConsumer over the Immediate default is an immutable change: %v", im)
	}
}

func TestKeepImmutableAndReplacement(t *testing.T) {
	live := sc("xfs", false, corev1.PersistentVolumeReclaimDelete, storagev1.VolumeBindingWaitForFirstConsumer)
	live.Annotations = map[string]string{DefaultClassAnnotation: "true"}
	desired := sc("ext4", true, corev1.PersistentVolumeReclaimRetain, storagev1.VolumeBindingWaitForFirstConsumer)
	keep := KeepImmutable(desired, live)
	if ch := Diff(live, keep); len(ch) != 1 || ch[0].Field != "allowVolumeExpansion" {
		t.Fatalf("KeepImmutable leaves %v", ch)
	}
	if desired.Parameters["csi.storage.k8s.io/fstype"] != "ext4" {
		t.Fatal("KeepImmutable modified its input")
	}
	r := Replacement(desired, live)
	if r.Annotations[DefaultClassAnnotation] != "true" || r.Parameters["csi.storage.k8s.io/fstype"] != "ext4" {
		t.Fatalf("replacement: %+v", r)
	}
	if desired.Annotations != nil {
		t.Fatal("Replacement modified its input")
	}
}
