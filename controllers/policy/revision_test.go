package policy

import "testing"

func TestSourceOf(t *testing.T) {
	cases := []struct {
		name        string
		labels, ann map[string]string
		direct      string
		src         *syncSource
	}{
		{"none", nil, nil, "", nil},
		{"explicit", nil, map[string]string{AnnotationRevision: "main@sha1:abc"}, "main@sha1:abc", nil},
		{"flux", map[string]string{fluxNameLabel: "storage", fluxNamespaceLabel: "flux-system"}, nil, "",
			&syncSource{gvk: fluxKustomization, namespace: "flux-system", name: "storage"}},
		{"argo annotation", nil, map[string]string{argoTrackingAnnotation: "storage:policy.plinth.dev/Placement:/fast"}, "",
			&syncSource{gvk: argoApplication, namespace: "argocd", name: "storage"}},
		{"argo app in any namespace", nil, map[string]string{argoTrackingAnnotation: "team-a_storage:policy.plinth.dev/Placement:/fast"}, "",
			&syncSource{gvk: argoApplication, namespace: "team-a", name: "storage"}},
		{"argo label", map[string]string{argoInstanceLabel: "storage"}, nil, "",
			&syncSource{gvk: argoApplication, namespace: "argocd", name: "storage"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d, s := sourceOf(c.labels, c.ann, "argocd")
			if d != c.direct || (s == nil) != (c.src == nil) || s != nil && *s != *c.src {
				t.Fatalf("got %q %+v, want %q %+v", d, s, c.direct, c.src)
			}
		})
	}
}
