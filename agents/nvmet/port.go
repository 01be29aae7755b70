package nvmet

import (
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"syscall"
)

// portEntry is a port directory as found under ports/.
type portEntry struct {
	name string // directory name as created (kstrtou16 base 0)
	Port
	subsystems []string
}

// sameAddress reports whether p listens where want does.
func (p Port) sameAddress(want Port) bool {
	if p.Transport != want.Transport || p.Family != want.Family || p.ServiceID != want.ServiceID {
		return false
	}
	a, b := net.ParseIP(p.Address), net.ParseIP(want.Address)
	return a != nil && a.Equal(b)
}

// DerivePortID returns the stable port id Plinth gives a new port for an
// address: 1 + FNV-1a(trtype|adrfam|traddr|trsvcid) mod 65535. A port that
// already listens on the address keeps its id; a collision with a port in
// use elsewhere probes the next id.
func DerivePortID(p Port) uint16 {
	h := fnv.New32a()
	ip := net.ParseIP(p.Address)
	addr := p.Address
	if ip != nil {
		addr = ip.String()
	}
	fmt.Fprintf(h, "%s|%s|%s|%s", p.Transport, p.Family, addr, p.ServiceID)
	return uint16(1 + h.Sum32()%65535)
}

func (t *Target) readPort(name string) (portEntry, error) {
	dir := t.portDir(name)
	id, err := strconv.ParseUint(name, 0, 16)
	if err != nil {
		return portEntry{}, fmt.Errorf("nvmet port directory %s: %w", dir, err)
	}
	e := portEntry{name: name, Port: Port{ID: uint16(id)}}
	for _, a := range []struct {
		attr string
		dst  *string
	}{
		{"addr_trtype", &e.Transport},
		{"addr_adrfam", &e.Family},
		{"addr_traddr", &e.Address},
		{"addr_trsvcid", &e.ServiceID},
	} {
		if *a.dst, err = t.fs.ReadAttr(filepath.Join(dir, a.attr)); err != nil {
			return portEntry{}, err
		}
	}
	if e.subsystems, err = t.fs.ReadDir(filepath.Join(dir, "subsystems")); err != nil {
		return portEntry{}, err
	}
	sort.Strings(e.subsystems)
	return e, nil
}

func (t *Target) listPorts() ([]portEntry, error) {
	names, err := t.fs.ReadDir(filepath.Join(t.root, "ports"))
	if err != nil {
		return nil, err
	}
	var ports []portEntry
	for _, n := range names {
		e, err := t.readPort(n)
		if err != nil {
			return nil, err
		}
		ports = append(ports, e)
	}
	sort.Slice(ports, func(i, j int) bool { return ports[i].ID < ports[j].ID })
	return ports, nil
}

// linkPort finds or creates the port listening on want's address, links the
// subsystem into it, checks the link, and removes the subsystem's links to
// any other port (removing ports left without links).
func (t *Target) linkPort(nqn string, want Port, c *changes) (Port, error) {
	t.portsMu.Lock()
	defer t.portsMu.Unlock()

	port, err := t.ensurePort(want, c)
	if err != nil {
		return Port{}, err
	}
	dir := t.portDir(port.name)
	link := filepath.Join(dir, "subsystems", nqn)
	// The first link enables the port: the transport binds its listener
	// here, so EADDRNOTAVAIL/EADDRINUSE surface as this symlink's error.
	if err := t.symlink(t.subsysDir(nqn), link, c); err != nil {
		err = fmt.Errorf("link subsystem into port %s: %w", port.name, err)
		if len(port.subsystems) == 0 {
			// Do not leave a disabled port with an address that cannot be
			// bound; a retry creates it again.
			if rerr := t.fs.Rmdir(dir); rerr == nil {
				c.add("rmdir %s", dir)
			} else {
				err = errors.Join(err, rerr)
			}
		}
		return Port{}, err
	}
	// Post-condition: the link is there and names nqn (a subsystem never left unlinked).
	target, err := t.fs.Readlink(link)
	if err != nil {
		return Port{}, fmt.Errorf("verify port link: %w", err)
	}
	if filepath.Base(target) != nqn {
		return Port{}, &ConfigfsError{Op: "verify", Path: link, Err: fmt.Errorf("links to %q, want subsystem %q", target, nqn)}
	}
	if err := t.unlinkPortsLocked(nqn, port.name, c); err != nil {
		return Port{}, err
	}
	return port.Port, nil
}

