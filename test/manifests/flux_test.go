package manifests

import (
	"testing"

	"github.com/fluxcd/cli-utils/pkg/kstatus/status"
	"github.com/fluxcd/pkg/apis/kustomize"
	fluxcel "github.com/fluxcd/pkg/runtime/cel"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// The healthCheckExprs of the storage-policies Kustomization, evaluated by Flux's own evaluator
// (fluxcd/pkg/runtime/cel, what kustomize-controller runs), give kstatus Current, Failed and
// InProgress for the conditions Plinth writes.
func TestFluxHealthCheckExprs(t *testing.T) {
	ks := find(t, allBuilds(t)["flux"], "Kustomization", "storage-policies")
	if deps, _, _ := unstructured.NestedSlice(ks.Object, "spec", "dependsOn"); len(deps) != 1 || deps[0].(map[string]any)["name"] != "plinth" {
		t.Errorf("storage-policies dependsOn %v, want plinth", deps)
	}
	exprs, _, _ := unstructured.NestedSlice(ks.Object, "spec", "healthCheckExprs")
	kinds := map[string]bool{}
	for _, e := range exprs {
		m := e.(map[string]any)
		kind := m["kind"].(string)
		kinds[kind] = true
		str := func(k string) string { s, _ := m[k].(string); return s }
		ev, err := fluxcel.NewStatusEvaluator(&kustomize.HealthCheckExpressions{Current: str("current"), Failed: str("failed"), InProgress: str("inProgress")})
		if err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		cases := []struct {
			name, status string
			generation   int64
			want         status.Status
		}{
			{"ready", `status: {observedGeneration: 2, conditions: [{type: Ready, status: "True"}]}`, 2, status.CurrentStatus},
			{"stalled", `status: {observedGeneration: 1, conditions: [{type: Ready, status: "False"}, {type: Stalled, status: "True"}]}`, 1, status.FailedStatus},
			{"reconciling", `status: {observedGeneration: 1, conditions: [{type: Ready, status: "Unknown"}, {type: Reconciling, status: "True"}]}`, 1, status.InProgressStatus},
			{"stale generation", `status: {observedGeneration: 1, conditions: [{type: Ready, status: "True"}]}`, 2, status.InProgressStatus},
			{"drifted but ready", `status: {observedGeneration: 1, conditions: [{type: Drifted, status: "True"}, {type: Ready, status: "True"}]}`, 1, status.CurrentStatus},
			{"status without conditions", `status: {observedGeneration: 1}`, 1, status.InProgressStatus},
		}
		for _, c := range cases {
			t.Run(kind+"/"+c.name, func(t *testing.T) {
				o := policyObject(c.generation, c.status)
				o["kind"] = kind
				res, err := ev.Evaluate(t.Context(), &unstructured.Unstructured{Object: o})
				if err != nil {
					t.Fatalf("evaluate: %v", err)
				}
				if res.Status != c.want {
					t.Errorf("status %s, want %s", res.Status, c.want)
				}
			})
		}
		// An object Plinth has not written status to yet: an error makes Flux wait (it retries
		// until the timeout), which is what a missing status should do; it must not be Current.
		res, err := ev.Evaluate(t.Context(), &unstructured.Unstructured{Object: policyObject(1, "")})
		if err == nil && res.Status == status.CurrentStatus {
			t.Errorf("%s without status: Current", kind)
		}
		t.Logf("%s without status: result %v, error %v", kind, res, err)
	}
	for _, k := range []string{"StoragePool", "Protocol", "Placement"} {
		if !kinds[k] {
			t.Errorf("no healthCheckExprs for %s", k)
		}
	}
}
