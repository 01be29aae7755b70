// Package identity is the volume identity stamp: the record every backend object Plinth
// creates carries (LV tags, a zvol user property, the file backend's record beside the
// image), naming the volume, its claim and the policy it was made with, so that the
// volumes on a node can be re-adopted after the control plane (etcd) is lost
// (docs/design.md, "Volume identity stamp"). The format is a contract: a stamp written by
// one release is read by every later one; a new field or meaning is a new version.
//
// A stamp is an ordered list of key=value fields, the version first and a checksum last.
// Values are restricted to [A-Za-z0-9._-] and at most 253 bytes, so every encoding holds
// them unescaped: lvm2 tags ([A-Za-z0-9_+.-/=!:&#], at most 1024 bytes), ZFS user
// properties, one text line. Leaf package: imports nothing of the project.
package identity

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Version is the stamp format this package writes. Decode refuses every other.
const Version = "1"

// Errors of Decode. Each is wrapped with the detail; test with errors.Is.
var (
	// ErrNoStamp: the object carries no stamp field at all (made before stamps, or not
	// Plinth's).
	ErrNoStamp = errors.New("no identity stamp")
	// ErrUnknownVersion: the stamp's version is not one this release reads.
	ErrUnknownVersion = errors.New("unknown identity stamp version")
	// ErrTorn: a stamp field is missing, duplicated, unknown, malformed, or the checksum
	// does not match the fields (a write cut short, a hand edit, a mix of two stamps).
	ErrTorn = errors.New("torn identity stamp")
)

// Field keys in their canonical order (the order of Fields and of the checksum input).
const (
	KeyVersion      = "v"
	KeyVolume       = "vol"
	KeyPVCNamespace = "ns"
	KeyPVCName      = "pvc"
	KeyPVCUID       = "uid"
	KeyPV           = "pv"
	KeyStorageClass = "sc"
	KeyPlacement    = "placement"
	KeySize         = "size"
	KeyFilesystem   = "fs"
	KeyMode         = "mode"
	KeyPolicy       = "policy"
	KeyStore        = "store"
	KeySum          = "sum"
)

var order = []string{KeyVersion, KeyVolume, KeyPVCNamespace, KeyPVCName, KeyPVCUID, KeyPV,
	KeyStorageClass, KeyPlacement, KeySize, KeyFilesystem, KeyMode, KeyPolicy, KeyStore, KeySum}

// required fields of version 1; the others are omitted when empty (a volume whose PV does
// not exist yet has no claim fields).
var required = map[string]bool{KeyVersion: true, KeyVolume: true, KeySize: true, KeyMode: true,
	KeyPolicy: true, KeyStore: true, KeySum: true}

// MaxValueBytes bounds every value (a DNS subdomain, the longest Kubernetes name).
const MaxValueBytes = 253

var (
	valueRe  = regexp.MustCompile(`^[A-Za-z0-9._-]*$`)
	volumeRe = regexp.MustCompile(`^vol-[0-9a-f]{40}$`)
	digestRe = regexp.MustCompile(`^[0-9a-f]{32}$`)
	sumRe    = regexp.MustCompile(`^[0-9a-f]{16}$`)
)

// Stamp is the identity of one volume.
type Stamp struct {
	// VolumeID is the CSI volume id ("vol-" + 40 hex digits), the VolumeState's name.
	VolumeID string `json:"volumeID"`
	// PVCNamespace, PVCName and PVCUID name the claim the volume was bound to ("" until its
	// PV exists).
	PVCNamespace string `json:"pvcNamespace,omitempty"`
	PVCName      string `json:"pvcName,omitempty"`
	PVCUID       string `json:"pvcUID,omitempty"`
	// PVName is the PV's name (the CSI CreateVolume name csi-provisioner gives, pvc-<uid>).
	PVName string `json:"pvName,omitempty"`
	// StorageClass is the PV's StorageClass.
	StorageClass string `json:"storageClass,omitempty"`
	// Placement is the Placement the volume was created with.
	Placement string `json:"placement,omitempty"`
	// SizeBytes is the volume's size in bytes as the VolumeState asks for it.
	SizeBytes int64 `json:"sizeBytes"`
	// Filesystem is the fsType (ext4, xfs) of a Filesystem volume, "" for a Block one.
	Filesystem string `json:"filesystem,omitempty"`
	// VolumeMode is Filesystem or Block.
	VolumeMode string `json:"volumeMode"`
	// PolicyDigest is PolicyDigest of the frozen policy (32 hex digits).
	PolicyDigest string `json:"policyDigest"`
	// StoreUID is the UID of the Store object under which the stamp was last written: it
	// changes when the control plane is rebuilt, which tells a volume of a lost control
	// plane from one whose VolumeState was deleted.
	StoreUID string `json:"storeUID"`
}

