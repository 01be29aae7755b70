package manifests

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/plinth-storage/plinth/test/framework/deploy"
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

// Build runs kustomize on dir the way Plinth's deployer does (test/framework/deploy.Build: krusty,
// default options, load restrictions root-only, no plugins) and returns the objects in the
// order kustomize emits them. Errors are kustomize's.
func Build(dir string) ([]*unstructured.Unstructured, error) { return deploy.Build(dir) }

// ID names an object as kind/namespace/name (namespace empty for cluster-scoped objects).
func ID(o *unstructured.Unstructured) string {
	return strings.Join([]string{o.GetKind(), o.GetNamespace(), o.GetName()}, "/")
}
