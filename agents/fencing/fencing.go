package fencing

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sync"

	"github.com/plinth-storage/plinth/internal/failpoint"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// Reasons of a Rejection (PascalCase, used as condition reasons and as the
// reason label of plinth_agent_fencing_rejections_total); defined with the API
// types: see storev1 for when each surfaces.
const (
	ReasonStaleGeneration            = storev1.ReasonStaleGeneration
	ReasonStalePublicationGeneration = storev1.ReasonStalePublicationGeneration
	ReasonRetiredLifecycle           = storev1.ReasonRetiredLifecycle
	ReasonLifecycleConflict          = storev1.ReasonLifecycleConflict
	ReasonCorruptMark                = storev1.ReasonCorruptMark
)

// MaxRetired bounds Mark.Retired (oldest UIDs are dropped first).
const MaxRetired = 16

// ErrCorrupt is wrapped by Load when a mark file exists but does not parse.
var ErrCorrupt = errors.New("corrupt fencing mark")

// Mark is the durable record of one volume on this node.
type Mark struct {
	// UID is the VolumeState UID of the lifecycle the node acts for.
	UID string `json:"uid"`
	// Generation is the highest metadata.generation acted on.
	Generation int64 `json:"generation"`
	// PublicationGeneration is the highest spec.publicationGeneration acted on.
	PublicationGeneration int64 `json:"publicationGeneration"`
	// Released is true once the lifecycle's volume and export are gone.
	Released bool `json:"released,omitempty"`
	// Retired are UIDs of earlier, released lifecycles of the same name
	// (at most MaxRetired, oldest first).
	Retired []string `json:"retired,omitempty"`
	// ExportBootID is the kernel boot (/proc/sys/kernel/random/boot_id) in which
	// the node last made or saw the volume's NVMe-oF export. nvmet configfs does not
	// survive a reboot: an export missing in another boot is restored, not drift.
	ExportBootID string `json:"exportBootID,omitempty"`
}

// Work is what a reconcile wants to act on.
type Work struct {
	// UID, Generation and PublicationGeneration of the VolumeState as read.
	UID                   string
	Generation            int64
	PublicationGeneration int64
	// Deleting is true when the VolumeState has a deletion timestamp.
	Deleting bool
	// Adopt is true when the VolumeState adopts the volume of a lost control plane (the
	// agent checked its identity stamp): an unreleased mark of another UID is retired, as a
	// released one is, instead of refused, and all work of that UID is refused from then on.
	Adopt bool
}

// Rejection is refused work; Reason is one of the Reason constants.
type Rejection struct {
	Reason  string
	Message string
}

func (r *Rejection) Error() string { return "fenced: " + r.Reason + ": " + r.Message }

// Admit decides whether w may run given the current mark (found=false when
// the node never acted on the volume) and returns the mark to persist before
// acting (equal to m when nothing changes). Refusals are *Rejection.
func Admit(m Mark, found bool, w Work) (Mark, error) {
	if w.UID == "" {
		return m, &Rejection{Reason: ReasonLifecycleConflict, Message: "work without a VolumeState UID"}
	}
	if !found {
		return Mark{UID: w.UID, Generation: w.Generation, PublicationGeneration: w.PublicationGeneration}, nil
	}
	for _, r := range m.Retired {
		if r == w.UID {
			return m, &Rejection{Reason: ReasonRetiredLifecycle, Message: fmt.Sprintf("VolumeState UID %s belongs to a lifecycle that ended", w.UID)}
		}
	}
	if m.UID != w.UID {
		if !m.Released && !w.Adopt {
			return m, &Rejection{Reason: ReasonLifecycleConflict, Message: fmt.Sprintf(
				"the volume still belongs to VolumeState UID %s, which never released it; remove the volume and the mark by hand to admit UID %s", m.UID, w.UID)}
		}
		retired := append(append([]string{}, m.Retired...), m.UID)
		if len(retired) > MaxRetired {
			retired = retired[len(retired)-MaxRetired:]
		}
		return Mark{UID: w.UID, Generation: w.Generation, PublicationGeneration: w.PublicationGeneration, Retired: retired}, nil
	}
	if m.Released && !w.Deleting {
		return m, &Rejection{Reason: ReasonRetiredLifecycle, Message: fmt.Sprintf("VolumeState UID %s already released its volume", w.UID)}
	}
	if w.Generation < m.Generation {
		return m, &Rejection{Reason: ReasonStaleGeneration, Message: fmt.Sprintf("generation %d is older than generation %d already acted on", w.Generation, m.Generation)}
	}
	if w.PublicationGeneration < m.PublicationGeneration {
		return m, &Rejection{Reason: ReasonStalePublicationGeneration, Message: fmt.Sprintf(
			"publicationGeneration %d is older than publicationGeneration %d already acted on", w.PublicationGeneration, m.PublicationGeneration)}
	}
	n := m
	n.Retired = append([]string(nil), m.Retired...)
	n.Generation, n.PublicationGeneration = w.Generation, w.PublicationGeneration
	return n, nil
}

