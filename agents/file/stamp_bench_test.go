package file

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/plinth-storage/plinth/agents/backend"
)

// BenchmarkListStamped1000 is the agent's scan of a Store of 1,000 file volumes (one List, as
// each refresh does), with an identity record beside each image and, as the floor, without.
// No loop device is attached (the images are sparse files): the cost measured is the
// directory, the records and the loop index.
func BenchmarkListStamped1000(b *testing.B) {
	for _, stamped := range []bool{false, true} {
		b.Run(fmt.Sprintf("stamped=%v", stamped), func(b *testing.B) {
			f, err := New(Config{Directory: b.TempDir()})
			if err != nil {
				b.Fatal(err)
			}
			for i := range 1000 {
				id := backend.VolumeID(fmt.Sprintf("bench-%d", i))
				if err := os.WriteFile(filepath.Join(f.cfg.Directory, id+suffix), nil, 0o600); err != nil {
					b.Fatal(err)
				}
				if err := os.Truncate(filepath.Join(f.cfg.Directory, id+suffix), 1<<30); err != nil {
					b.Fatal(err)
				}
				if stamped {
					if err := f.Stamp(context.Background(), stampOf(id, 1<<30)); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				vols, err := f.List(context.Background())
				if err != nil || len(vols) != 1000 || (stamped && vols[999].Stamp == nil) {
					b.Fatalf("%d volumes, %v", len(vols), err)
				}
			}
		})
	}
}
