// Package hostkeys is where a storage node's agent and a host's CSI node plugin get the
// DH-HMAC-CHAP keys of one (host, target) pair: the key host node H presents to storage node T
// and the controller key of bidirectional authentication, both derived from H's master Secret
// for T (internal/dhchap DeriveHostKey, docs/design.md#key-distribution).
//
// Source has two implementations: Client asks the controller's key server over HTTPS with the
// caller's pod-bound token (what the shipped manifests run: agents and node plugins hold no
// Secret permission), Secrets reads the master Secret and derives (admin credentials: the
// plinth-dev cluster and tests). Both answer the same for the same Secret.
//
// Keys never go into errors: errors name the Secret or the key server, never a value.
package hostkeys

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/internal/dhchap"
)

// Key is what a Source answers for (host, target). It is also the key server's JSON answer.
type Key struct {
	// HostNQN is the host NQN the master Secret was made for (dhchap.AnnotationHostNQN):
	// callers use the key only for that NQN.
	HostNQN string `json:"hostNQN"`
	// Key is the host secret for the target, DHHC-1 (dhchap.DeriveHostKey).
	Key string `json:"key"`
	// CtrlKey is the controller secret for the target, DHHC-1, or "" when the master Secret
	// has none (dhchap.DeriveCtrlKey).
	CtrlKey string `json:"ctrlKey,omitempty"`
	// KeyID names the master's current secrets (dhchap.AnnotationKeyID; "" for a Secret made
	// before key ids): agents report it, node plugins order a rotation by it.
	KeyID string `json:"keyID,omitempty"`
	// KeyGeneration is the Protocol keyGeneration the master was made for
	// (dhchap.AnnotationKeyGeneration).
	KeyGeneration int64 `json:"keyGeneration"`
}

// Source gives the keys of host node host toward storage node target (Node names).
type Source interface {
	// HostKey returns the pair's keys. Errors wrap ErrNotFound (host has no master Secret yet),
	// ErrUnusable (its master is malformed) or ErrRefused (the key server refused the caller
	// this pair); any other error is a failure to ask (API server, network) worth a retry.
	HostKey(ctx context.Context, host, target string) (Key, error)
}

var (
	// ErrNotFound: the host has no master Secret (the controller makes it once the host's node
	// plugin has annotated its host NQN and a Protocol asks for authentication).
	ErrNotFound = errors.New("no DH-HMAC-CHAP Secret for the host")
	// ErrUnusable: the host's master Secret holds a malformed secret.
	ErrUnusable = errors.New("the host's DH-HMAC-CHAP Secret is not usable")
	// ErrRefused: the key server did not authenticate the caller or does not give it this pair.
	ErrRefused = errors.New("refused by the key server")
)

// Secrets is the Source that reads the host's master Secret dhchap.SecretName(host) in
// Namespace with Reader and derives the pair's keys: the key server's own Source, and the
// agent's and node plugin's when they run with credentials that may read Secrets (no key
// server configured).
type Secrets struct {
	Reader    client.Reader
	Namespace string
}

// HostKey implements Source.
func (s Secrets) HostKey(ctx context.Context, host, target string) (Key, error) {
	name := dhchap.SecretName(host)
	var sec corev1.Secret
	if err := s.Reader.Get(ctx, client.ObjectKey{Namespace: s.Namespace, Name: name}, &sec); apierrors.IsNotFound(err) {
		return Key{}, fmt.Errorf("%w: Secret %s/%s not found", ErrNotFound, s.Namespace, name)
	} else if err != nil {
		return Key{}, fmt.Errorf("read Secret %s/%s: %w", s.Namespace, name, err)
	}
	if sec.Labels[dhchap.LabelComponent] != dhchap.ComponentValue {
		return Key{}, fmt.Errorf("%w: Secret %s/%s lacks the label %s=%s", ErrUnusable, s.Namespace, name, dhchap.LabelComponent, dhchap.ComponentValue)
	}
	k := Key{HostNQN: sec.Annotations[dhchap.AnnotationHostNQN], KeyID: sec.Annotations[dhchap.AnnotationKeyID],
		KeyGeneration: dhchap.KeyGenerationOf(sec.Annotations)}
	var err error
	if k.Key, err = dhchap.DeriveHostKey(string(sec.Data[dhchap.KeyHostSecret]), target); err != nil {
		return Key{}, fmt.Errorf("%w: Secret %s/%s key %s: %w", ErrUnusable, s.Namespace, name, dhchap.KeyHostSecret, err)
	}
	if ctrl := string(sec.Data[dhchap.KeyCtrlSecret]); ctrl != "" {
		if k.CtrlKey, err = dhchap.DeriveCtrlKey(ctrl, target); err != nil {
			return Key{}, fmt.Errorf("%w: Secret %s/%s key %s: %w", ErrUnusable, s.Namespace, name, dhchap.KeyCtrlSecret, err)
		}
	}
	return k, nil
}
