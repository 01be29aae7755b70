package capacity

import (
	"context"
	"fmt"
	"testing"

	fwk "k8s.io/kube-scheduler/framework"

	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

const benchNodes = 5000

func benchSetup(b *testing.B) (*fixture, []fwk.NodeInfo, result) {
	f := newFixture(b)
	nodes := make([]fwk.NodeInfo, benchNodes)
	for i := range nodes {
		name := fmt.Sprintf("worker-%04d.rack-%02d.example.com", i, i%40)
		// Node i has i GiB free: every node fits a 1 GiB request except node 0.
		free := int64(i) * GiB
		f.store("pool-a", name, &storev1.Capacity{Total: 8 * TiB, Allocatable: 8 * TiB, Provisioned: 8*TiB - free, Available: free})
		n := mkNode(name, nil)
		nodes[i] = &n // as the framework does: a pointer in the interface, no copy per call
	}
	pod := f.pod("p", "spread", GiB)
	r := result{state: newCycleState()}
	if _, s := f.p.PreFilter(context.Background(), r.state, pod, nil); !s.IsSuccess() {
		b.Fatal(s)
	}
	return f, nodes, r
}

// BenchmarkFilterScore runs Filter and Score on every one of 5,000 nodes (one pod, one
// claim), as one scheduling cycle does; ns/node is the cost per node.
func BenchmarkFilterScore(b *testing.B) {
	f, nodes, r := benchSetup(b)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		for i := 1; i < len(nodes); i++ {
			if s := f.p.Filter(ctx, r.state, nil, nodes[i]); s != nil {
				b.Fatal(s)
			}
			if _, s := f.p.Score(ctx, r.state, nil, nodes[i]); s != nil {
				b.Fatal(s)
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(nodes)-1), "ns/node")
}

// BenchmarkFilterRejected is Filter on nodes that fail (the status carries a message).
func BenchmarkFilterRejected(b *testing.B) {
	f, nodes, r := benchSetup(b)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if s := f.p.Filter(ctx, r.state, nil, nodes[0]); s.IsSuccess() {
			b.Fatal("node 0 passed")
		}
	}
}

// BenchmarkNormalizeScore normalizes 5,000 distinct raw scores (once per pod).
func BenchmarkNormalizeScore(b *testing.B) {
	list := make(fwk.NodeScoreList, benchNodes)
	b.ReportAllocs()
	for b.Loop() {
		for i := range list {
			list[i].Score = int64(i) * GiB
		}
		normalize(list, true)
	}
}