// Field is one key=value pair of a stamp.
type Field struct{ Key, Value string }

// PolicyDigest is the policy content digest of a stamp: the first 32 hex digits of the
// sha256 of the JSON encoding of frozen (the VolumeState's spec.policy). Errors: only those
// of json.Marshal.
func PolicyDigest(frozen any) (string, error) {
	b, err := json.Marshal(frozen)
	if err != nil {
		return "", fmt.Errorf("policy digest: %w", err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])[:32], nil
}

func (s Stamp) values() map[string]string {
	m := map[string]string{
		KeyVersion: Version, KeyVolume: s.VolumeID, KeyPVCNamespace: s.PVCNamespace,
		KeyPVCName: s.PVCName, KeyPVCUID: s.PVCUID, KeyPV: s.PVName, KeyStorageClass: s.StorageClass,
		KeyPlacement: s.Placement, KeySize: strconv.FormatInt(s.SizeBytes, 10), KeyFilesystem: s.Filesystem,
		KeyMode: s.VolumeMode, KeyPolicy: s.PolicyDigest, KeyStore: s.StoreUID,
	}
	return m
}

// Validate checks every field against the format: a volume id, a positive size, mode
// Filesystem (with fs ext4 or xfs) or Block (no fs), a 32-hex policy digest, a Store UID,
// claim fields all set or all empty, each value in [A-Za-z0-9._-] and at most 253 bytes.
func (s Stamp) Validate() error {
	for k, v := range s.values() {
		if len(v) > MaxValueBytes || !valueRe.MatchString(v) {
			return fmt.Errorf("field %s=%q: want at most %d bytes of [A-Za-z0-9._-]", k, v, MaxValueBytes)
		}
	}
	switch {
	case !volumeRe.MatchString(s.VolumeID):
		return fmt.Errorf("field %s=%q: want vol- and 40 lower-case hex digits", KeyVolume, s.VolumeID)
	case s.SizeBytes <= 0:
		return fmt.Errorf("field %s=%d: want a positive byte count", KeySize, s.SizeBytes)
	case !digestRe.MatchString(s.PolicyDigest):
		return fmt.Errorf("field %s=%q: want 32 lower-case hex digits", KeyPolicy, s.PolicyDigest)
	case s.StoreUID == "":
		return fmt.Errorf("field %s: empty", KeyStore)
	}
	switch s.VolumeMode {
	case "Filesystem":
		if s.Filesystem != "ext4" && s.Filesystem != "xfs" {
			return fmt.Errorf("field %s=%q: want ext4 or xfs for mode Filesystem", KeyFilesystem, s.Filesystem)
		}
	case "Block":
		if s.Filesystem != "" {
			return fmt.Errorf("field %s=%q: want none for mode Block", KeyFilesystem, s.Filesystem)
		}
	default:
		return fmt.Errorf("field %s=%q: want Filesystem or Block", KeyMode, s.VolumeMode)
	}
	claim := []string{s.PVCNamespace, s.PVCName, s.PVCUID, s.PVName}
	set := 0
	for _, c := range claim {
		if c != "" {
			set++
		}
	}
	if set != 0 && set != len(claim) {
		return fmt.Errorf("claim fields %s, %s, %s, %s: want all set or none", KeyPVCNamespace, KeyPVCName, KeyPVCUID, KeyPV)
	}
	return nil
}

// Bound reports whether the stamp names a claim (its PV existed when it was written).
func (s Stamp) Bound() bool { return s.PVName != "" }

