package nvmet

import (
	"context"
	"errors"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

// Inspect returns the observed state of subsystem nqn, or ErrNotFound. It
// takes the subsystem's lock, so it never sees an export half-way.
func (t *Target) Inspect(ctx context.Context, nqn string) (Export, error) {
	if err := ValidateNQN(nqn); err != nil {
		return Export{}, err
	}
	unlock, err := t.subsys.lock(ctx, nqn)
	if err != nil {
		return Export{}, err
	}
	defer unlock()
	ok, err := t.fs.Exists(t.subsysDir(nqn))
	if err != nil {
		return Export{}, err
	}
	if !ok {
		return Export{}, ErrNotFound
	}
	t.portsMu.Lock()
	ports, err := t.listPorts()
	t.portsMu.Unlock()
	if err != nil {
		return Export{}, err
	}
	return t.readExport(nqn, ports)
}

// List returns the observed state of every subsystem under the root (Plinth's
// and others'; see VolumeIDFromNQN), sorted by NQN, for drift detection. It
// reads without the subsystem locks: an export in progress may show half-way,
// and a subsystem removed while listing is left out.
func (t *Target) List(ctx context.Context) ([]Export, error) {
	names, err := t.fs.ReadDir(filepath.Join(t.root, "subsystems"))
	if err != nil {
		return nil, err
	}
	ports, err := t.listPorts()
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	out := make([]Export, 0, len(names))
	for _, n := range names {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		e, err := t.readExport(n, ports)
		if errors.Is(err, syscall.ENOENT) {
			continue // removed while listing
		}
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, nil
}

func (t *Target) readExport(nqn string, ports []portEntry) (Export, error) {
	sdir := t.subsysDir(nqn)
	e := Export{NQN: nqn}
	serial, err := t.fs.ReadAttr(filepath.Join(sdir, "attr_serial"))
	if err != nil {
		return Export{}, err
	}
	e.Serial = strings.TrimRight(serial, " ")
	anyHost, err := t.fs.ReadAttr(filepath.Join(sdir, "attr_allow_any_host"))
	if err != nil {
		return Export{}, err
	}
	e.AllowAnyHost = anyHost == "1"
	if e.Hosts, err = t.fs.ReadDir(filepath.Join(sdir, "allowed_hosts")); err != nil {
		return Export{}, err
	}
	sort.Strings(e.Hosts)
	for _, h := range e.Hosts {
		a, ok, err := t.readHostAuth(h)
		if errors.Is(err, syscall.ENOENT) {
			continue // the entry went with the link meanwhile
		}
		if err != nil {
			return Export{}, err
		}
		if ok && a.Key != "" {
			if e.HostAuth == nil {
				e.HostAuth = map[string]HostAuth{}
			}
			e.HostAuth[h] = a
		}
	}
	nss, err := t.fs.ReadDir(filepath.Join(sdir, "namespaces"))
	if err != nil {
		return Export{}, err
	}
	for _, n := range nss {
		id, err := strconv.ParseUint(n, 0, 32)
		if err != nil {
			continue
		}
		ns, err := t.readNamespace(nqn, uint32(id))
		if err != nil {
			return Export{}, err
		}
		e.Namespaces = append(e.Namespaces, ns)
	}
	sort.Slice(e.Namespaces, func(i, j int) bool { return e.Namespaces[i].ID < e.Namespaces[j].ID })
	for _, p := range ports {
		for _, s := range p.subsystems {
			if s == nqn {
				e.Ports = append(e.Ports, p.Port)
			}
		}
	}
	return e, nil
}
