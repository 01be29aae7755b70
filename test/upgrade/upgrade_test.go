package upgrade_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/test/framework/controlplane"
)

// released is the last release whose CRDs users may have objects under.
const released = "v0.1.0"

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// gvr maps a fixture's kind to its resource (every Plinth kind's plural is kind+"s").
func gvr(u *unstructured.Unstructured) schema.GroupVersionResource {
	gv := u.GroupVersionKind()
	return schema.GroupVersionResource{Group: gv.Group, Version: gv.Version, Resource: strings.ToLower(gv.Kind) + "s"}
}

// readYAML returns the documents of a multi-document YAML file.
func readYAML(t *testing.T, path string) []*unstructured.Unstructured {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, os.ErrNotExist) || err.Error() == "EOF" {
				break
			}
			t.Fatalf("%s: %v", path, err)
		}
		if len(u.Object) > 0 {
			out = append(out, u)
		}
	}
	return out
}

// applyCRDs creates or updates (the upgrade) every CRD in dir and waits until each is
// Established at the version written.
func applyCRDs(ctx context.Context, t *testing.T, dyn dynamic.Interface, dir string) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no CRD YAML in %s (%v)", dir, err)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		crd := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(data, &crd.Object); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		var written *unstructured.Unstructured
		cur, err := dyn.Resource(crdGVR).Get(ctx, crd.GetName(), metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			written, err = dyn.Resource(crdGVR).Create(ctx, crd, metav1.CreateOptions{})
		case err == nil:
			crd.SetResourceVersion(cur.GetResourceVersion())
			written, err = dyn.Resource(crdGVR).Update(ctx, crd, metav1.UpdateOptions{})
		}
		if err != nil {
			t.Fatalf("apply %s: %v", f, err)
		}
		controlplane.Eventually(t, 30*time.Second, 50*time.Millisecond, "CRD "+crd.GetName()+" Established", func() error {
			got, err := dyn.Resource(crdGVR).Get(ctx, crd.GetName(), metav1.GetOptions{})
			if err != nil {
				return err
			}
			if got.GetGeneration() < written.GetGeneration() {
				return fmt.Errorf("generation %d, wrote %d", got.GetGeneration(), written.GetGeneration())
			}
			conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
			for _, c := range conds {
				if m, _ := c.(map[string]any); m["type"] == "Established" && m["status"] == "True" {
					return nil
				}
			}
			return errors.New("not Established")
		})
	}
}

// content is what the upgrade must keep of an object: everything but server-set metadata.
func content(u *unstructured.Unstructured) map[string]any {
	out := map[string]any{}
	for k, v := range u.Object {
		if k != "metadata" {
			out[k] = v
		}
	}
	out["labels"] = u.GetLabels()
	out["finalizers"] = u.GetFinalizers()
	return out
}

// statusOf gives each runtime fixture the status v0.1.0's agent wrote.
func statusOf(kind string) map[string]any {
	cond := map[string]any{"type": "Ready", "status": "True", "reason": "Succeeded", "message": "fine",
		"lastTransitionTime": "2026-11-01T10:00:00Z", "observedGeneration": int64(1)}
	switch kind {
	case "VolumeState":
		return map[string]any{"phase": "Ready", "actualBytes": int64(1073741824), "devicePath": "/dev/plinth-fast/vol-0123456789abcdef0123456789abcdef01234567",
			"export":             map[string]any{"nqn": "nqn.2014-08.dev.plinth:vol-0123456789abcdef0123456789abcdef01234567", "address": "10.0.0.5", "port": int64(4420)},
			"observedGeneration": int64(1), "observedPublicationGeneration": int64(1), "conditions": []any{cond}}
	case "Store":
		return map[string]any{"observedGeneration": int64(1), "conditions": []any{cond}, "extentBytes": int64(4194304),
			"capacity":          map[string]any{"total": int64(100 << 30), "allocatable": int64(95 << 30), "provisioned": int64(1 << 30), "available": int64(141 << 30)},
			"lastHeartbeatTime": "2026-11-01T10:00:00Z"}
	case "Agent":
		return map[string]any{"conditions": []any{cond}, "address": "10.0.0.5", "version": released,
			"hostNQN":           "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-0000000000aa",
			"lastHeartbeatTime": "2026-11-01T10:00:00Z"}
	}
	return nil
}

