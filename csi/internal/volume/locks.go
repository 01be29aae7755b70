package volume

import "sync"

// Locks serialises operations per id (volume or snapshot); the zero value is ready to use.
type Locks struct {
	mu   sync.Mutex
	held map[string]struct{}
}

// Acquire takes id's lock, or returns ErrBusy while another operation holds it (CSI spec,
// "Concurrency": "operation pending for volume"; the CO retries). release gives it back.
func (l *Locks) Acquire(id string) (release func(), err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, busy := l.held[id]; busy {
		return nil, Errorf(ErrBusy, "an operation on volume %s is in progress", id)
	}
	if l.held == nil {
		l.held = map[string]struct{}{}
	}
	l.held[id] = struct{}{}
	return func() {
		l.mu.Lock()
		delete(l.held, id)
		l.mu.Unlock()
	}, nil
}
