package controller

import (
	"errors"
	"slices"
	"strconv"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/plinth-storage/plinth/csi/internal/volume"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// A restore or clone opens with the source's key only: both clear, one operator Secret, or
// Plinth's own key Secrets (the new one a copy of the source's); the header's labels follow.
func TestSameKey(t *testing.T) {
	class := &policyv1.Encryption{KeySecret: &policyv1.SecretReference{Name: "team-key", Namespace: "apps"}}
	other := &policyv1.Encryption{KeySecret: &policyv1.SecretReference{Name: "other-key", Namespace: "apps"}}
	perVolume := func(pv string) *policyv1.Encryption {
		e, err := encryptionOf(&policyv1.Encryption{}, pv)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	for _, tc := range []struct {
		name     string
		src, dst *policyv1.Encryption
		ok       bool
		copyFrom string // the Secret the new volume's key copies
	}{
		{"both clear", nil, nil, true, ""},
		{"one class Secret", class, class, true, ""},
		{"clear into encrypted", nil, class, false, ""},
		{"encrypted into clear", class, nil, false, ""},
		{"another class Secret", class, other, false, ""},
		{"per-volume key", perVolume("pvc-a"), perVolume("pvc-b"), true, "plinth-keys/plinth-luks-pvc-a"},
		{"per-volume key into a class Secret", perVolume("pvc-a"), class, false, ""},
		{"class Secret into per-volume keys", class, perVolume("pvc-b"), false, ""},
	} {
		o, err := sameKey(&source{what: "volume v", encryption: tc.src, headerLabels: []string{"pvc-v", "pvc-u"}}, tc.dst)
		if tc.ok != (err == nil) || err != nil && !errors.Is(err, volume.ErrInvalid) {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		switch {
		case err != nil || tc.src == nil:
			if o != nil {
				t.Errorf("%s: key origin %+v", tc.name, o)
			}
		case o == nil || !slices.Equal(o.HeaderLabels, []string{"pvc-v", "pvc-u"}):
			t.Errorf("%s: key origin %+v, want the source's header labels", tc.name, o)
		case tc.copyFrom == "" && o.Secret != nil, tc.copyFrom != "" && (o.Secret == nil || o.Secret.Namespace+"/"+o.Secret.Name != tc.copyFrom):
			t.Errorf("%s: copies the key of %v, want %q", tc.name, o.Secret, tc.copyFrom)
		}
	}
}

// A restore's header labels are bounded: the nearest MaxHeaderLabels are kept.
func TestKeyOriginBoundsLabels(t *testing.T) {
	var labels []string
	for i := range storev1.MaxHeaderLabels + 3 {
		labels = append(labels, "vol-"+strconv.Itoa(i))
	}
	o := keyOrigin(labels, nil, nil)
	if len(o.HeaderLabels) != storev1.MaxHeaderLabels || o.HeaderLabels[0] != "vol-0" {
		t.Errorf("labels %v", o.HeaderLabels)
	}
}

// The capacity asked of an encrypted volume is what the mapping gets: the backend is the
// LUKS2 header larger, and the size reported is the backend's less the header.
func TestEncryptedSizes(t *testing.T) {
	h := headerBytes(&policyv1.Encryption{})
	if h != 16<<20 || headerBytes(nil) != 0 {
		t.Fatalf("header %d bytes", h)
	}
	r := backendRange(&csipb.CapacityRange{RequiredBytes: 64 << 20, LimitBytes: 128 << 20}, h)
	if r.GetRequiredBytes() != 80<<20 || r.GetLimitBytes() != 144<<20 {
		t.Errorf("backend range %v", r)
	}
	if r := backendRange(&csipb.CapacityRange{}, h); r.GetRequiredBytes() != 0 || r.GetLimitBytes() != 0 {
		t.Errorf("an unset range became %v", r)
	}
	vs := &storev1.VolumeState{Spec: storev1.VolumeStateSpec{Policy: storev1.FrozenPolicy{Encryption: &policyv1.Encryption{}}}}
	if got := usableBytes(vs, 80<<20); got != 64<<20 {
		t.Errorf("usable %d", got)
	}
	if got := usableBytes(&storev1.VolumeState{}, 80<<20); got != 80<<20 {
		t.Errorf("usable of a clear volume %d", got)
	}
}

// The frozen encryption names its Secret: the class's, or the volume's own from its PV name;
// the volume context carries the defaults and the Secret's name.
func TestEncryptionOfAndContext(t *testing.T) {
	e, err := encryptionOf(&policyv1.Encryption{}, "pvc-1")
	if err != nil || e.KeySecret == nil || *e.KeySecret != (policyv1.SecretReference{Name: "plinth-luks-pvc-1", Namespace: "plinth-keys"}) {
		t.Fatalf("per-volume: %+v %v", e, err)
	}
	vc := map[string]string{}
	encryptionContext(vc, e)
	if vc[volume.ContextEncryption] != "LUKS2" || vc[volume.ContextCipher] != "aes-xts-plain64" || vc[volume.ContextKeySize] != "512" ||
		vc[volume.ContextKeySecret] != "plinth-keys/plinth-luks-pvc-1" {
		t.Errorf("volume context %v", vc)
	}
	c, err := encryptionOf(&policyv1.Encryption{KeySize: 256, KeySecret: &policyv1.SecretReference{Name: "k", Namespace: "apps"}}, "PVC/Upper")
	if err != nil || c.KeySecret.Name != "k" || c.KeySize != 256 {
		t.Errorf("class Secret (any CSI name): %+v %v", c, err)
	}
	if _, err := encryptionOf(&policyv1.Encryption{}, "PVC/Upper"); !errors.Is(err, volume.ErrInvalid) {
		t.Errorf("per-volume key of a name that makes no Secret name: %v", err)
	}
	if e, err := encryptionOf(nil, "pvc-1"); e != nil || err != nil {
		t.Errorf("clear: %+v %v", e, err)
	}
}
