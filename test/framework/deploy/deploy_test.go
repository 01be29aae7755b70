package deploy

import (
	"path/filepath"
	"reflect"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func kustomizeDir(t *testing.T, rel string) string {
	t.Helper()
	// go test runs in the package folder; runtime.Caller is no use here, since
	// -trimpath (the Makefile's GOFLAGS) turns it into an import path.
	dir, err := filepath.Abs(filepath.Join("..", "..", "..", "kustomize", rel))
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// The dev overlay changes only what its comments name: the replicas of the four
// leader-elected Deployments and the agent's modules init container (and its volume).
// Every other object, and every other field of those, is default/'s or snapshot-controller/'s.
func TestDevOverlayChangesOnlyWhatItSays(t *testing.T) {
	base, err := Build(kustomizeDir(t, "default"))
	if err != nil {
		t.Fatal(err)
	}
	snap, err := Build(kustomizeDir(t, "snapshot-controller"))
	if err != nil {
		t.Fatal(err)
	}
	base = append(base, snap...)
	dev, err := Build(kustomizeDir(t, "overlays/dev"))
	if err != nil {
		t.Fatal(err)
	}
	key := func(o *unstructured.Unstructured) string {
		return o.GetKind() + "/" + o.GetNamespace() + "/" + o.GetName()
	}
	byKey := map[string]*unstructured.Unstructured{}
	for _, o := range base {
		byKey[key(o)] = o
	}
	if len(dev) != len(base) {
		t.Fatalf("overlays/dev builds %d objects, default %d", len(dev), len(base))
	}
	changed := map[string]bool{}
	for _, o := range dev {
		b, ok := byKey[key(o)]
		if !ok {
			t.Errorf("overlays/dev adds %s", key(o))
			continue
		}
		b = b.DeepCopy()
		switch key(o) {
		case "Deployment/plinth-system/plinth-controller", "Deployment/plinth-system/plinth-csi-controller", "Deployment/plinth-system/plinth-scheduler",
			"Deployment/kube-system/snapshot-controller":
			if n, _, _ := unstructured.NestedInt64(o.Object, "spec", "replicas"); n != 1 {
				t.Errorf("%s: replicas %d, want 1", key(o), n)
			}
			_ = unstructured.SetNestedField(b.Object, int64(1), "spec", "replicas")
			changed[key(o)] = true
		case "DaemonSet/plinth-system/plinth-agent":
			// The strategic-merge delete leaves an empty list, which the API server drops.
			if ic, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "initContainers"); len(ic) != 0 {
				t.Errorf("%s: initContainers still there: %v", key(o), ic)
			}
			o = o.DeepCopy()
			unstructured.RemoveNestedField(o.Object, "spec", "template", "spec", "initContainers")
			unstructured.RemoveNestedField(b.Object, "spec", "template", "spec", "initContainers")
			vols, _, _ := unstructured.NestedSlice(b.Object, "spec", "template", "spec", "volumes")
			var keep []any
			for _, v := range vols {
				if n := v.(map[string]any)["name"]; n != "modules" && n != "configfs" {
					keep = append(keep, v)
				}
			}
			if len(keep) != len(vols)-2 {
				t.Errorf("default's agent lacks the modules or configfs volume: %v", vols)
			}
			_ = unstructured.SetNestedSlice(b.Object, keep, "spec", "template", "spec", "volumes")
			cts, _, _ := unstructured.NestedSlice(b.Object, "spec", "template", "spec", "containers")
			ct := cts[0].(map[string]any)
			var mounts []any
			for _, m := range ct["volumeMounts"].([]any) {
				if m.(map[string]any)["name"] != "configfs" {
					mounts = append(mounts, m)
				}
			}
			ct["volumeMounts"] = mounts
			_ = unstructured.SetNestedSlice(b.Object, cts, "spec", "template", "spec", "containers")
			noHostNetwork(b)
			changed[key(o)] = true
		case "DaemonSet/plinth-system/plinth-csi-node":
			noHostNetwork(b)
			changed[key(o)] = true
		}
		if !reflect.DeepEqual(o.Object, b.Object) {
			t.Errorf("overlays/dev changes %s beyond what its comments say:\n got %v\nwant %v", key(o), o.Object, b.Object)
		}
	}
	if len(changed) != 6 {
		t.Errorf("changed %v, want the four Deployments and the two DaemonSets", changed)
	}
}

// noHostNetwork is what the overlay does to the node DaemonSets: the dev
// nodes share one network namespace, so fixed host ports would collide.
func noHostNetwork(o *unstructured.Unstructured) {
	_ = unstructured.SetNestedField(o.Object, false, "spec", "template", "spec", "hostNetwork")
	_ = unstructured.SetNestedField(o.Object, "ClusterFirst", "spec", "template", "spec", "dnsPolicy")
}
