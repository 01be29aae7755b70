package diff

import (
	"errors"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/plinth-storage/plinth/controllers/plan"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
)

// rejected records the API server's refusal of a rendered object's dry-run as a violation on
// the policy object that produced it, at the policy field that renders the field the API
// server names (its status causes); at the policy document's first line when it names none,
// or one that no policy field renders (the object's name, for instance).
func (b *builder) rejected(o *plan.Object) {
	msg := fmt.Sprintf("the API server rejects %s: %v", o.Key(), o.DryRunErr)
	for _, f := range rejectedFields(o.DryRunErr) {
		for _, owner := range b.sources[o.Key()] {
			kind, name, _ := strings.Cut(owner, "/")
			if pf := renderedFrom(o.Object.GetKind(), kind, f); pf != "" {
				b.violation(RuleDryRunRejected, kind, name, pf, msg)
				return
			}
		}
	}
	b.ownerViolation(o.Key(), RuleDryRunRejected, msg)
}

// rejectedFields returns the fields an API server error names in its status causes, as dotted
// paths: "spec.reserve", "parameters.csi.storage.k8s.io/fstype" (a map key in brackets becomes
// a path element), "mountOptions" (list indexes dropped). Nil when err is no API status or
// names no field.
func rejectedFields(err error) []string {
	var st apierrors.APIStatus
	if !errors.As(err, &st) || st.Status().Details == nil {
		return nil
	}
	var out []string
	for _, c := range st.Status().Details.Causes {
		if c.Field != "" {
			out = append(out, fieldPath(c.Field))
		}
	}
	return out
}

// fieldPath turns an API server field path ("spec.backend.lvm.devices[0]",
// "parameters[csi.storage.k8s.io/fstype]") into a dotted path without list indexes.
func fieldPath(f string) string {
	var b strings.Builder
	for f != "" {
		i := strings.IndexByte(f, '[')
		if i < 0 {
			b.WriteString(f)
			break
		}
		b.WriteString(f[:i])
		j := strings.IndexByte(f[i:], ']')
		if j < 0 {
			break
		}
		key := strings.Trim(f[i+1:i+j], `"`)
		if key != "" && strings.Trim(key, "0123456789") != "" {
			b.WriteString("." + key)
		}
		f = f[i+j+1:]
	}
	return strings.TrimPrefix(b.String(), ".")
}

// renderedFrom is the field of a policy object of ownerKind that controllers/render copies or
// turns into field of a rendered object of kind, or "" when none does.
func renderedFrom(kind, ownerKind, field string) string {
	under := func(prefix string) bool { return field == prefix || strings.HasPrefix(field, prefix+".") }
	switch {
	case kind == "Store" && ownerKind == "StoragePool":
		// The Store carries the pool's backend, reserve, overcommit and drift policy as declared.
		for _, f := range []string{"spec.backend", "spec.reserve", "spec.overcommitPercent", "spec.driftPolicy"} {
			if under(f) {
				return field
			}
		}
	case kind == "Agent" && ownerKind == "Protocol":
		switch {
		case under("spec.nvmeof.port"):
			return "spec.nvmeofTcp.port"
		case under("spec.nvmeof.bindCIDR"):
			return "spec.nvmeofTcp.bindCIDR"
		}
	case kind == "StorageClass" && ownerKind == "Placement":
		switch {
		case field == "parameters."+policyv1.ParamFSType:
			return "spec.filesystem.fsType"
		case under("parameters." + policyv1.ParamPool):
			return "spec.poolRef.name"
		case under("parameters." + policyv1.ParamProtocol):
			return "spec.protocolRef.name"
		case under("parameters." + policyv1.ParamSpreadAcross):
			return "spec.spreadAcross"
		case under("mountOptions"):
			return "spec.filesystem.mountOptions"
		case under("metadata.name"):
			return "spec.storageClass.name"
		case under("reclaimPolicy"), under("volumeBindingMode"), under("allowVolumeExpansion"):
			return "spec.storageClass." + field
		}
	}
	return ""
}
