package inventory

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// DefaultName is the name of the inventory ConfigMap.
const DefaultName = "plinth-inventory"

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
	inv, err := Decode(cm.Data[DataKey])
	if err != nil {
		return nil, fmt.Errorf("inventory ConfigMap %s/%s: %w", s.Namespace, s.Name, err)
	}
	return inv, nil
}

// Save writes inv when it differs from prev (prev nil means unknown: always write). It
// returns whether it wrote, so an unchanged reconcile makes no write.
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
		Data: map[string]string{DataKey: inv.Encode()},
	}
	//nolint:staticcheck // client.Apply with a typed object is what controller-runtime v0.25 supports for ConfigMaps.
	if err := s.Client.Patch(ctx, cm, client.Apply, client.FieldOwner(s.FieldOwner), client.ForceOwnership); err != nil {
		return false, fmt.Errorf("write inventory ConfigMap %s/%s: %w", s.Namespace, s.Name, err)
	}
	return true, nil
}
