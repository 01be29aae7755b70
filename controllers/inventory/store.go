package inventory

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// DefaultName is the name of the inventory ConfigMap.
const DefaultName = "plinth-inventory"

const (
	// BinaryDataKey is the ConfigMap binaryData key of an inventory whose text is larger than
	// CompressAbove: the same text, gzip-compressed.
	BinaryDataKey = "inventory.gz"
	// CompressAbove is the size in bytes of Encode's text above which the inventory is stored
	// compressed (about 4,700 entries: 1,000 nodes render 2,001 objects, 5,000 nodes 10,001).
	CompressAbove = 512 << 10
	// MaxStoredBytes is the most the compressed inventory may take: the API server refuses a
	// ConfigMap whose data and binaryData exceed 1 MiB (corev1 MaxSecretSize); the rest is
	// left for the object's metadata.
	MaxStoredBytes = 1<<20 - 16<<10
	// maxDecodedBytes bounds the inflated text read back (a ConfigMap edited by hand could
	// hold a small gzip stream that inflates without end).
	maxDecodedBytes = 64 << 20
)

// Store reads and writes the inventory ConfigMap Namespace/Name.
type Store struct {
	// Client writes the ConfigMap; Reader reads it (the API server directly, so no informer
	// on every ConfigMap of the cluster is needed); nil Reader means Client.
	Client    client.Client
	Reader    client.Reader
	Namespace string
	Name      string
	// FieldOwner is the field manager of the ConfigMap writes.
	FieldOwner string
}

// Load returns the stored inventory; a missing ConfigMap is an empty inventory, not an error.
func (s *Store) Load(ctx context.Context) (*Inventory, error) {
	var cm corev1.ConfigMap
	var rd client.Reader = s.Client
	if s.Reader != nil {
		rd = s.Reader
	}
	err := rd.Get(ctx, types.NamespacedName{Namespace: s.Namespace, Name: s.Name}, &cm)
	if apierrors.IsNotFound(err) {
		return New(), nil
	}
	if err != nil {
		return nil, fmt.Errorf("read inventory ConfigMap %s/%s: %w", s.Namespace, s.Name, err)
	}
	inv, err := decodeConfigMap(&cm)
	if err != nil {
		return nil, fmt.Errorf("inventory ConfigMap %s/%s: %w", s.Namespace, s.Name, err)
	}
	return inv, nil
}

// decodeConfigMap reads the inventory from cm: binaryData[BinaryDataKey] (gzip) when present,
// else data[DataKey].
func decodeConfigMap(cm *corev1.ConfigMap) (*Inventory, error) {
	gz, ok := cm.BinaryData[BinaryDataKey]
	if !ok {
		return Decode(cm.Data[DataKey])
	}
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		return nil, fmt.Errorf("binaryData %s: %w", BinaryDataKey, err)
	}
	// A ConfigMap holds at most 1 MiB; refuse to inflate it past maxDecodedBytes.
	text, err := io.ReadAll(io.LimitReader(zr, maxDecodedBytes+1))
	if err != nil {
		return nil, fmt.Errorf("binaryData %s: %w", BinaryDataKey, err)
	}
	if len(text) > maxDecodedBytes {
		return nil, fmt.Errorf("binaryData %s inflates to more than %d bytes", BinaryDataKey, maxDecodedBytes)
	}
	return Decode(string(text))
}

// encodeConfigMap returns the data or binaryData of the inventory ConfigMap holding inv: the
// text of Encode under data[DataKey] up to CompressAbove bytes, above that the same text
// gzip-compressed under binaryData[BinaryDataKey] (sha256 digests in hex compress to about
// half; names much more). An inventory too large for a ConfigMap even compressed is an error
// that says how many objects and bytes it holds.
func encodeConfigMap(inv *Inventory) (map[string]string, map[string][]byte, error) {
	text := inv.Encode()
	if len(text) <= CompressAbove {
		return map[string]string{DataKey: text}, nil, nil
	}
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return nil, nil, err
	}
	if _, err := zw.Write([]byte(text)); err != nil {
		return nil, nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, nil, err
	}
	if buf.Len() > MaxStoredBytes {
		return nil, nil, fmt.Errorf("the inventory of %d objects is %d bytes gzip-compressed (%d as text): more than the %d bytes a ConfigMap holds",
			inv.Len(), buf.Len(), len(text), MaxStoredBytes)
	}
	return nil, map[string][]byte{BinaryDataKey: buf.Bytes()}, nil
}

// Save writes inv when it differs from prev (prev nil means unknown: always write). It
// returns whether it wrote, so an unchanged reconcile makes no write. The write is a
// server-side apply of the one key encodeConfigMap chose, so moving between the plain and the
// compressed form removes the other key.
func (s *Store) Save(ctx context.Context, prev, inv *Inventory) (bool, error) {
	if prev != nil && prev.Equal(inv) {
		return false, nil
	}
	cm := &corev1.ConfigMap{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{
			Namespace: s.Namespace,
			Name:      s.Name,
			Labels:    map[string]string{"app.kubernetes.io/managed-by": "plinth", "app.kubernetes.io/component": "inventory"},
		},
	}
	var err error
	if cm.Data, cm.BinaryData, err = encodeConfigMap(inv); err != nil {
		return false, fmt.Errorf("inventory ConfigMap %s/%s: %w", s.Namespace, s.Name, err)
	}
	//nolint:staticcheck // client.Apply with a typed object is what controller-runtime v0.25 supports for ConfigMaps.
	if err := s.Client.Patch(ctx, cm, client.Apply, client.FieldOwner(s.FieldOwner), client.ForceOwnership); err != nil {
		return false, fmt.Errorf("write inventory ConfigMap %s/%s: %w", s.Namespace, s.Name, err)
	}
	return true, nil
}
