package render

import (
	"bytes"
	"fmt"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/plinth-storage/plinth/schema/vet"
)

// fleet builds a policy set of about n documents (a third each of pools, protocols and
// placements) and nodes Nodes in racks of ten; each pool selects one rack.
func fleet(n, nodes int) ([]byte, []corev1.Node) {
	var b bytes.Buffer
	third := n / 3
	racks := nodes / 10
	for i := 0; i < n-2*third; i++ {
		fmt.Fprintf(&b, "apiVersion: policy.plinth.dev/v1alpha1\nkind: StoragePool\nmetadata:\n  name: pool-%d\nspec:\n  nodeSelector:\n    matchLabels: {example.com/rack: r%d}\n  backend:\n    lvm: {volumeGroup: vg%d, devices: [/dev/sdb], thinPool: {name: tp, sizePercent: 90}}\n  reserve: 5%%\n  overcommitPercent: 200\n---\n", i, i%racks, i)
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
			binding = "Immediate"
		}
		fmt.Fprintf(&b, "apiVersion: policy.plinth.dev/v1alpha1\nkind: Placement\nmetadata:\n  name: place-%d\nspec:\n  poolRef: {name: pool-%d}\n  protocolRef: {name: proto-%d}\n  storageClass: {name: sc-%d, volumeBindingMode: %s, allowVolumeExpansion: true}\n  filesystem: {fsType: xfs}\n---\n", i, i, i, i, binding)
	}
	ns := make([]corev1.Node, nodes)
	for i := range ns {
		ns[i].Name = fmt.Sprintf("node-%04d", i)
		ns[i].Labels = map[string]string{"example.com/rack": fmt.Sprintf("r%d", i/10), "kubernetes.io/hostname": ns[i].Name}
	}
	return b.Bytes(), ns
}

// cpuTime is the CPU time (user + system) this process has used: on a shared machine the
// benchmarks report it per operation (cpu-s/op) beside the wall clock, which waits for other
// processes' turns. Run them with -cpu 1 (GOMAXPROCS=1) for "on one core".
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkVetAndRender10kPolicies1kNodes loads, vets and renders 10,000 policy documents
// over 1,000 nodes — the whole offline pipeline of `plinth render` except file I/O. Reports
// cpu-s/op (the process's CPU time, garbage collection included).
func BenchmarkVetAndRender10kPolicies1kNodes(b *testing.B) {
	data, nodes := fleet(10000, 1000)
	v, err := vet.NewVetter()
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime(b)
	for i := 0; i < b.N; i++ {
		set := vet.LoadBytes("fleet.yaml", data)
		pol, problems := v.Vet(set)
		if len(problems) > 0 {
			b.Fatalf("fleet has problems: %v", problems[0])
		}
		out, err := Render(Input{Pools: pol.Pools, Protocols: pol.Protocols, Placements: pol.Placements, Nodes: nodes})
		if err != nil {
			b.Fatal(err)
		}
		if len(out.StorageClasses) != 3333 || len(out.Stores) != 3334*10 {
			b.Fatalf("rendered %d classes, %d stores", len(out.StorageClasses), len(out.Stores))
		}
	}
	b.ReportMetric((cpuTime(b)-cpu0).Seconds()/float64(b.N), "cpu-s/op")
}

// BenchmarkRender10kPolicies1kNodes measures render alone on the decoded set; cpu-s/op as above.
func BenchmarkRender10kPolicies1kNodes(b *testing.B) {
	data, nodes := fleet(10000, 1000)
	v, err := vet.NewVetter()
	if err != nil {
		b.Fatal(err)
	}
	pol, problems := v.Vet(vet.LoadBytes("fleet.yaml", data))
	if len(problems) > 0 {
		b.Fatal(problems[0])
	}
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime(b)
	for i := 0; i < b.N; i++ {
		if _, err := Render(Input{Pools: pol.Pools, Protocols: pol.Protocols, Placements: pol.Placements, Nodes: nodes}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric((cpuTime(b)-cpu0).Seconds()/float64(b.N), "cpu-s/op")
}
