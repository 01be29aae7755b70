package manifests

import (
	"os"
	"strings"
	"testing"

	lua "github.com/yuin/gopher-lua"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

const healthScript = "../../kustomize/argocd/health/kstatus.lua"

// toLua converts a JSON-like value to Lua as Argo CD hands objects to health scripts (tables
// keyed by field name, arrays 1-based, numbers as Lua numbers).
func toLua(L *lua.LState, v any) lua.LValue {
	switch x := v.(type) {
	case map[string]any:
		t := L.NewTable()
		for k, e := range x {
			t.RawSetString(k, toLua(L, e))
		}
		return t
	case []any:
		t := L.NewTable()
		for _, e := range x {
			t.Append(toLua(L, e))
		}
		return t
	case string:
		return lua.LString(x)
	case bool:
		return lua.LBool(x)
	case int64:
		return lua.LNumber(x)
	case float64:
		return lua.LNumber(x)
	case nil:
		return lua.LNil
	}
	return lua.LNil
}

// runHealth runs script with obj as Argo CD does (global obj, the chunk returns a table with
// status and message) and returns status and message.
func runHealth(t *testing.T, script string, obj map[string]any) (string, string) {
	t.Helper()
	L := lua.NewState()
	defer L.Close()
	L.SetGlobal("obj", toLua(L, obj))
	if err := L.DoString(script); err != nil {
		t.Fatalf("health script: %v", err)
	}
	ret, ok := L.Get(-1).(*lua.LTable)
	if !ok {
		t.Fatalf("health script returned %v, want a table", L.Get(-1))
	}
	return ret.RawGetString("status").String(), ret.RawGetString("message").String()
}

func policyObject(generation int64, status string) map[string]any {
	o := map[string]any{}
	doc := "apiVersion: policy.plinth.dev/v1alpha1\nkind: StoragePool\nmetadata: {name: fast}\n" + status
	if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
		panic(err)
	}
	_ = unstructured.SetNestedField(o, generation, "metadata", "generation")
	return o
}

// The Argo CD health check maps the kstatus conditions Plinth writes to Argo CD health. A fast
// unit test of the script under gopher-lua, the Lua interpreter Argo CD embeds; Argo CD's own
// application-controller runs the shipped argocd-cm in test/e2e (devenv.Walk.ArgoCD).
func TestArgoCDHealthLua(t *testing.T) {
	data, err := os.ReadFile(healthScript)
	if err != nil {
		t.Fatal(err)
	}
	script := string(data)
	cases := []struct {
		name, status, wantHealth, wantMessage string
		generation                            int64
	}{
		{"no status yet", "", "Progressing", "Waiting for Plinth to report status", 1},
		{"ready", `status: {observedGeneration: 2, conditions: [{type: Ready, status: "True", reason: Succeeded, message: "Applied 3 objects"}]}`, "Healthy", "Applied 3 objects", 2},
		{"stalled invalid policy", `status: {observedGeneration: 1, conditions: [{type: Ready, status: "False", reason: Invalid, message: "spec.reserve: invalid"}, {type: Stalled, status: "True", reason: Invalid, message: "spec.reserve: invalid"}]}`, "Degraded", "spec.reserve: invalid", 1},
		{"new generation not observed", `status: {observedGeneration: 1, conditions: [{type: Ready, status: "True", message: old}]}`, "Progressing", "Waiting for Plinth to observe generation 2", 2},
		{"reconciling", `status: {observedGeneration: 3, conditions: [{type: Ready, status: "Unknown", message: "Reconciliation in progress"}, {type: Reconciling, status: "True"}]}`, "Progressing", "Reconciliation in progress", 3},
		{"conditions without Ready", `status: {observedGeneration: 1, conditions: [{type: Drifted, status: "True"}]}`, "Progressing", "Waiting for the Ready condition", 1},
		{"drifted but ready", `status: {observedGeneration: 1, conditions: [{type: Drifted, status: "True"}, {type: Ready, status: "True", message: ok}]}`, "Healthy", "ok", 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h, m := runHealth(t, script, policyObject(c.generation, c.status))
			if h != c.wantHealth || m != c.wantMessage {
				t.Errorf("health %q message %q, want %q %q", h, m, c.wantHealth, c.wantMessage)
			}
		})
	}
	// argocd-cm carries the script, unchanged, for each policy kind (health/embed.sh writes it).
	cm := find(t, allBuilds(t)["argocd"], "ConfigMap", "argocd-cm")
	for _, kind := range []string{"StoragePool", "Protocol", "Placement"} {
		got, _, _ := unstructured.NestedString(cm.Object, "data", "resource.customizations.health.policy.plinth.dev_"+kind)
		if strings.TrimRight(got, "\n") != strings.TrimRight(script, "\n") {
			t.Errorf("argocd-cm health of %s differs from %s: run kustomize/argocd/health/embed.sh", kind, healthScript)
		}
	}
}
