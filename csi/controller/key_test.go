package controller

import (
	"errors"
	"testing"

	"github.com/plinth-storage/plinth/csi/internal/volume"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
)

// A restore or clone opens with the source's key only: both clear, or one operator Secret.
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
	}{
		{"both clear", nil, nil, true},
		{"one class Secret", class, class, true},
		{"clear into encrypted", nil, class, false},
		{"encrypted into clear", class, nil, false},
		{"another class Secret", class, other, false},
		{"per-volume key", perVolume("pvc-a"), perVolume("pvc-b"), false},
	} {
		err := sameKey(&source{what: "volume v", encryption: tc.src}, tc.dst)
		if tc.ok != (err == nil) || err != nil && !errors.Is(err, volume.ErrInvalid) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}

// The frozen encryption names its Secret: the class's, or the volume's own from its PV name;
// the volume context carries the defaults and the Secret's name.
func TestEncryptionOfAndContext(t *testing.T) {
	e, err := encryptionOf(&policyv1.Encryption{}, "pvc-1")
	if err != nil || e.KeySecret == nil || *e.KeySecret != (policyv1.SecretReference{Name: "plinth-luks-pvc-1", Namespace: "plinth-system"}) {
		t.Fatalf("per-volume: %+v %v", e, err)
	}
	vc := map[string]string{}
	encryptionContext(vc, e)
	if vc[volume.ContextEncryption] != "LUKS2" || vc[volume.ContextCipher] != "aes-xts-plain64" || vc[volume.ContextKeySize] != "512" ||
		vc[volume.ContextKeySecret] != "plinth-system/plinth-luks-pvc-1" {
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
