package vet

import (
	"bytes"
	"fmt"
	"testing"
)

// policyFleet is a policy set of n documents, a third each of StoragePools (LVM thin pools),
// Protocols (half local, half NVMe-oF/TCP) and Placements referring to them: the shape of
// controllers/render's VetAndRender benchmark.
func policyFleet(n int) []byte {
	var b bytes.Buffer
	third := n / 3
	for i := 0; i < n-2*third; i++ {
		fmt.Fprintf(&b, "apiVersion: policy.plinth.dev/v1alpha1\nkind: StoragePool\nmetadata:\n  name: pool-%d\nspec:\n  nodeSelector:\n    matchLabels: {example.com/rack: r%d}\n  backend:\n    lvm: {volumeGroup: vg%d, devices: [/dev/sdb], thinPool: {name: tp, sizePercent: 90}}\n  reserve: 5%%\n  overcommitPercent: 200\n---\n", i, i%100, i)
	}
	for i := 0; i < third; i++ {
		if i%2 == 0 {
			fmt.Fprintf(&b, "apiVersion: policy.plinth.dev/v1alpha1\nkind: Protocol\nmetadata:\n  name: proto-%d\nspec:\n  local: {}\n---\n", i)
		} else {
			fmt.Fprintf(&b, "apiVersion: policy.plinth.dev/v1alpha1\nkind: Protocol\nmetadata:\n  name: proto-%d\nspec:\n  nvmeofTcp: {port: 4420, bindCIDR: 10.20.0.0/16}\n---\n", i)
		}
	}
	for i := 0; i < third; i++ {
		binding := "WaitForFirstConsumer"
		if i%2 == 1 {
			binding = "Immediate" // proto-i is NVMe-oF/TCP
		}
		fmt.Fprintf(&b, "apiVersion: policy.plinth.dev/v1alpha1\nkind: Placement\nmetadata:\n  name: place-%d\nspec:\n  poolRef: {name: pool-%d}\n  protocolRef: {name: proto-%d}\n  storageClass: {name: sc-%d, volumeBindingMode: %s, allowVolumeExpansion: true}\n  filesystem: {fsType: xfs}\n---\n", i, i, i, i, binding)
	}
	return b.Bytes()
}

// BenchmarkVet3kPolicies loads and vets 3,000 policy documents (load, schema, decode and the
// cross-object rules), the vet half of controllers/render's VetAndRender.
func BenchmarkVet3kPolicies(b *testing.B) {
	data := policyFleet(3000)
	v, err := NewVetter()
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		pol, problems := v.Vet(LoadBytes("fleet.yaml", data))
		if len(problems) > 0 {
			b.Fatal(problems[0])
		}
		if n := len(pol.Pools) + len(pol.Protocols) + len(pol.Placements); n != 3000 {
			b.Fatalf("vetted %d documents, want 3000", n)
		}
	}
}
