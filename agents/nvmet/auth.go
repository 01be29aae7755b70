package nvmet

import (
	"errors"
	"fmt"
	"path/filepath"
)

// HostAuth is the DH-HMAC-CHAP setting of one host entry, hosts/<hostnqn>/dhchap_* (Linux
// drivers/nvme/target/configfs.c, present when the kernel has CONFIG_NVME_TARGET_AUTH). A host
// entry is shared by every subsystem that allows the host: the setting applies to all of them.
// Once a host entry has a key the target asks that host to authenticate on every connect.
type HostAuth struct {
	// Key is the host's secret in the DHHC-1 representation (dhchap_key). Required.
	Key string
	// CtrlKey is the controller secret for bidirectional authentication (dhchap_ctrl_key);
	// "" leaves the attribute as it is (the kernel cannot clear it).
	CtrlKey string
	// Hash is dhchap_hash, e.g. "hmac(sha256)"; "" keeps the kernel's default (hmac(sha256)).
	Hash string
	// DHGroup is dhchap_dhgroup, e.g. "null" or "ffdhe2048"; "" keeps the kernel's default
	// ("null").
	DHGroup string
}

// ErrAuthUnsupported is returned when the kernel's nvmet has no DH-HMAC-CHAP (no
// hosts/<hostnqn>/dhchap_key: CONFIG_NVME_TARGET_AUTH is off, as on Debian bookworm's 6.1). An
// export that asks for authentication then fails; it is never made without.
var ErrAuthUnsupported = errors.New("the kernel's nvmet target has no in-band authentication (CONFIG_NVME_TARGET_AUTH)")

// secretAttrs are the attributes whose values are secrets: changes record them redacted.
var secretAttrs = map[string]bool{"dhchap_key": true, "dhchap_ctrl_key": true}

// ensureHostAuth converges hosts/<h>/dhchap_* to a. The settings are written before the key
// so that the first authentication already uses them; values are compared first, so a
// matching entry sees no write (a write of the same key would be harmless but noisy).
func (t *Target) ensureHostAuth(h string, a HostAuth, c *changes) error {
	dir := t.hostDir(h)
	if ok, err := t.fs.Exists(filepath.Join(dir, "dhchap_key")); err != nil {
		return err
	} else if !ok {
		return fmt.Errorf("host %s: %w", h, ErrAuthUnsupported)
	}
	for _, kv := range [][2]string{{"dhchap_hash", a.Hash}, {"dhchap_dhgroup", a.DHGroup}, {"dhchap_ctrl_key", a.CtrlKey}, {"dhchap_key", a.Key}} {
		if kv[1] == "" {
			continue
		}
		p := filepath.Join(dir, kv[0])
		got, err := t.fs.ReadAttr(p)
		if err != nil {
			return err
		}
		if got == kv[1] {
			continue
		}
		if err := t.fs.WriteAttr(p, kv[1]); err != nil {
			return err // a *ConfigfsError: the path and errno, never the value
		}
		if secretAttrs[kv[0]] {
			c.add("write %s=<secret>", p)
		} else {
			c.add("write %s=%s", p, kv[1])
		}
	}
	return nil
}

// readHostAuth reads hosts/<h>/dhchap_* ; ok is false when the kernel has no authentication.
func (t *Target) readHostAuth(h string) (a HostAuth, ok bool, err error) {
	dir := t.hostDir(h)
	if ok, err := t.fs.Exists(filepath.Join(dir, "dhchap_key")); err != nil || !ok {
		return HostAuth{}, false, err
	}
	read := func(name string) string {
		if err != nil {
			return ""
		}
		var v string
		v, err = t.fs.ReadAttr(filepath.Join(dir, name))
		return v
	}
	a = HostAuth{Key: read("dhchap_key"), CtrlKey: read("dhchap_ctrl_key"), Hash: read("dhchap_hash"), DHGroup: read("dhchap_dhgroup")}
	return a, true, err
}

// AuthMatches reports whether the observed host entry satisfies the desired one (fields left
// "" in want are not compared). Neither value is ever printed.
func AuthMatches(want, got HostAuth) bool {
	eq := func(w, g string) bool { return w == "" || w == g }
	return eq(want.Key, got.Key) && eq(want.CtrlKey, got.CtrlKey) && eq(want.Hash, got.Hash) && eq(want.DHGroup, got.DHGroup)
}