// ensurePort returns the port listening on want's address, creating or
// (only while unused) rewriting one. Caller holds portsMu.
func (t *Target) ensurePort(want Port, c *changes) (portEntry, error) {
	ports, err := t.listPorts()
	if err != nil {
		return portEntry{}, err
	}
	for _, p := range ports {
		if p.sameAddress(want) {
			return p, nil
		}
	}
	byID := map[uint16]portEntry{}
	for _, p := range ports {
		byID[p.ID] = p
	}
	id := want.ID
	explicit := id != 0
	if !explicit {
		id = DerivePortID(want)
	}
	for range 65535 {
		p, exists := byID[id]
		switch {
		case !exists:
			name := strconv.FormatUint(uint64(id), 10)
			if err := t.mkdir(t.portDir(name), c); err != nil {
				return portEntry{}, err
			}
			return t.configurePort(portEntry{name: name, Port: Port{ID: id}}, want, c)
		case len(p.subsystems) == 0:
			// Disabled: addr_* may be written (a port left half-configured
			// by a crash, or an unused one).
			return t.configurePort(p, want, c)
		case explicit:
			return portEntry{}, fmt.Errorf("%w: port %d listens on %s %s:%s with %d subsystem(s), want %s:%s",
				ErrPortInUse, id, p.Transport, p.Address, p.ServiceID, len(p.subsystems), want.Address, want.ServiceID)
		}
		id = id%65535 + 1
	}
	return portEntry{}, fmt.Errorf("no free nvmet port id: %w", syscall.ENOSPC)
}

// configurePort writes the addr_* attributes that differ. Only called on a
// disabled port (EACCES otherwise).
func (t *Target) configurePort(p portEntry, want Port, c *changes) (portEntry, error) {
	dir := t.portDir(p.name)
	for _, a := range []struct{ attr, got, want string }{
		{"addr_trtype", p.Transport, want.Transport},
		{"addr_adrfam", p.Family, want.Family},
		{"addr_traddr", p.Address, want.Address},
		{"addr_trsvcid", p.ServiceID, want.ServiceID},
	} {
		if a.got == a.want {
			continue
		}
		if err := t.write(filepath.Join(dir, a.attr), a.want, c); err != nil {
			return portEntry{}, err
		}
	}
	p.Transport, p.Family, p.Address, p.ServiceID = want.Transport, want.Family, want.Address, want.ServiceID
	return p, nil
}

// unlinkPorts removes the subsystem's links from every port but keep,
// removing ports left without any link.
func (t *Target) unlinkPorts(nqn, keep string, c *changes) error {
	t.portsMu.Lock()
	defer t.portsMu.Unlock()
	return t.unlinkPortsLocked(nqn, keep, c)
}

func (t *Target) unlinkPortsLocked(nqn, keep string, c *changes) error {
	ports, err := t.listPorts()
	if err != nil {
		return err
	}
	for _, p := range ports {
		if p.name == keep {
			continue
		}
		linked := false
		for _, s := range p.subsystems {
			if s == nqn {
				linked = true
			}
		}
		if !linked {
			continue
		}
		if err := t.unlink(filepath.Join(t.portDir(p.name), "subsystems", nqn), c); err != nil {
			return err
		}
		// Removing the last link disabled the port; remove it only then.
		left, err := t.fs.ReadDir(filepath.Join(t.portDir(p.name), "subsystems"))
		if err != nil {
			return err
		}
		if len(left) > 0 {
			continue
		}
		err = t.fs.Rmdir(t.portDir(p.name))
		if err != nil && !errors.Is(err, syscall.ENOENT) {
			return err
		}
		if err == nil {
			c.add("rmdir %s", t.portDir(p.name))
		}
	}
	return nil
}

// dropPortLinks removes the subsystem's links from every port, keeping the ports (linkPort
// links it again into the same port id; a port left without links is disabled until then).
func (t *Target) dropPortLinks(nqn string, c *changes) error {
	t.portsMu.Lock()
	defer t.portsMu.Unlock()
	ports, err := t.listPorts()
	if err != nil {
		return err
	}
	for _, p := range ports {
		if slices.Contains(p.subsystems, nqn) {
			if err := t.unlink(filepath.Join(t.portDir(p.name), "subsystems", nqn), c); err != nil {
				return err
			}
		}
	}
	return nil
}
