package vet

import (
	"runtime"
	"testing"
)

// liveHeap is the heap in use after two collections, in bytes.
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// TestVetterKeepsNoMemoryPerDocument judges 3,000 documents with one Vetter, as the
// controller's long-lived Vetter does over time, and wants its heap not to grow with them:
// a way of judging that registers each document in the cue.Context (BuildFile keeps about
// 47 KiB per document, 140 MiB here) must not come back.
func TestVetterKeepsNoMemoryPerDocument(t *testing.T) {
	set := LoadBytes("fleet.yaml", policyFleet(300))
	v, err := NewVetter()
	if err != nil {
		t.Fatal(err)
	}
	judge := func() {
		for _, d := range set.Documents {
			if vr := v.Judge(d); len(vr.Problems) > 0 {
				t.Fatalf("%s: %v", d.Name, vr.Problems)
			}
		}
	}
	judge() // the schema's own evaluation, once
	before := liveHeap()
	for range 10 {
		judge()
	}
	after := liveHeap()
	runtime.KeepAlive(v) // the Vetter, with its cue.Context, is what must not grow
	const limit = 4 << 20
	if after > before+limit {
		t.Errorf("heap grew from %d KiB to %d KiB over 3,000 documents judged; want less than %d KiB", before>>10, after>>10, limit>>10)
	}
	t.Logf("heap %d KiB before, %d KiB after 3,000 documents judged", before>>10, after>>10)
}
