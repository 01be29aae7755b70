package manifests

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// Kustomizations returns the folders under root (the kustomize/ folder) that hold a
// kustomization.yaml of kind Kustomization (components are left out: they build only inside
// a kustomization), relative to root with forward slashes, sorted.
func Kustomizations(root string) ([]string, error) {
	var dirs []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "kustomization.yaml" {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		var head struct{ Kind string }
		if err := yaml.Unmarshal(data, &head); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		if head.Kind == "Component" {
			return nil
		}
		rel, err := filepath.Rel(root, filepath.Dir(p))
		if err != nil {
			return err
		}
		dirs = append(dirs, filepath.ToSlash(rel))
		return nil
	})
	sort.Strings(dirs)
	return dirs, err
}

// Build runs kustomize (krusty, default options: load restrictions root-only, no plugins) on
// dir and returns the objects in the order kustomize emits them. Errors are kustomize's.
func Build(dir string) ([]*unstructured.Unstructured, error) {
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	var objs []*unstructured.Unstructured
	for _, r := range m.Resources() {
		// Through JSON: numbers become int64/float64 as unstructured objects need them.
		data, err := r.MarshalJSON()
		if err != nil {
			return nil, fmt.Errorf("kustomize build %s: %s: %w", dir, r.CurId(), err)
		}
		obj := &unstructured.Unstructured{}
		if err := obj.UnmarshalJSON(data); err != nil {
			return nil, fmt.Errorf("kustomize build %s: %s: %w", dir, r.CurId(), err)
		}
		objs = append(objs, obj)
	}
	return objs, nil
}

// ID names an object as kind/namespace/name (namespace empty for cluster-scoped objects).
func ID(o *unstructured.Unstructured) string {
	return strings.Join([]string{o.GetKind(), o.GetNamespace(), o.GetName()}, "/")
}
