package policy

import (
	"fmt"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	"github.com/plinth-storage/plinth/schema/vet"
)

// VetObjects judges live policy objects with the embedded CUE schema and the cross-object
// rules, exactly as `plinth vet` judges files. Each object is serialized as a YAML document
// holding apiVersion, kind, metadata (name, labels, annotations) and spec; problems name it as
// "<kind>/<name>" (lower-case kind, as kubectl does) with the line and column in that
// document. It returns the decoded policies (with schema defaults, and the UID and
// resourceVersion of the live objects: render.Renderer reads them) and the problems, sorted.
func VetObjects(v *vet.Vetter, pools []policyv1.StoragePool, protocols []policyv1.Protocol, placements []policyv1.Placement) (*vet.Policies, []vet.Problem) {
	return (&KeptVetter{v: v}).VetObjects(pools, protocols, placements)
}

// KeptVetter judges live policy objects as VetObjects does and keeps each object's own
// verdict (its document judged against the schema, decoded) by UID and resourceVersion: an
// object whose resourceVersion is unchanged is not serialized, parsed or unified again, only
// the cross-object rules (maps keyed by name) run over the whole set. Objects without a UID or
// resourceVersion are judged every time. A KeptVetter must not be used from several
// goroutines at once.
type KeptVetter struct {
	v    *vet.Vetter
	kept map[types.UID]*keptVerdict
	pass uint64
	comb vet.Combiner
	// judged counts the objects judged anew (not kept), for tests.
	judged int
}

type keptVerdict struct {
	resourceVersion string
	verdict         *vet.Verdict
	pass            uint64 // the last VetObjects that saw the object
}

// NewKeptVetter returns a KeptVetter judging with v.
func NewKeptVetter(v *vet.Vetter) *KeptVetter {
	return &KeptVetter{v: v, kept: map[types.UID]*keptVerdict{}}
}

// VetObjects is VetObjects with the verdicts kept (see KeptVetter); the result is the same, but
// the Policies it returns are overwritten by its next call (vet.Combiner). Verdicts of objects
// absent from this call are dropped.
func (k *KeptVetter) VetObjects(pools []policyv1.StoragePool, protocols []policyv1.Protocol, placements []policyv1.Placement) (*vet.Policies, []vet.Problem) {
	k.pass++
	verdicts := make([]*vet.Verdict, 0, len(pools)+len(protocols)+len(placements))
	var setProblems []vet.Problem
	judge := func(kind string, o *metav1.ObjectMeta, spec any) {
		kv := k.kept[o.UID]
		if kv != nil && o.UID != "" && o.ResourceVersion != "" && kv.resourceVersion == o.ResourceVersion {
			kv.pass = k.pass
			verdicts = append(verdicts, kv.verdict)
			return
		}
		k.judged++
		path := strings.ToLower(kind) + "/" + o.Name
		doc := map[string]any{
			"apiVersion": policyv1.GroupVersion.String(),
			"kind":       kind,
			"metadata":   metaOf(o.Name, o.Labels, o.Annotations),
			"spec":       toMap(spec),
		}
		data, err := yaml.Marshal(doc)
		if err != nil {
			setProblems = append(setProblems, vet.Problem{File: path, Kind: kind, Name: o.Name, Message: "cannot serialize: " + err.Error()})
			return
		}
		s := vet.LoadBytes(path, data)
		setProblems = append(setProblems, s.Problems...)
		for _, d := range s.Documents {
			vr := k.v.Judge(d)
			if mo, ok := vr.Object.(metav1.Object); ok {
				mo.SetUID(o.UID)
				mo.SetResourceVersion(o.ResourceVersion)
			}
			verdicts = append(verdicts, vr)
		}
		if k.kept != nil && o.UID != "" && o.ResourceVersion != "" && len(s.Problems) == 0 && len(s.Documents) == 1 {
			vr := verdicts[len(verdicts)-1]
			vr.Document.DropSyntax() // judged: kept, the text is enough
			k.kept[o.UID] = &keptVerdict{resourceVersion: o.ResourceVersion, verdict: vr, pass: k.pass}
		}
	}
	for i := range pools {
		judge("StoragePool", &pools[i].ObjectMeta, &pools[i].Spec)
	}
	for i := range protocols {
		judge("Protocol", &protocols[i].ObjectMeta, &protocols[i].Spec)
	}
	for i := range placements {
		judge("Placement", &placements[i].ObjectMeta, &placements[i].Spec)
	}
	for uid, kv := range k.kept {
		if kv.pass != k.pass {
			delete(k.kept, uid)
		}
	}
	return k.comb.Combine(verdicts, setProblems)
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
