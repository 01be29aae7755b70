// Package dhchap is what the controller, the agent and the CSI node plugin share about NVMe
// in-band authentication (DH-HMAC-CHAP, NVMe Base Specification 2.0, 8.13.5): the secret
// representation the kernel and nvme-cli use, the Kubernetes Secret that holds one host's master
// secrets (generated and read by the controller only), and the derivation of the secrets of one
// (host, storage node) pair from them: what the storage node's agent writes into nvmet's
// hosts/<hostnqn>/dhchap_* attributes and the host's node plugin passes to the kernel's fabrics
// connect (as nvme connect --dhchap-secret does), both handed out by the controller's key server
// (docs/design.md#key-distribution).
//
// Secret values never go into errors, logs, events or conditions: the functions here name
// the Secret, never print its data.
package dhchap

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"strconv"
	"strings"
)

// Secret layout (one Secret per host, in the controller's namespace).
const (
	// KeyHostSecret is the Secret data key of the host's secret ("DHHC-1:..."): the target
	// checks it (dhchap_key), the host presents it (dhchap_secret).
	KeyHostSecret = "dhchap-secret"
	// KeyCtrlSecret is the data key of the controller secret for bidirectional
	// authentication: the target proves it (dhchap_ctrl_key), the host checks it
	// (dhchap_ctrl_secret).
	KeyCtrlSecret = "dhchap-ctrl-secret"
	// AnnotationHostNQN on the Secret is the host NQN the secrets belong to. A Secret whose
	// NQN is not the host's is not used (the node's NQN changed: the controller makes anew).
	AnnotationHostNQN = "plinth.dev/host-nqn"
	// AnnotationHash on the Secret is the policy hash the secrets were made for (sha256,
	// sha384, sha512): their length follows it (32, 48, 64 bytes).
	AnnotationHash = "plinth.dev/dhchap-hash"
	// AnnotationKeyGeneration on the Secret is the policy keyGeneration
	// (Protocol spec.nvmeofTcp.auth.keyGeneration) its secrets were made for, in decimal;
	// absent is 0. The controller makes new secrets when the policy's is higher.
	AnnotationKeyGeneration = "plinth.dev/dhchap-key-generation"
	// AnnotationKeyID on the Secret names its current secrets: a random id (16 hex digits, no
	// relation to the secrets) made anew with them. Agents report the key id each host entry
	// holds (Agent status.hostKeys); a node plugin hands new secrets to its live controllers
	// only once the storage node reports the Secret's key id.
	AnnotationKeyID = "plinth.dev/dhchap-key-id"
	// LabelComponent is set to ComponentValue on every such Secret: the controller lists and
	// prunes by it and never touches another Secret.
	LabelComponent = "plinth.dev/component"
	// ComponentValue is the LabelComponent value of host secrets.
	ComponentValue = "nvme-auth"
	// SecretPrefix starts every host Secret's name: SecretPrefix + node name.
	SecretPrefix = "nvme-auth-"
)

// SecretName is the name of node's host Secret: "nvme-auth-<node>" (Node names are DNS
// subdomains of at most 253 bytes; longer results keep the first 243 bytes and a hash would
// be needed — Node names that long are refused by the controller, see ValidNodeName).
func SecretName(node string) string { return SecretPrefix + node }

// ValidNodeName reports whether node's Secret name fits the 253-byte limit of object names.
func ValidNodeName(node string) bool { return node != "" && len(SecretName(node)) <= 253 }

// keyLen is the secret length in bytes for a policy hash (the kernel accepts 32, 48 and 64,
// drivers/nvme/common/auth.c nvme_auth_extract_key); the length of the hash's output.
func keyLen(hash string) (int, error) {
	switch hash {
	case "", "sha256":
		return 32, nil
	case "sha384":
		return 48, nil
	case "sha512":
		return 64, nil
	}
	return 0, fmt.Errorf("unknown hash %q (sha256, sha384, sha512)", hash)
}

// KernelHash is the nvmet dhchap_hash value of a policy hash: "hmac(sha256)" and so on.
func KernelHash(hash string) (string, error) {
	if _, err := keyLen(hash); err != nil {
		return "", err
	}
	if hash == "" {
		hash = "sha256"
	}
	return "hmac(" + hash + ")", nil
}

// KernelDHGroup is the nvmet dhchap_dhgroup value of a policy dhGroup: "" is "null" (no
// Diffie-Hellman exchange), "ffdhe2048".."ffdhe8192" pass through.
func KernelDHGroup(group string) (string, error) {
	switch group {
	case "", "null":
		return "null", nil
	case "ffdhe2048", "ffdhe3072", "ffdhe4096", "ffdhe6144", "ffdhe8192":
		return group, nil
	}
	return "", fmt.Errorf("unknown DH group %q", group)
}

