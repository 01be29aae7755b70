package manifests

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

var rbacMarker = regexp.MustCompile(`^//\s*\+kubebuilder:rbac:(.*)$`)

// markerGrants returns the grants (group|resource|verb, namespace-scoped ones prefixed with
// "ns=<namespace>|") that the +kubebuilder:rbac markers of the non-test Go files in dirs (one
// folder, or several separated by commas) declare, as controller-gen's rbac generator reads them.
func markerGrants(t *testing.T, dirs string) map[string]bool {
	t.Helper()
	var files []string
	for _, dir := range strings.Split(dirs, ",") {
		fs, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, fs...)
	}
	out := map[string]bool{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			m := rbacMarker.FindStringSubmatch(strings.TrimSpace(line))
			if m == nil {
				continue
			}
			args := map[string][]string{}
			for _, kv := range strings.Split(m[1], ",") {
				k, v, _ := strings.Cut(kv, "=")
				args[k] = strings.Split(strings.Trim(v, `"`), ";")
			}
			prefix := ""
			if ns := args["namespace"]; len(ns) == 1 && ns[0] != "" {
				prefix = "ns=" + ns[0] + "|"
			}
			for _, g := range args["groups"] {
				for _, r := range args["resources"] {
					for _, v := range args["verbs"] {
						out[prefix+g+"|"+r+"|"+v] = true
					}
				}
			}
		}
	}
	return out
}

// roleGrants returns the grants of a ClusterRole (or of a Role, prefixed with its namespace).
func roleGrants(o *unstructured.Unstructured) map[string]bool {
	out := map[string]bool{}
	prefix := ""
	if o.GetKind() == "Role" {
		prefix = "ns=" + o.GetNamespace() + "|"
	}
	rules, _, _ := unstructured.NestedSlice(o.Object, "rules")
	for _, r := range rules {
		m := r.(map[string]any)
		for _, g := range stringsOf(m["apiGroups"]) {
			for _, res := range stringsOf(m["resources"]) {
				for _, v := range stringsOf(m["verbs"]) {
					out[prefix+g+"|"+res+"|"+v] = true
				}
			}
		}
	}
	return out
}

// boundRoles returns the roles ("ClusterRole//<name>", "Role/<namespace>/<name>") that the
// ClusterRoleBindings and RoleBindings among objs bind to a ServiceAccount named in sas.
func boundRoles(objs []*unstructured.Unstructured, sas []string) map[string]bool {
	out := map[string]bool{}
	for _, o := range objs {
		if o.GetKind() != "ClusterRoleBinding" && o.GetKind() != "RoleBinding" {
			continue
		}
		subjects, _, _ := unstructured.NestedSlice(o.Object, "subjects")
		matched := false
		for _, s := range subjects {
			m, _ := s.(map[string]any)
			if m["kind"] == "ServiceAccount" && slices.Contains(sas, fmt.Sprint(m["name"])) {
				matched = true
			}
		}
		if !matched {
			continue
		}
		kind, _, _ := unstructured.NestedString(o.Object, "roleRef", "kind")
		name, _, _ := unstructured.NestedString(o.Object, "roleRef", "name")
		ns := ""
		if kind == "Role" {
			ns = o.GetNamespace()
		}
		out[kind+"/"+ns+"/"+name] = true
	}
	return out
}

// Where a package declares its RBAC with kubebuilder markers, the hand-written role of its
// component grants exactly that (agent, controller), or at least that (the CSI roles, whose
// sidecars need more). Packages without markers are listed in the log.
func TestRBACMatchesMarkers(t *testing.T) {
	rbac := allBuilds(t)["rbac"]
	cases := []struct {
		dir, role string
		exact     bool
	}{
		{"../../agents/agent", "plinth-agent", true},
		{"../../controllers/policy", "plinth-controller", true},
		// one binary, two components: markers of the driver and both services against both roles
		{"../../csi,../../csi/controller,../../csi/node,../../controllers/moveexec", "plinth-csi-controller,plinth-csi-node", false},
	}
	for _, c := range cases {
		markers := markerGrants(t, c.dir)
		if len(markers) == 0 {
			t.Logf("%s has no +kubebuilder:rbac markers yet: %s is checked by TestAPIServer/RBAC only", c.dir, c.role)
			continue
		}
		// the grants of every role bound to the components' ServiceAccounts (a component's
		// ClusterRole and, for namespaced grants, its Roles)
		bound := boundRoles(rbac, strings.Split(c.role, ","))
		have := map[string]bool{}
		for _, o := range rbac {
			if bound[o.GetKind()+"/"+o.GetNamespace()+"/"+o.GetName()] {
				for g := range roleGrants(o) {
					have[g] = true
				}
			}
		}
		var missing, extra []string
		for g := range markers {
			if !have[g] {
				missing = append(missing, g)
			}
		}
		for g := range have {
			if !markers[g] {
				extra = append(extra, g)
			}
		}
		sort.Strings(missing)
		sort.Strings(extra)
		if len(missing) > 0 {
			t.Errorf("%s: the markers of %s grant %v, the role does not", c.role, c.dir, missing)
		}
		if c.exact && len(extra) > 0 {
			t.Errorf("%s grants %v, which no marker of %s declares", c.role, extra, c.dir)
		}
		if len(missing) == 0 && (!c.exact || len(extra) == 0) {
			t.Logf("%s matches the markers of %s (%d grants)", c.role, c.dir, len(markers))
		}
	}
}
