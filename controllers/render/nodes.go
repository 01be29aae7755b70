package render

import (
	"fmt"
	"os"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/plinth-storage/plinth/schema/vet"
)

// LoadNodes reads a node inventory: a List or NodeList as `kubectl get nodes -o yaml` prints
// it, or a stream of Node documents. Errors name the file and line of the offending document.
func LoadNodes(path string) ([]corev1.Node, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return ParseNodes(path, data)
}

// ParseNodes parses the node inventory in data (see LoadNodes); path is used in errors only.
func ParseNodes(path string, data []byte) ([]corev1.Node, error) {
	set := vet.LoadBytes(path, data)
	if len(set.Problems) > 0 {
		return nil, fmt.Errorf("%s", set.Problems[0].String())
	}
	if len(set.Documents) == 0 {
		return nil, fmt.Errorf("%s: no Node objects (expected the output of kubectl get nodes -o yaml)", path)
	}
	var nodes []corev1.Node
	seen := map[string]bool{}
	add := func(d *vet.Document, n corev1.Node, where string) error {
		if n.Name == "" {
			return fmt.Errorf("%s:%d: %s: Node without metadata.name", d.File, d.Line, where)
		}
		if seen[n.Name] {
			return fmt.Errorf("%s:%d: %s: duplicate Node %q", d.File, d.Line, where, n.Name)
		}
		seen[n.Name] = true
		nodes = append(nodes, n)
		return nil
	}
	for _, d := range set.Documents {
		switch {
		case d.Kind == "Node" && (d.APIVersion == "v1" || d.APIVersion == ""):
			var n corev1.Node
			if err := yaml.Unmarshal(d.YAML, &n); err != nil {
				return nil, fmt.Errorf("%s:%d: Node: %w", d.File, d.Line, err)
			}
			if err := add(d, n, "Node"); err != nil {
				return nil, err
			}
		case d.Kind == "List" || d.Kind == "NodeList":
			var l struct {
				Items []corev1.Node `json:"items"`
			}
			if err := yaml.Unmarshal(d.YAML, &l); err != nil {
				return nil, fmt.Errorf("%s:%d: %s: %w", d.File, d.Line, d.Kind, err)
			}
			for i, n := range l.Items {
				if n.Kind != "" && n.Kind != "Node" {
					return nil, fmt.Errorf("%s:%d: %s: items[%d] is a %s, not a Node", d.File, d.Line, d.Kind, i, n.Kind)
				}
				if err := add(d, n, fmt.Sprintf("%s: items[%d]", d.Kind, i)); err != nil {
					return nil, err
				}
			}
		default:
			kind := d.Kind
			if kind == "" {
				kind = "document without kind"
			}
			return nil, fmt.Errorf("%s:%d: %s is not a Node, NodeList or List (expected the output of kubectl get nodes -o yaml)", d.File, d.Line, kind)
		}
	}
	return nodes, nil
}