// Encode returns the representation of key the kernel and nvme-cli read:
// "DHHC-1:00:" + base64(key || crc32(key) little-endian) + ":" (NVMe TP 8006; nvme-cli
// gen-dhchap-key). The "00" says the key is used as is (no transformation with the NQN).
// key must be 32, 48 or 64 bytes.
func Encode(key []byte) (string, error) {
	if l := len(key); l != 32 && l != 48 && l != 64 {
		return "", fmt.Errorf("DH-HMAC-CHAP key of %d bytes, want 32, 48 or 64", l)
	}
	buf := make([]byte, len(key), len(key)+4)
	copy(buf, key)
	buf = binary.LittleEndian.AppendUint32(buf, crc32.ChecksumIEEE(key))
	return "DHHC-1:00:" + base64.StdEncoding.EncodeToString(buf) + ":", nil
}

// ErrMalformed is returned by Decode for a string that is not a DHHC-1 secret. Its message
// never holds the secret.
var ErrMalformed = errors.New("malformed DH-HMAC-CHAP secret")

// Decode checks a "DHHC-1:<hh>:<base64>:" secret (transformation id 00–03, key of 32, 48 or
// 64 bytes, CRC-32 matching, as the kernel's nvme_auth_extract_key) and returns the key
// bytes and the transformation id. Errors wrap ErrMalformed.
func Decode(s string) (key []byte, transform int, err error) {
	parts := strings.Split(s, ":")
	if len(parts) != 4 || parts[0] != "DHHC-1" || parts[3] != "" || len(parts[1]) != 2 {
		return nil, 0, fmt.Errorf("%w: want DHHC-1:<hh>:<base64>:", ErrMalformed)
	}
	switch parts[1] {
	case "00", "01", "02", "03":
		transform = int(parts[1][1] - '0')
	default:
		return nil, 0, fmt.Errorf("%w: transformation id %q", ErrMalformed, parts[1])
	}
	raw, err := base64.StdEncoding.DecodeString(parts[2])
	if err != nil {
		return nil, 0, fmt.Errorf("%w: base64", ErrMalformed)
	}
	if l := len(raw) - 4; l != 32 && l != 48 && l != 64 {
		return nil, 0, fmt.Errorf("%w: key of %d bytes", ErrMalformed, len(raw)-4)
	}
	key, sum := raw[:len(raw)-4], raw[len(raw)-4:]
	if !bytes.Equal(sum, binary.LittleEndian.AppendUint32(nil, crc32.ChecksumIEEE(key))) {
		return nil, 0, fmt.Errorf("%w: CRC-32 mismatch", ErrMalformed)
	}
	return key, transform, nil
}

// Generate makes a new random secret (crypto/rand) for a policy hash ("" is sha256) in the
// DHHC-1 representation; its length is the hash's output length.
func Generate(hash string) (string, error) {
	n, err := keyLen(hash)
	if err != nil {
		return "", err
	}
	key := make([]byte, n)
	if _, err := rand.Read(key); err != nil {
		return "", fmt.Errorf("random key: %w", err)
	}
	return Encode(key)
}

// NewKeyID returns a random key id for AnnotationKeyID: 16 hex digits from crypto/rand,
// unrelated to the secrets it names.
func NewKeyID() (string, error) {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("random key id: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// KeyGenerationOf returns the AnnotationKeyGeneration of a Secret's annotations: 0 when absent
// or not a non-negative decimal number (a Secret made before rotation existed).
func KeyGenerationOf(annotations map[string]string) int64 {
	n, err := strconv.ParseInt(annotations[AnnotationKeyGeneration], 10, 64)
	if err != nil || n < 0 {
		return 0
	}
	return n
}

// Derivation labels: what a derived key is for, so that a host key and a controller key made
// from equal masters still differ.
const (
	labelHostKey = "plinth.dev/nvme-dhchap host key"
	labelCtrlKey = "plinth.dev/nvme-dhchap ctrl key"
)

// DeriveHostKey returns the secret host node presents to (and the target checks on) the storage
// node target: HMAC(master key, label ‖ 0x00 ‖ target) with the SHA-2 of the master key's length
// (32 bytes SHA-256, 48 SHA-384, 64 SHA-512), so the derived key has the master's length, in the
// DHHC-1 representation with transformation 00. master is a host's dhchap-secret (KeyHostSecret);
// target a Node name. Every target gets another key: a storage node that holds one can
// authenticate as the host to itself only (docs/design.md#threat-model). Errors wrap
// ErrMalformed for a master that does not decode; they never hold the secret.
func DeriveHostKey(master, target string) (string, error) {
	return derive(master, labelHostKey, target)
}

// DeriveCtrlKey is DeriveHostKey for the controller secret of bidirectional authentication
// (KeyCtrlSecret), with its own label.
func DeriveCtrlKey(master, target string) (string, error) {
	return derive(master, labelCtrlKey, target)
}

func derive(master, label, target string) (string, error) {
	key, _, err := Decode(master)
	if err != nil {
		return "", err
	}
	if target == "" {
		return "", errors.New("derive a DH-HMAC-CHAP key: no target node")
	}
	var h func() hash.Hash
	switch len(key) {
	case 32:
		h = sha256.New
	case 48:
		h = sha512.New384
	default:
		h = sha512.New
	}
	m := hmac.New(h, key)
	m.Write([]byte(label))
	m.Write([]byte{0})
	m.Write([]byte(target))
	return Encode(m.Sum(nil))
}
