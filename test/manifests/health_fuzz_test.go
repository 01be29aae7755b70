package manifests

import (
	"encoding/json"
	"os"
	"strconv"
	"testing"
)

// kstatusHealth is the Argo CD health the kstatus conditions of a policy object should map to
// (the contract of kustomize/argocd/health/kstatus.lua): no status or conditions yet, or a
// generation not yet observed, is Progressing; Stalled=True is Degraded; otherwise the last
// Ready condition decides, Healthy when True. A message is the condition's message when it has
// one (even ""), else its reason, as Lua's `or` reads a missing field.
func kstatusHealth(generation int64, status map[string]any) (string, string) {
	conds, hasConds := status["conditions"].([]any)
	if status == nil || !hasConds {
		return "Progressing", "Waiting for Plinth to report status"
	}
	og, hasOG := status["observedGeneration"].(float64)
	if generation != 0 && (!hasOG || og < float64(generation)) {
		return "Progressing", "Waiting for Plinth to observe generation " + strconv.FormatInt(generation, 10)
	}
	text := func(c map[string]any, fallback string) string {
		for _, k := range []string{"message", "reason"} {
			if s, ok := c[k].(string); ok {
				return s
			}
		}
		return fallback
	}
	var ready map[string]any
	for _, ci := range conds {
		c := ci.(map[string]any)
		if c["type"] == "Stalled" && c["status"] == "True" {
			return "Degraded", text(c, "Stalled")
		}
		if c["type"] == "Ready" {
			ready = c
		}
	}
	if ready == nil {
		return "Progressing", "Waiting for the Ready condition"
	}
	if ready["status"] == "True" {
		return "Healthy", text(ready, "")
	}
	return "Progressing", text(ready, "")
}

// crdShaped reports whether status is one the policy CRDs admit: observedGeneration an integer,
// conditions a list of objects whose fields are strings (metav1.Condition).
func crdShaped(status map[string]any) bool {
	for k, v := range status {
		switch k {
		case "observedGeneration":
			f, ok := v.(float64)
			if !ok || f != float64(int64(f)) || f < 0 || f > 1<<53 {
				return false
			}
		case "conditions":
			l, ok := v.([]any)
			if !ok {
				return false
			}
			for _, ci := range l {
				c, ok := ci.(map[string]any)
				if !ok {
					return false
				}
				for _, f := range c {
					if _, ok := f.(string); !ok {
						return false
					}
				}
			}
		}
	}
	return true
}

// FuzzArgoCDHealth runs the Argo CD health check under gopher-lua (as TestArgoCDHealthLua) with
// arbitrary kstatus status blocks (what the API server admits for a policy object) and compares
// it with kstatusHealth. Properties: the script never fails, and its health and message are the
// contract's.
func FuzzArgoCDHealth(f *testing.F) {
	data, err := os.ReadFile(healthScript)
	if err != nil {
		f.Fatal(err)
	}
	script := string(data)
	f.Add(int64(2), []byte(`{"observedGeneration": 2, "conditions": [{"type": "Ready", "status": "True", "reason": "Succeeded", "message": "Applied 3 objects"}]}`))
	f.Add(int64(1), []byte(`{"observedGeneration": 1, "conditions": [{"type": "Ready", "status": "False", "reason": "Invalid"}, {"type": "Stalled", "status": "True", "reason": "Invalid"}]}`))
	f.Add(int64(3), []byte(`{"observedGeneration": 1, "conditions": []}`))
	f.Add(int64(0), []byte(`{}`))
	f.Add(int64(1), []byte(`{"observedGeneration": 1, "conditions": [{"type": "Ready", "status": "Unknown", "message": ""}, {"type": "Drifted", "status": "True"}]}`))
	f.Fuzz(func(t *testing.T, generation int64, statusJSON []byte) {
		if generation < 0 || generation > 1<<53 {
			return // the API server counts generations from 1; Lua numbers are float64
		}
		var status map[string]any
		if err := json.Unmarshal(statusJSON, &status); err != nil || !crdShaped(status) {
			return
		}
		meta := map[string]any{"name": "fast"}
		if generation != 0 {
			meta["generation"] = generation
		}
		obj := map[string]any{"apiVersion": "policy.plinth.dev/v1alpha1", "kind": "StoragePool", "metadata": meta}
		if status != nil {
			obj["status"] = status
		}
		gotH, gotM := runHealth(t, script, obj)
		wantH, wantM := kstatusHealth(generation, status)
		if gotH != wantH || gotM != wantM {
			t.Fatalf("generation %d, status %s: health %q %q, want %q %q", generation, statusJSON, gotH, gotM, wantH, wantM)
		}
	})
}
