package devenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/test/framework/wait"
)

// readObjects decodes every YAML document of the given files (skipping empty ones).
func readObjects(files ...string) ([]*unstructured.Unstructured, error) {
	var out []*unstructured.Unstructured
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		objs, err := decodeObjects(data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		out = append(out, objs...)
	}
	return out, nil
}

func decodeObjects(data []byte) ([]*unstructured.Unstructured, error) {
	var out []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, err
		}
		if len(m) == 0 {
			continue
		}
		out = append(out, &unstructured.Unstructured{Object: m})
	}
}

// apply server-side applies obj under FieldManager, forcing ownership.
func (e *Env) apply(ctx context.Context, obj *unstructured.Unstructured) error {
	obj = obj.DeepCopy()
	obj.SetManagedFields(nil)
	obj.SetResourceVersion("")
	//nolint:staticcheck // client.Apply with unstructured objects is what this needs.
	return e.Client.Patch(ctx, obj, client.Apply, client.FieldOwner(FieldManager), client.ForceOwnership)
}

func (e *Env) ensureNamespace(ctx context.Context, name string) error {
	err := e.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

func (e *Env) applyCRDFiles(ctx context.Context, files []string) (int, error) {
	crds, err := readObjects(files...)
	if err != nil {
		return 0, err
	}
	for _, c := range crds {
		if err := e.apply(ctx, c); err != nil {
			return 0, fmt.Errorf("CRD %s: %w", c.GetName(), err)
		}
	}
	for _, c := range crds {
		if err := poll(ctx, time.Minute, func() error {
			got := &unstructured.Unstructured{}
			got.SetGroupVersionKind(c.GroupVersionKind())
			if err := e.Client.Get(ctx, client.ObjectKey{Name: c.GetName()}, got); err != nil {
				return err
			}
			conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
			for _, ci := range conds {
				m, _ := ci.(map[string]any)
				if m["type"] == "Established" && m["status"] == "True" {
					return nil
				}
			}
			return fmt.Errorf("CRD %s not Established", c.GetName())
		}); err != nil {
			return 0, err
		}
	}
	return len(crds), nil
}

// poll is wait.Poll every 100 ms.
func poll(ctx context.Context, timeout time.Duration, f func() error) error {
	return wait.Poll(ctx, timeout, 100*time.Millisecond, f)
}
