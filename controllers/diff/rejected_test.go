package diff

import (
	"fmt"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// A dry-run refusal points at the policy field that renders the field the API server names.
func TestRejectedField(t *testing.T) {
	cases := []struct{ kind, owner, apiField, want string }{
		{"Store", "StoragePool", "spec.backend.lvm.volumeGroup", "spec.backend.lvm.volumeGroup"},
		{"Store", "StoragePool", "spec.backend.lvm.devices[1]", "spec.backend.lvm.devices"},
		{"Store", "StoragePool", "spec.reserve", "spec.reserve"},
		{"Store", "StoragePool", "spec.nodeName", ""},
		{"Store", "Placement", "spec.reserve", ""},
		{"Agent", "Protocol", "spec.nvmeof.port", "spec.nvmeofTcp.port"},
		{"Agent", "Protocol", "spec.nvmeof.bindCIDR", "spec.nvmeofTcp.bindCIDR"},
		{"Agent", "StoragePool", "spec.nvmeof.port", ""},
		{"StorageClass", "Placement", "parameters[csi.storage.k8s.io/fstype]", "spec.filesystem.fsType"},
		{"StorageClass", "Placement", "parameters[plinth.dev/spread-across]", "spec.spreadAcross"},
		{"StorageClass", "Placement", "mountOptions[0]", "spec.filesystem.mountOptions"},
		{"StorageClass", "Placement", "reclaimPolicy", "spec.storageClass.reclaimPolicy"},
		{"StorageClass", "Placement", "volumeBindingMode", "spec.storageClass.volumeBindingMode"},
		{"StorageClass", "Placement", "metadata.name", "spec.storageClass.name"},
		{"StorageClass", "Placement", "provisioner", ""},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%s %s %s", c.kind, c.owner, c.apiField), func(t *testing.T) {
			err := apierrors.NewInvalid(schema.GroupKind{Kind: c.kind}, "x",
				field.ErrorList{field.Invalid(field.NewPath("x"), "v", "refused")})
			err.ErrStatus.Details.Causes[0].Field = c.apiField
			fs := rejectedFields(fmt.Errorf("dry-run: %w", err))
			if len(fs) != 1 {
				t.Fatalf("fields %v", fs)
			}
			if got := renderedFrom(c.kind, c.owner, fs[0]); got != c.want {
				t.Errorf("%s of %s (%s) renders from %q, want %q", c.apiField, c.kind, fs[0], got, c.want)
			}
		})
	}
	if fs := rejectedFields(fmt.Errorf("connection refused")); fs != nil {
		t.Errorf("fields of a non-API error: %v", fs)
	}
}
