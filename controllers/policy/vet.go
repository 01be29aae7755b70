package policy

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	"github.com/plinth-storage/plinth/schema/vet"
)

// VetObjects judges live policy objects with the embedded CUE schema and the cross-object
// rules, exactly as `plinth vet` judges files. Each object is serialized as a YAML document
// holding apiVersion, kind, metadata (name, labels, annotations) and spec; problems name it as
// "<kind>/<name>" (lower-case kind, as kubectl does) with the line and column in that
// document. It returns the decoded policies (with schema defaults) and the problems, sorted.
func VetObjects(v *vet.Vetter, pools []policyv1.StoragePool, protocols []policyv1.Protocol, placements []policyv1.Placement) (*vet.Policies, []vet.Problem) {
	set := &vet.Set{}
	add := func(kind, name string, meta map[string]any, spec any) {
		doc := map[string]any{
			"apiVersion": policyv1.GroupVersion.String(),
			"kind":       kind,
			"metadata":   meta,
			"spec":       spec,
		}
		path := strings.ToLower(kind) + "/" + name
		data, err := yaml.Marshal(doc)
		if err != nil {
			set.Problems = append(set.Problems, vet.Problem{File: path, Kind: kind, Name: name, Message: "cannot serialize: " + err.Error()})
			return
		}
		s := vet.LoadBytes(path, data)
		set.Documents = append(set.Documents, s.Documents...)
		set.Problems = append(set.Problems, s.Problems...)
	}
	for i := range pools {
		add("StoragePool", pools[i].Name, metaOf(pools[i].Name, pools[i].Labels, pools[i].Annotations), toMap(&pools[i].Spec))
	}
	for i := range protocols {
		add("Protocol", protocols[i].Name, metaOf(protocols[i].Name, protocols[i].Labels, protocols[i].Annotations), toMap(&protocols[i].Spec))
	}
	for i := range placements {
		add("Placement", placements[i].Name, metaOf(placements[i].Name, placements[i].Labels, placements[i].Annotations), toMap(&placements[i].Spec))
	}
	return v.Vet(set)
}

// metaOf keeps what a policy document may carry. The last-applied-configuration annotation of
// client-side apply is dropped: it is large and says nothing the spec does not.
func metaOf(name string, labels, annotations map[string]string) map[string]any {
	m := map[string]any{"name": name}
	if len(labels) > 0 {
		m["labels"] = labels
	}
	if len(annotations) > 0 {
		a := make(map[string]string, len(annotations))
		for k, v := range annotations {
			if k == "kubectl.kubernetes.io/last-applied-configuration" {
				continue
			}
			a[k] = v
		}
		if len(a) > 0 {
			m["annotations"] = a
		}
	}
	return m
}

func toMap(spec any) map[string]any {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(spec)
	if err != nil {
		return map[string]any{"_": fmt.Sprintf("unconvertible spec: %v", err)}
	}
	return m
}

// problemsByObject groups problems by "<Kind>/<name>"; problems without an object go under "".
func problemsByObject(ps []vet.Problem) map[string][]string {
	out := map[string][]string{}
	for _, p := range ps {
		k := ""
		if p.Kind != "" {
			k = p.Kind + "/" + p.Name
		}
		out[k] = append(out[k], p.String())
	}
	return out
}
