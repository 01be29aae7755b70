package nvmet

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// MaxNQNLength is the longest NQN in bytes (NVMF_NQN_SIZE in
// include/linux/nvme.h; NVMe Base Specification, "NVMe Qualified Names").
// nvmet's core.c stores a subsystem NQN with kstrndup(name, NVMF_NQN_SIZE), so
// a longer configfs directory name is silently truncated and hosts that
// connect with the full name are refused: longer NQNs are rejected up front.
const MaxNQNLength = 223

// NQNPrefix is the naming authority Plinth uses for the subsystems it creates.
const NQNPrefix = "nqn.2026-01.dev.plinth"

// DiscoveryNQN is the well-known discovery subsystem NQN; nvmet refuses to
// create a subsystem with it (nvmet_subsys_make in configfs.c).
const DiscoveryNQN = "nqn.2014-08.org.nvmexpress.discovery"

// uuidAuthority is the naming authority of the UUID-based NQN format
// ("nqn.2014-08.org.nvmexpress:uuid:<uuid>"), used by host NQNs.
const uuidAuthority = "2014-08.org.nvmexpress"

// ErrInvalidNQN is wrapped by every NQN validation error; the CSI edge maps it
// to INVALID_ARGUMENT.
var ErrInvalidNQN = errors.New("invalid NQN")

// NQN is a parsed NVMe Qualified Name of the form
// "nqn.<yyyy>-<mm>.<reverse-domain>:<unique>" (NVMe Base Specification,
// section "NVMe Qualified Names").
type NQN struct {
	// Year and Month of the naming authority's domain registration.
	Year, Month int
	// Domain is the naming authority in reverse domain order, e.g. "dev.plinth".
	Domain string
	// Unique is everything after the first ':' (e.g. the volume id, or
	// "uuid:<uuid>" for the UUID format).
	Unique string
}

// String returns the NQN in its wire form.
func (n NQN) String() string {
	return fmt.Sprintf("nqn.%04d-%02d.%s:%s", n.Year, n.Month, n.Domain, n.Unique)
}

// ParseNQN parses and validates an NQN. It accepts the two formats of the NVMe
// Base Specification: "nqn.yyyy-mm.<reverse-domain>:<unique>" and
// "nqn.2014-08.org.nvmexpress:uuid:<36-char uuid>". Besides the spec's rules
// it refuses what cannot be a configfs directory name or a clean attribute
// value: '/', whitespace, control and non-ASCII bytes. Errors wrap ErrInvalidNQN.
func ParseNQN(s string) (NQN, error) {
	bad := func(format string, args ...any) (NQN, error) {
		return NQN{}, fmt.Errorf("%w %q: %s", ErrInvalidNQN, truncateForError(s), fmt.Sprintf(format, args...))
	}
	if len(s) > MaxNQNLength {
		return bad("%d bytes, longer than %d (the kernel would silently truncate it)", len(s), MaxNQNLength)
	}
	if s == DiscoveryNQN {
		return bad("the discovery NQN cannot name a subsystem or host")
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c > '~' || c == '/' {
			return bad("byte %d (%#x) is not allowed (printable ASCII without space and '/')", i, c)
		}
	}
	rest, ok := strings.CutPrefix(s, "nqn.")
	if !ok {
		return bad(`does not start with "nqn."`)
	}
	// yyyy-mm.
	if len(rest) < 8 || rest[4] != '-' || rest[7] != '.' {
		return bad(`date must be "yyyy-mm." after "nqn."`)
	}
	year, err1 := strconv.Atoi(rest[0:4])
	month, err2 := strconv.Atoi(rest[5:7])
	if err1 != nil || err2 != nil || !allDigits(rest[0:4]) || !allDigits(rest[5:7]) {
		return bad("date %q is not numeric", rest[0:7])
	}
	if month < 1 || month > 12 {
		return bad("month %02d out of range 01-12", month)
	}
	domain, unique, ok := strings.Cut(rest[8:], ":")
	if !ok {
		return bad(`missing ":" between naming authority and unique name`)
	}
	if err := validDomain(domain); err != nil {
		return bad("naming authority: %v", err)
	}
	if unique == "" {
		return bad("empty unique name after ':'")
	}
	if rest[:8]+domain == uuidAuthority {
		if u, ok := strings.CutPrefix(unique, "uuid:"); ok && !validUUID(u) {
			return bad("uuid %q is not 8-4-4-4-12 hex", u)
		}
	}
	return NQN{Year: year, Month: month, Domain: domain, Unique: unique}, nil
}