// TestUpgradeFromReleasedCRDs writes objects under the released CRDs, upgrades the CRDs to
// this tree's (schema/crd/bases), and checks each object reads back unchanged, decodes into
// this tree's Go types without unknown fields, and takes an update of spec and status.
func TestUpgradeFromReleasedCRDs(t *testing.T) {
	cp := controlplane.ForTest(t, controlplane.Options{})
	ctx := t.Context()
	dyn, err := dynamic.NewForConfig(cp.Admin.Config)
	if err != nil {
		t.Fatal(err)
	}
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{policyv1.AddToScheme, storev1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	c, err := client.New(cp.Admin.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}

	applyCRDs(ctx, t, dyn, filepath.Join("testdata", "crds-"+released))
	objs := readYAML(t, filepath.Join("testdata", "objects-"+released+".yaml"))
	before := map[string]map[string]any{}
	for _, o := range objs {
		r := dyn.Resource(gvr(o))
		got, err := r.Create(ctx, o, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("%s %s under the %s CRDs: %v", o.GetKind(), o.GetName(), released, err)
		}
		if st := statusOf(o.GetKind()); st != nil {
			got.Object["status"] = st
			if got, err = r.UpdateStatus(ctx, got, metav1.UpdateOptions{}); err != nil {
				t.Fatalf("status of %s %s under the %s CRDs: %v", o.GetKind(), o.GetName(), released, err)
			}
		}
		// the fixture is what v0.1.0 stored: nothing pruned or defaulted away at write
		want := content(o)
		if st := statusOf(o.GetKind()); st != nil {
			want["status"] = st
		}
		if diff := missing(want, content(got), ""); len(diff) > 0 {
			t.Fatalf("%s %s: the %s CRDs dropped %v: the fixture does not match the released schema", o.GetKind(), o.GetName(), released, diff)
		}
		before[o.GetKind()+"/"+o.GetName()] = content(got)
	}

	root, err := controlplane.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	applyCRDs(ctx, t, dyn, filepath.Join(root, "schema", "crd", "bases"))

	for _, o := range objs {
		key := o.GetKind() + "/" + o.GetName()
		t.Run(key, func(t *testing.T) {
			r := dyn.Resource(gvr(o))
			got, err := r.Get(ctx, o.GetName(), metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			// pruning applies on read too: a field the new schema dropped is gone here
			if now := content(got); !equality.Semantic.DeepEqual(now, before[key]) {
				a, _ := json.Marshal(before[key])
				b, _ := json.Marshal(now)
				t.Errorf("changed by the CRD upgrade:\n before %s\n after  %s", a, b)
			}
			// this tree's Go types read every field v0.1.0 wrote
			typed, err := scheme.New(got.GroupVersionKind())
			if err != nil {
				t.Fatal(err)
			}
			raw, _ := json.Marshal(got.Object)
			dec := json.NewDecoder(bytes.NewReader(raw))
			dec.DisallowUnknownFields()
			if err := dec.Decode(typed); err != nil {
				t.Errorf("this tree's %s type does not read the %s object: %v", o.GetKind(), released, err)
			}
			// an update of spec (a label and one field) and of status is accepted
			obj := typed.(client.Object)
			labels := obj.GetLabels()
			if labels == nil {
				labels = map[string]string{}
			}
			labels["test.plinth.dev/upgraded"] = "yes"
			obj.SetLabels(labels)
			touchSpec(obj)
			if err := c.Update(ctx, obj); err != nil {
				t.Fatalf("update after the upgrade: %v", err)
			}
			switch x := obj.(type) {
			case *storev1.VolumeState:
				x.Status.ObservedGeneration = x.Generation
				if err := c.Status().Update(ctx, x); err != nil {
					t.Errorf("status update after the upgrade: %v", err)
				}
			case *storev1.Store:
				x.Status.ObservedGeneration = x.Generation
				if err := c.Status().Update(ctx, x); err != nil {
					t.Errorf("status update after the upgrade: %v", err)
				}
			}
		})
	}
}

// touchSpec changes one spec field the way users and Plinth do after an upgrade.
func touchSpec(o client.Object) {
	switch x := o.(type) {
	case *policyv1.StoragePool:
		x.Spec.Reserve = "2Gi"
	case *policyv1.Protocol:
		if x.Spec.NVMeoFTCP != nil {
			x.Spec.NVMeoFTCP.MaxQueueSize = 64
		}
	case *policyv1.Placement:
		x.Spec.Strategy = policyv1.StrategyBinpack
	case *storev1.Agent:
		x.Spec.Stores = append(x.Spec.Stores, "bulk.node-a")
	case *storev1.Store:
		x.Spec.OvercommitPercent = 200
	case *storev1.VolumeState:
		x.Spec.CapacityBytes *= 2
		x.Spec.PublicationGeneration++
		x.Spec.Publications = nil
	}
}

// missing lists the paths of want that got lacks or holds with another value (got may hold
// more: server defaults).
func missing(want, got map[string]any, at string) []string {
	var out []string
	for k, w := range want {
		g, ok := got[k]
		path := at + "." + k
		if !ok {
			out = append(out, path)
			continue
		}
		wm, wIsMap := w.(map[string]any)
		gm, gIsMap := g.(map[string]any)
		if wIsMap && gIsMap {
			out = append(out, missing(wm, gm, path)...)
			continue
		}
		wj, _ := json.Marshal(w)
		gj, _ := json.Marshal(g)
		if !bytes.Equal(wj, gj) && !(wIsMap && len(wm) == 0) {
			out = append(out, path)
		}
	}
	return out
}
