package controlplane_test

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"
)

var (
	crdGVR         = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	storagePoolGVR = schema.GroupVersionResource{Group: "policy.plinth.dev", Version: "v1alpha1", Resource: "storagepools"}
)

// installCRDs creates every CRD in dir (the generated YAML, read as
// unstructured so this test does not depend on Plinth's Go types) and waits
// until each is Established. It returns their names.
func installCRDs(ctx context.Context, t *testing.T, dyn dynamic.Interface, dir string) []*unstructured.Unstructured {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no CRD YAML in %s (%v)", dir, err)
	}
	var crds []*unstructured.Unstructured
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		obj := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(data, &obj.Object); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if obj.GetKind() != "CustomResourceDefinition" {
			continue
		}
		if _, err := dyn.Resource(crdGVR).Create(ctx, obj, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("API server rejects %s: %v", filepath.Base(f), err)
		}
		crds = append(crds, obj)
	}
	for _, crd := range crds {
		eventually(t, 30*time.Second, "CRD "+crd.GetName()+" Established", func() error {
			got, err := dyn.Resource(crdGVR).Get(ctx, crd.GetName(), metav1.GetOptions{})
			if err != nil {
				return err
			}
			conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
			for _, c := range conds {
				m, _ := c.(map[string]any)
				if m["type"] == "Established" && m["status"] == "True" {
					return nil
				}
			}
			return errNotYet
		})
	}
	return crds
}

type notYet struct{}

func (notYet) Error() string { return "not yet" }

var errNotYet error = notYet{}

func TestPlinthCRDsAndStoragePoolRoundTrip(t *testing.T) {
	cp := sharedControlPlane(t)
	ctx := t.Context()
	_, dyn := clients(t, cp.Admin)
	crds := installCRDs(ctx, t, dyn, crdDir(t))
	if len(crds) < 6 {
		t.Errorf("want the 6 CRDs of docs/design.md (3 policy, 3 runtime), got %d", len(crds))
	}
	for _, crd := range crds {
		if scope, _, _ := unstructured.NestedString(crd.Object, "spec", "scope"); scope != "Cluster" {
			t.Errorf("CRD %s: scope %q, docs/design.md says every custom resource is cluster-scoped", crd.GetName(), scope)
		}
	}

	pool := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "policy.plinth.dev/v1alpha1",
		"kind":       "StoragePool",
		"metadata":   map[string]any{"name": "fast-nvme"},
		"spec": map[string]any{
			"nodeSelector": map[string]any{"matchLabels": map[string]any{"plinth.dev/storage": "true"}},
			"backend": map[string]any{"lvm": map[string]any{
				"volumeGroup": "plinth",
				"devices":     []any{"/dev/nvme0n1"},
				"thinPool":    map[string]any{"name": "thin", "sizePercent": int64(80)},
			}},
			"reserve":           "10%",
			"overcommitPercent": int64(200),
		},
	}}
	client := dyn.Resource(storagePoolGVR)
	var created *unstructured.Unstructured
	eventually(t, 15*time.Second, "create StoragePool", func() (err error) {
		created, err = client.Create(ctx, pool, metav1.CreateOptions{})
		return err
	})
	got, err := client.Get(ctx, "fast-nvme", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.GetNamespace() != "" || got.GetUID() != created.GetUID() {
		t.Errorf("got namespace %q uid %s, want cluster-scoped uid %s", got.GetNamespace(), got.GetUID(), created.GetUID())
	}
	want := pool.Object["spec"].(map[string]any)
	want["driftPolicy"] = "Report" // the schema's default
	if spec := got.Object["spec"]; !reflect.DeepEqual(spec, want) {
		t.Errorf("spec round trip:\n got %#v\nwant %#v", spec, want)
	}

	// The server enforces the schema's CEL rules: one backend only.
	bad := pool.DeepCopy()
	bad.SetName("two-backends")
	_ = unstructured.SetNestedField(bad.Object, map[string]any{"directory": "/var/lib/plinth"}, "spec", "backend", "file")
	if _, err := client.Create(ctx, bad, metav1.CreateOptions{}); !apierrors.IsInvalid(err) {
		t.Errorf("StoragePool with two backends: want Invalid, got %v", err)
	}

	if err := client.Delete(ctx, "fast-nvme", metav1.DeleteOptions{}); err != nil {
		t.Error(err)
	}
}