// ValidateNQN reports whether s is a valid NQN (see ParseNQN).
func ValidateNQN(s string) error {
	_, err := ParseNQN(s)
	return err
}

// VolumeNQN returns the subsystem NQN of a volume: NQNPrefix + ":" + volumeID.
// The volume id is the CSI volume id ("vol-" + 40 hex digits, docs/design.md,
// "Names and keys"), never
// the CSI name. Ids with characters outside [A-Za-z0-9._-] or that would make
// the NQN longer than MaxNQNLength are refused (ErrInvalidNQN), never
// truncated.
func VolumeNQN(volumeID string) (string, error) {
	if volumeID == "" {
		return "", fmt.Errorf("%w: empty volume id", ErrInvalidNQN)
	}
	for i := 0; i < len(volumeID); i++ {
		c := volumeID[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return "", fmt.Errorf("%w: volume id %q: byte %d (%#x) not in [A-Za-z0-9._-]", ErrInvalidNQN, truncateForError(volumeID), i, c)
		}
	}
	nqn := NQNPrefix + ":" + volumeID
	if err := ValidateNQN(nqn); err != nil {
		return "", err
	}
	return nqn, nil
}

// VolumeIDFromNQN returns the volume id of a Plinth subsystem NQN and whether
// nqn is one.
func VolumeIDFromNQN(nqn string) (string, bool) {
	id, ok := strings.CutPrefix(nqn, NQNPrefix+":")
	return id, ok && id != ""
}

// Identity is the namespace identity a host keys on. Hosts drop (or refuse to
// re-attach) a namespace whose identifiers change, so they are derived from the
// subsystem NQN and never left to the kernel's random defaults.
type Identity struct {
	// UUID as written to namespaces/<n>/device_uuid (lower-case 8-4-4-4-12).
	UUID string
	// NGUID as written to namespaces/<n>/device_nguid (same textual form as
	// the kernel shows it, "%pUb").
	NGUID string
	// Serial as written to subsystems/<nqn>/attr_serial: 20 hex digits
	// (NVMET_SN_MAX_SIZE).
	Serial string
}

// DeriveIdentity returns the stable identity of the namespace of subsystem
// nqn: SHA-256 based, distinct domains for UUID, NGUID and serial.
func DeriveIdentity(nqn string) Identity {
	h := func(domain string) []byte {
		s := sha256.Sum256([]byte("plinth.dev/nvmet/" + domain + "\x00" + nqn))
		return s[:]
	}
	u := h("uuid")[:16]
	u[6] = u[6]&0x0f | 0x80 // RFC 9562 version 8 (vendor-specific)
	u[8] = u[8]&0x3f | 0x80 // RFC 9562 variant
	return Identity{
		UUID:   formatUUID(u),
		NGUID:  formatUUID(h("nguid")[:16]),
		Serial: hex.EncodeToString(h("serial"))[:20],
	}
}

func formatUUID(b []byte) string {
	x := hex.EncodeToString(b)
	return x[0:8] + "-" + x[8:12] + "-" + x[12:16] + "-" + x[16:20] + "-" + x[20:32]
}

func validUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		switch i {
		case 8, 13, 18, 23:
			if s[i] != '-' {
				return false
			}
		default:
			if !isHex(s[i]) {
				return false
			}
		}
	}
	return true
}

func validDomain(d string) error {
	if d == "" {
		return errors.New("empty")
	}
	for _, label := range strings.Split(d, ".") {
		if label == "" {
			return fmt.Errorf("empty label in %q", d)
		}
		if label[0] == '-' || label[len(label)-1] == '-' {
			return fmt.Errorf("label %q starts or ends with '-'", label)
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
				return fmt.Errorf("label %q has %q (allowed: letters, digits, '-')", label, c)
			}
		}
	}
	return nil
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// truncateForError keeps error messages short for absurd inputs.
func truncateForError(s string) string {
	if len(s) > 64 {
		return s[:64] + fmt.Sprintf("...(%d bytes)", len(s))
	}
	return s
}
