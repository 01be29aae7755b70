package manifests

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// ImageNames returns the images of the kustomize images component under root (the kustomize/
// folder) as name → "newName:newTag": the names the bases use and what they resolve to.
func ImageNames(root string) (map[string]string, error) {
	path := filepath.Join(root, "components", "images", "kustomization.yaml")
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var comp struct {
		Images []struct{ Name, NewName, NewTag string }
	}
	if err := yaml.Unmarshal(data, &comp); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	out := map[string]string{}
	for _, im := range comp.Images {
		if im.NewName == "" || im.NewTag == "" {
			return nil, fmt.Errorf("%s: image %q needs newName and newTag", path, im.Name)
		}
		out[im.Name] = im.NewName + ":" + im.NewTag
	}
	return out, nil
}

// ChartFiles returns the generated part of the Helm chart charts/plinth, as paths relative to
// the chart folder → content, built from the kustomize bases under root:
//   - crds/<name>.yaml: the CRDs of kustomize/default (Helm installs them before the templates);
//   - files/default/<NNN>-<kind>-<name>.yaml: every other object of kustomize/default, in the
//     order kustomize emits them, with container images put back to the names the bases use
//     ("plinth", "csi-provisioner"...) so that the chart's values can set them;
//   - files/monitoring/...: the same for kustomize/monitoring.
//
// The chart's templates read files/ and change only what its values name, so the kustomize
// bases stay the one source of the objects.
func ChartFiles(root string) (map[string][]byte, error) {
	images, err := ImageNames(root)
	if err != nil {
		return nil, err
	}
	byRef := map[string]string{}
	for name, ref := range images {
		byRef[ref] = name
	}
	out := map[string][]byte{}
	for _, base := range []string{"default", "monitoring"} {
		objs, err := Build(filepath.Join(root, base))
		if err != nil {
			return nil, err
		}
		for i, o := range objs {
			if err := unresolveImages(o, byRef); err != nil {
				return nil, fmt.Errorf("kustomize/%s %s: %w", base, ID(o), err)
			}
			data, err := yaml.Marshal(o.Object)
			if err != nil {
				return nil, err
			}
			path := fmt.Sprintf("files/%s/%03d-%s-%s.yaml", base, i, strings.ToLower(o.GetKind()), o.GetName())
			if o.GetKind() == "CustomResourceDefinition" {
				path = "crds/" + o.GetName() + ".yaml"
			}
			if _, dup := out[path]; dup {
				return nil, fmt.Errorf("kustomize/%s: two objects map to %s", base, path)
			}
			out[path] = append([]byte("# Generated from kustomize/"+base+" by test/manifests (ChartFiles); do not edit.\n"), data...)
		}
	}
	return out, nil
}

// unresolveImages puts the images of a workload's containers back to their names in the
// bases, so the chart's values can set them. An image the component does not name stays.
func unresolveImages(o *unstructured.Unstructured, byRef map[string]string) error {
	for _, field := range []string{"initContainers", "containers"} {
		cs, found, err := unstructured.NestedSlice(o.Object, "spec", "template", "spec", field)
		if err != nil {
			return err
		}
		if !found {
			continue
		}
		for _, c := range cs {
			m, ok := c.(map[string]any)
			if !ok {
				return fmt.Errorf("%s: a container is not an object", field)
			}
			if name, ok := byRef[fmt.Sprint(m["image"])]; ok {
				m["image"] = name
			}
		}
		if err := unstructured.SetNestedSlice(o.Object, cs, "spec", "template", "spec", field); err != nil {
			return err
		}
	}
	return nil
}
