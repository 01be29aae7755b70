package policy_test

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/controllers/policy"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// TestApplyValidationStillRejectsUnknownFields: the controller's applies skip the API
// server's second, strict decode of the body (fieldValidation=Ignore); a field the schema does
// not declare must still fail the apply (the field manager's typed conversion refuses it), so
// a render that outgrew the installed CRD is reported, not silently pruned.
func TestApplyValidationStillRejectsUnknownFields(t *testing.T) {
	c := env(t)
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": storev1.GroupVersion.String(), "kind": "Store",
		"metadata": map[string]any{"name": "unknown-field.node-a"},
		"spec": map[string]any{"pool": "unknown-field", "nodeName": "node-a",
			"backend":        map[string]any{"file": map[string]any{"directory": "/var/lib/plinth/x"}},
			"notInTheSchema": "x"},
	}}
	//nolint:staticcheck // the apply the controller sends
	err := c.Patch(ctx, u, client.Apply, client.ForceOwnership, client.FieldOwner(policy.DefaultFieldManager), policy.ApplyValidation)
	if err == nil {
		_ = c.Delete(ctx, u)
		t.Fatal("apply with a field the schema does not declare succeeded; want it refused")
	}
	if !strings.Contains(err.Error(), "notInTheSchema") {
		t.Errorf("apply refused for another reason: %v", err)
	}
}
