package fencing

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

const id = "vol-0123456789abcdef0123456789abcdef01234567"

func TestAdmit(t *testing.T) {
	cur := Mark{UID: "u1", Generation: 5, PublicationGeneration: 3}
	released := Mark{UID: "u1", Generation: 6, PublicationGeneration: 3, Released: true}
	tests := []struct {
		name   string
		m      Mark
		found  bool
		w      Work
		reason string // "" = admitted
		want   Mark
	}{
		{"first work", Mark{}, false, Work{UID: "u1", Generation: 1}, "", Mark{UID: "u1", Generation: 1}},
		{"same generation", cur, true, Work{UID: "u1", Generation: 5, PublicationGeneration: 3}, "", cur},
		{"newer generation", cur, true, Work{UID: "u1", Generation: 7, PublicationGeneration: 4}, "", Mark{UID: "u1", Generation: 7, PublicationGeneration: 4}},
		{"stale generation", cur, true, Work{UID: "u1", Generation: 4, PublicationGeneration: 3}, ReasonStaleGeneration, cur},
		{"stale publication generation", cur, true, Work{UID: "u1", Generation: 6, PublicationGeneration: 2}, ReasonStalePublicationGeneration, cur},
		{"new UID while the old one holds the volume", cur, true, Work{UID: "u2", Generation: 1}, ReasonLifecycleConflict, cur},
		{"adoption retires the lifecycle of a lost control plane", cur, true, Work{UID: "u2", Generation: 1, Adopt: true}, "", Mark{UID: "u2", Generation: 1, Retired: []string{"u1"}}},
		{"the adopted-over lifecycle is refused", Mark{UID: "u2", Generation: 1, Retired: []string{"u1"}}, true, Work{UID: "u1", Generation: 6, PublicationGeneration: 4}, ReasonRetiredLifecycle, Mark{UID: "u2", Generation: 1, Retired: []string{"u1"}}},
		{"new lifecycle after release", released, true, Work{UID: "u2", Generation: 1}, "", Mark{UID: "u2", Generation: 1, Retired: []string{"u1"}}},
		{"retired UID", Mark{UID: "u2", Generation: 1, Retired: []string{"u1"}}, true, Work{UID: "u1", Generation: 9}, ReasonRetiredLifecycle, Mark{UID: "u2", Generation: 1, Retired: []string{"u1"}}},
		{"released, not deleting", released, true, Work{UID: "u1", Generation: 6, PublicationGeneration: 3}, ReasonRetiredLifecycle, released},
		{"released, deletion resumes", released, true, Work{UID: "u1", Generation: 6, PublicationGeneration: 3, Deleting: true}, "", released},
		{"no UID", Mark{}, false, Work{Generation: 1}, ReasonLifecycleConflict, Mark{}},
		// the export's boot stays with the lifecycle, and a new lifecycle starts without one
		{"export boot kept", Mark{UID: "u1", Generation: 5, ExportBootID: "b1"}, true, Work{UID: "u1", Generation: 6}, "", Mark{UID: "u1", Generation: 6, ExportBootID: "b1"}},
		{"export boot not inherited", Mark{UID: "u1", Released: true, ExportBootID: "b1"}, true, Work{UID: "u2", Generation: 1}, "", Mark{UID: "u2", Generation: 1, Retired: []string{"u1"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Admit(tc.m, tc.found, tc.w)
			var rej *Rejection
			switch {
			case tc.reason == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.reason != "" && !errors.As(err, &rej):
				t.Fatalf("admitted (err %v), want %s", err, tc.reason)
			case tc.reason != "" && rej.Reason != tc.reason:
				t.Fatalf("reason %s, want %s (%s)", rej.Reason, tc.reason, rej.Message)
			}
			if !got.Equal(tc.want) {
				t.Fatalf("mark %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestEqualComparesExportBoot(t *testing.T) {
	if (Mark{UID: "u1", ExportBootID: "b1"}).Equal(Mark{UID: "u1", ExportBootID: "b2"}) {
		t.Error("marks of different export boots are equal: a new boot would never be saved")
	}
}

func TestAdmitRetiredBounded(t *testing.T) {
	m := Mark{UID: "u0", Released: true}
	for i := 1; i <= MaxRetired+5; i++ {
		uid := "u" + string(rune('a'+i))
		n, err := Admit(m, true, Work{UID: uid, Generation: 1})
		if err != nil {
			t.Fatal(err)
		}
		n.Released = true
		m = n
	}
	if len(m.Retired) != MaxRetired {
		t.Fatalf("%d retired UIDs kept, want %d", len(m.Retired), MaxRetired)
	}
}

func TestStoreRoundTripAndStaleWork(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), "marks"))
	if err != nil {
		t.Fatal(err)
	}
	if _, found, err := s.Load(id); err != nil || found {
		t.Fatalf("empty store: found=%v err=%v", found, err)
	}
	want := Mark{UID: "u1", Generation: 4, PublicationGeneration: 2, Retired: []string{"u0"}}
	if err := s.Save(id, want); err != nil {
		t.Fatal(err)
	}
	// a second Store on the same folder (an agent restart) sees the mark
	s2, _ := Open(s.Dir())
	got, found, err := s2.Load(id)
	if err != nil || !found || !got.Equal(want) {
		t.Fatalf("Load = %+v %v %v, want %+v", got, found, err, want)
	}
	// and refuses work from before the restart
	if _, err := Admit(got, true, Work{UID: "u1", Generation: 3, PublicationGeneration: 2}); err == nil {
		t.Fatal("stale generation admitted after a restart")
	}
	entries, _ := os.ReadDir(s.Dir())
	if len(entries) != 1 {
		t.Fatalf("temp files left behind: %v", entries)
	}
}

func TestLoadCorrupt(t *testing.T) {
	s, _ := Open(t.TempDir())
	for _, data := range []string{"", "{", `{"uid":""}`, `{"uid":"u","generation":-1}`, `{"uid":"u","extra":1}`, "null"} {
		if err := os.WriteFile(s.Path(id), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, _, err := s.Load(id); !errors.Is(err, ErrCorrupt) {
			t.Errorf("Load(%q) = %v, want ErrCorrupt", data, err)
		}
	}
	if _, _, err := s.Load("../etc/passwd"); err == nil {
		t.Error("path-like key accepted")
	}
}

// A mark cut at any byte (a torn write the rename did not protect, a disk that
// lost the tail) is ErrCorrupt naming the file, never a mark to act on.
func TestLoadTornAtEveryByte(t *testing.T) {
	s, _ := Open(t.TempDir())
	if err := s.Save(id, Mark{UID: "u-1", Generation: 3, PublicationGeneration: 2, Retired: []string{"u-0"}}); err != nil {
		t.Fatal(err)
	}
	whole, err := os.ReadFile(s.Path(id))
	if err != nil {
		t.Fatal(err)
	}
	// The last byte is the newline: without it the JSON is whole.
	for n := 0; n < len(whole)-1; n++ {
		if err := os.WriteFile(s.Path(id), whole[:n], 0o600); err != nil {
			t.Fatal(err)
		}
		_, found, err := s.Load(id)
		if !errors.Is(err, ErrCorrupt) || found {
			t.Errorf("mark torn at byte %d of %d: found %v, %v; want ErrCorrupt", n, len(whole), found, err)
		}
	}
}

// Temp files a crash left between create and rename are removed by Open; marks stay.
func TestOpenRemovesCrashTempFiles(t *testing.T) {
	dir := t.TempDir()
	s, _ := Open(dir)
	if err := s.Save(id, Mark{UID: "u-1", Generation: 1}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"." + id + ".123.tmp", ".other.456.tmp"} {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(`{"uid":`), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 || entries[0].Name() != id+".json" {
		t.Errorf("marks folder after Open: %v, want only %s.json", entries, id)
	}
	if m, found, err := s.Load(id); err != nil || !found || m.UID != "u-1" {
		t.Errorf("mark after Open: %+v, %v, %v", m, found, err)
	}
}

func TestLockSerialises(t *testing.T) {
	s, _ := Open(t.TempDir())
	unlock, err := s.Lock(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := s.Lock(ctx, id); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second Lock while held = %v, want deadline exceeded", err)
	}
	other, err := s.Lock(context.Background(), id[:len(id)-1]+"8")
	if err != nil {
		t.Fatal(err)
	}
	other()
	done := make(chan struct{})
	go func() {
		u, err := s.Lock(context.Background(), id)
		if err == nil {
			u()
		}
		close(done)
	}()
	unlock()
	<-done
}