// checksum is the first 16 hex digits of the sha256 of the fields before sum, each as
// "key=value\n" in canonical order.
func checksum(fields []Field) string {
	h := sha256.New()
	for _, f := range fields {
		h.Write([]byte(f.Key + "=" + f.Value + "\n"))
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// Fields returns the stamp's fields in canonical order, empty optional fields left out,
// ending with the checksum. Errors: those of Validate.
func (s Stamp) Fields() ([]Field, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	vals := s.values()
	var out []Field
	for _, k := range order {
		if k == KeySum {
			continue
		}
		if v := vals[k]; v != "" || required[k] {
			out = append(out, Field{k, v})
		}
	}
	return append(out, Field{KeySum, checksum(out)}), nil
}

// Decode reads a stamp from its fields (key → value, in any order, as an encoding's reader
// collects them). Errors: ErrNoStamp when fields is empty; ErrUnknownVersion when "v" is
// not Version; ErrTorn for anything else that is not exactly one valid stamp.
func Decode(fields map[string]string) (Stamp, error) {
	if len(fields) == 0 {
		return Stamp{}, ErrNoStamp
	}
	v, ok := fields[KeyVersion]
	if !ok {
		return Stamp{}, fmt.Errorf("%w: no field %s", ErrTorn, KeyVersion)
	}
	if v != Version {
		if len(v) > 16 || !valueRe.MatchString(v) {
			return Stamp{}, fmt.Errorf("%w: malformed version", ErrTorn)
		}
		return Stamp{}, fmt.Errorf("%w: %q (this release reads %s)", ErrUnknownVersion, v, Version)
	}
	known := map[string]bool{}
	for _, k := range order {
		known[k] = true
	}
	for k := range fields {
		if !known[k] {
			return Stamp{}, fmt.Errorf("%w: unknown field %.40q", ErrTorn, k)
		}
	}
	for k := range required {
		if _, ok := fields[k]; !ok {
			return Stamp{}, fmt.Errorf("%w: no field %s", ErrTorn, k)
		}
	}
	size, err := strconv.ParseInt(fields[KeySize], 10, 64)
	if err != nil || strconv.FormatInt(size, 10) != fields[KeySize] {
		return Stamp{}, fmt.Errorf("%w: field %s=%.40q is not a canonical integer", ErrTorn, KeySize, fields[KeySize])
	}
	s := Stamp{
		VolumeID: fields[KeyVolume], PVCNamespace: fields[KeyPVCNamespace], PVCName: fields[KeyPVCName],
		PVCUID: fields[KeyPVCUID], PVName: fields[KeyPV], StorageClass: fields[KeyStorageClass],
		Placement: fields[KeyPlacement], SizeBytes: size, Filesystem: fields[KeyFilesystem],
		VolumeMode: fields[KeyMode], PolicyDigest: fields[KeyPolicy], StoreUID: fields[KeyStore],
	}
	want, err := s.Fields()
	if err != nil {
		return Stamp{}, fmt.Errorf("%w: %v", ErrTorn, err)
	}
	// every field given must be one the canonical encoding holds (an empty optional field
	// is written by no encoder)
	if len(want) != len(fields) {
		return Stamp{}, fmt.Errorf("%w: %d fields, want %d", ErrTorn, len(fields), len(want))
	}
	if got := fields[KeySum]; got != want[len(want)-1].Value {
		if !sumRe.MatchString(got) {
			return Stamp{}, fmt.Errorf("%w: malformed checksum", ErrTorn)
		}
		return Stamp{}, fmt.Errorf("%w: checksum %s does not match the fields (%s)", ErrTorn, got, want[len(want)-1].Value)
	}
	return s, nil
}

// Text is the stamp as text: one "key=value" line per field, each ending in "\n" (the file
// backend's record, vol-<id>.id). Errors: those of Validate.
func (s Stamp) Text() (string, error) {
	return s.join("\n", true)
}

// Line is the stamp as one line, fields separated by ";" (Store status). Errors: those of
// Validate.
func (s Stamp) Line() (string, error) {
	return s.join(";", false)
}

func (s Stamp) join(sep string, trailing bool) (string, error) {
	fs, err := s.Fields()
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for i, f := range fs {
		if i > 0 {
			b.WriteString(sep)
		}
		b.WriteString(f.Key + "=" + f.Value)
	}
	if trailing {
		b.WriteString(sep)
	}
	return b.String(), nil
}

// maxRecordBytes bounds a record read: 14 fields of at most 253 bytes and their keys.
const maxRecordBytes = 4096

// ParseText decodes Text's output. Errors: those of Decode; ErrTorn also for a record that
// does not end in a newline (cut short), has an empty line, a line without "=", a repeated
// key or more than 4096 bytes.
func ParseText(text string) (Stamp, error) {
	if text == "" {
		return Stamp{}, ErrNoStamp
	}
	if len(text) > maxRecordBytes {
		return Stamp{}, fmt.Errorf("%w: %d bytes, at most %d", ErrTorn, len(text), maxRecordBytes)
	}
	if !strings.HasSuffix(text, "\n") {
		return Stamp{}, fmt.Errorf("%w: record does not end in a newline", ErrTorn)
	}
	return parseSplit(strings.Split(strings.TrimSuffix(text, "\n"), "\n"))
}

// ParseLine decodes Line's output. Errors: as ParseText.
func ParseLine(line string) (Stamp, error) {
	if line == "" {
		return Stamp{}, ErrNoStamp
	}
	if len(line) > maxRecordBytes {
		return Stamp{}, fmt.Errorf("%w: %d bytes, at most %d", ErrTorn, len(line), maxRecordBytes)
	}
	return parseSplit(strings.Split(line, ";"))
}

func parseSplit(parts []string) (Stamp, error) {
	m := map[string]string{}
	for _, p := range parts {
		k, v, ok := strings.Cut(p, "=")
		if !ok || k == "" {
			return Stamp{}, fmt.Errorf("%w: field %.40q is not key=value", ErrTorn, p)
		}
		if _, dup := m[k]; dup {
			return Stamp{}, fmt.Errorf("%w: field %.40q repeated", ErrTorn, k)
		}
		m[k] = v
	}
	return Decode(m)
}

// LVTagPrefix starts every LV tag of a stamp: "plinth.dev/id.<key>=<value>". The longest is
// 18 + 253 bytes, inside lvm2's 1024-byte tag limit, all in its tag charset (lvm(8), "Tags").
const LVTagPrefix = "plinth.dev/id."

// LVTags is the stamp as LV tags. Errors: those of Validate.
func (s Stamp) LVTags() ([]string, error) {
	fs, err := s.Fields()
	if err != nil {
		return nil, err
	}
	out := make([]string, len(fs))
	for i, f := range fs {
		out[i] = LVTagPrefix + f.Key + "=" + f.Value
	}
	return out, nil
}

// FromLVTags decodes the stamp among an LV's tags (others are ignored). Errors: those of
// Decode; ErrTorn for a stamp tag repeated with another value.
func FromLVTags(tags []string) (Stamp, error) {
	m := map[string]string{}
	for _, t := range tags {
		rest, ok := strings.CutPrefix(t, LVTagPrefix)
		if !ok {
			continue
		}
		k, v, ok := strings.Cut(rest, "=")
		if !ok || k == "" {
			return Stamp{}, fmt.Errorf("%w: tag %.60q is not %skey=value", ErrTorn, t, LVTagPrefix)
		}
		if old, dup := m[k]; dup && old != v {
			return Stamp{}, fmt.Errorf("%w: tag %s repeated", ErrTorn, k)
		}
		m[k] = v
	}
	return Decode(m)
}

// ZFSProperty is the zvol user property holding the stamp as Line (zfsprops(7) "User
// Properties": a name with a colon, a value of at most 8192 bytes; Line is at most 4096).
// One property, so one `zfs set` replaces a whole stamp atomically and the backend's one
// `zfs list` reads it as one column.
const ZFSProperty = "plinth.dev:identity"

// FromZFSProperty decodes ZFSProperty's value as `zfs list -H` prints it. Errors: those of
// ParseLine; ErrNoStamp for "" or "-" (zfs's value of an unset property).
func FromZFSProperty(value string) (Stamp, error) {
	if value == "-" {
		return Stamp{}, ErrNoStamp
	}
	return ParseLine(value)
}
