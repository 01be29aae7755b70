package nvmeauth

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
)

func proto(name string, a *policyv1.NVMeoFAuth) policyv1.Protocol {
	return policyv1.Protocol{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: policyv1.ProtocolSpec{NVMeoFTCP: &policyv1.NVMeoFTCPProtocol{BindCIDR: "10.0.0.0/8", Auth: a}}}
}

func TestWantedOf(t *testing.T) {
	for name, tc := range map[string]struct {
		in   []policyv1.Protocol
		want Wanted
	}{
		"none":              {nil, Wanted{}},
		"no auth field":     {[]policyv1.Protocol{proto("a", nil)}, Wanted{}},
		"mode None":         {[]policyv1.Protocol{proto("a", &policyv1.NVMeoFAuth{Mode: policyv1.AuthNone, Hash: "sha512"})}, Wanted{}},
		"default hash":      {[]policyv1.Protocol{proto("a", &policyv1.NVMeoFAuth{Mode: policyv1.AuthDHHMACCHAP})}, Wanted{On: true, Hash: "sha256"}},
		"first by name":     {[]policyv1.Protocol{proto("b", &policyv1.NVMeoFAuth{Mode: policyv1.AuthDHHMACCHAP, Hash: "sha512"}), proto("a", &policyv1.NVMeoFAuth{Mode: policyv1.AuthDHHMACCHAP, Hash: "sha384"})}, Wanted{On: true, Hash: "sha384"}},
		"local is not nvme": {[]policyv1.Protocol{{ObjectMeta: metav1.ObjectMeta{Name: "l"}, Spec: policyv1.ProtocolSpec{Local: &policyv1.LocalProtocol{}}}}, Wanted{}},
	} {
		if got := WantedOf(tc.in); got != tc.want {
			t.Errorf("%s: %+v, want %+v", name, got, tc.want)
		}
	}
}

func TestWantedKeyGeneration(t *testing.T) {
	on := func(gen int64) *policyv1.NVMeoFAuth {
		return &policyv1.NVMeoFAuth{Mode: policyv1.AuthDHHMACCHAP, KeyGeneration: gen}
	}
	// the highest keyGeneration of the Protocols with auth; a Protocol without auth has none
	got := WantedOf([]policyv1.Protocol{proto("a", on(1)), proto("b", on(3)), proto("c", &policyv1.NVMeoFAuth{Mode: policyv1.AuthNone, KeyGeneration: 9})})
	if want := (Wanted{On: true, Hash: "sha256", KeyGeneration: 3}); got != want {
		t.Errorf("%+v, want %+v", got, want)
	}
}