// Equal reports whether two marks are the same.
func (m Mark) Equal(o Mark) bool {
	if m.UID != o.UID || m.Generation != o.Generation || m.PublicationGeneration != o.PublicationGeneration ||
		m.Released != o.Released || m.ExportBootID != o.ExportBootID || len(m.Retired) != len(o.Retired) {
		return false
	}
	for i := range m.Retired {
		if m.Retired[i] != o.Retired[i] {
			return false
		}
	}
	return true
}

var keyRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$`)

// Store keeps marks in one directory. Safe for concurrent use; Lock
// serialises the work on one volume inside this process.
type Store struct {
	dir   string
	mu    sync.Mutex
	locks map[string]chan struct{}
}

// Open returns the store of dir (created 0700 when missing), for example
// /var/lib/plinth/agent/marks, after removing the temp files of marks whose
// write a crash interrupted before the rename (the mark itself is then the
// old one). Open before any Save of the process: one agent per node owns dir.
func Open(dir string) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("fencing marks: %w", err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("fencing marks: %w", err)
	}
	for _, e := range entries {
		if tempName.MatchString(e.Name()) && e.Type().IsRegular() {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return nil, fmt.Errorf("fencing marks: remove temp file left by a crash: %w", err)
			}
		}
	}
	return &Store{dir: dir, locks: map[string]chan struct{}{}}, nil
}

// tempName matches the temp files Save creates ("."+id+".*.tmp").
var tempName = regexp.MustCompile(`^\..+\.tmp$`)

// Dir returns the marks directory.
func (s *Store) Dir() string { return s.dir }

// Path returns the mark file of a volume id.
func (s *Store) Path(id string) string { return filepath.Join(s.dir, id+".json") }

// Lock takes the per-volume lock, waiting until ctx is done; call the
// returned function to release it.
func (s *Store) Lock(ctx context.Context, id string) (func(), error) {
	for {
		s.mu.Lock()
		ch, held := s.locks[id]
		if !held {
			ch = make(chan struct{})
			s.locks[id] = ch
			s.mu.Unlock()
			return func() {
				s.mu.Lock()
				delete(s.locks, id)
				close(ch)
				s.mu.Unlock()
			}, nil
		}
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Load reads the mark of id; found is false when there is none. A mark file
// that does not parse, or lacks its UID, wraps ErrCorrupt.
func (s *Store) Load(id string) (m Mark, found bool, err error) {
	if !keyRe.MatchString(id) {
		return Mark{}, false, fmt.Errorf("fencing mark key %q: invalid", id)
	}
	data, err := os.ReadFile(s.Path(id))
	if errors.Is(err, fs.ErrNotExist) {
		return Mark{}, false, nil
	}
	if err != nil {
		return Mark{}, false, fmt.Errorf("fencing mark %s: %w", id, err)
	}
	m, err = decodeMark(data)
	if err != nil {
		return Mark{}, false, fmt.Errorf("fencing mark %s: %w", s.Path(id), err)
	}
	return m, true, nil
}

// decodeMark parses the content of a mark file: one JSON object of Mark's fields (no other
// field) with a UID and no negative generation, and nothing after it but white space. Errors
// wrap ErrCorrupt.
func decodeMark(data []byte) (Mark, error) {
	var m Mark
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return Mark{}, fmt.Errorf("%v: %w", err, ErrCorrupt)
	}
	// Decode stops after the first JSON value: a mark followed by more (a second object,
	// stray bytes) is not a mark this agent wrote, and is refused rather than half-read.
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return Mark{}, fmt.Errorf("data after the mark: %w", ErrCorrupt)
	}
	if m.UID == "" || m.Generation < 0 || m.PublicationGeneration < 0 {
		return Mark{}, fmt.Errorf("missing uid or negative generation: %w", ErrCorrupt)
	}
	return m, nil
}

// Save writes the mark of id durably: a temp file in the same directory,
// fsync, rename over the old mark, fsync of the directory.
func (s *Store) Save(id string, m Mark) error {
	if !keyRe.MatchString(id) {
		return fmt.Errorf("fencing mark key %q: invalid", id)
	}
	data, err := json.Marshal(m)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(s.dir, "."+id+".*.tmp")
	if err != nil {
		return fmt.Errorf("fencing mark %s: %w", id, err)
	}
	name := tmp.Name()
	defer os.Remove(name) // no-op after the rename
	// two writes so that a fault test can stop the process between them
	// (failpoint.FencingMarkTorn): a torn temp file, as a crash mid-write leaves
	body := append(data, '\n')
	half := len(body) / 2
	if _, err := tmp.Write(body[:half]); err != nil {
		tmp.Close()
		return fmt.Errorf("fencing mark %s: %w", id, err)
	}
	failpoint.Hit(failpoint.FencingMarkTorn)
	if _, err := tmp.Write(body[half:]); err != nil {
		tmp.Close()
		return fmt.Errorf("fencing mark %s: %w", id, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("fencing mark %s: fsync: %w", id, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("fencing mark %s: %w", id, err)
	}
	if err := os.Rename(name, s.Path(id)); err != nil {
		return fmt.Errorf("fencing mark %s: %w", id, err)
	}
	d, err := os.Open(s.dir)
	if err != nil {
		return fmt.Errorf("fencing mark %s: %w", id, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fencing mark %s: fsync directory: %w", id, err)
	}
	return nil
}
