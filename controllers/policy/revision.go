package policy

import (
	"context"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Labels and annotations the sync tools put on what they apply.
const (
	// Flux kustomize-controller labels every object it applies with its Kustomization.
	fluxNameLabel      = "kustomize.toolkit.fluxcd.io/name"
	fluxNamespaceLabel = "kustomize.toolkit.fluxcd.io/namespace"
	// Argo CD's annotation tracking: "<app>:<group>/<kind>:<namespace>/<name>", where <app>
	// is "<namespace>_<name>" for Applications outside Argo CD's namespace.
	argoTrackingAnnotation = "argocd.argoproj.io/tracking-id"
	// Argo CD's label tracking (the default before 2.x annotation tracking).
	argoInstanceLabel = "app.kubernetes.io/instance"
	// AnnotationRevision lets any other sync tool (or a kustomize commonAnnotations
	// generator) state the revision directly.
	AnnotationRevision = "plinth.dev/revision"
)

var (
	fluxKustomization = schema.GroupVersionKind{Group: "kustomize.toolkit.fluxcd.io", Version: "v1", Kind: "Kustomization"}
	argoApplication   = schema.GroupVersionKind{Group: "argoproj.io", Version: "v1alpha1", Kind: "Application"}
)

// syncSource is the sync tool object that applied a policy object.
type syncSource struct {
	gvk       schema.GroupVersionKind
	namespace string
	name      string
}

// sourceOf returns where a revision can be read for an object with these labels and
// annotations: an explicit revision (direct), or the Flux Kustomization or Argo CD
// Application that applied it. argoNamespace is where Argo CD keeps its Applications.
func sourceOf(labels, annotations map[string]string, argoNamespace string) (direct string, src *syncSource) {
	if r := annotations[AnnotationRevision]; r != "" {
		return r, nil
	}
	if n, ns := labels[fluxNameLabel], labels[fluxNamespaceLabel]; n != "" && ns != "" {
		return "", &syncSource{gvk: fluxKustomization, namespace: ns, name: n}
	}
	if id := annotations[argoTrackingAnnotation]; id != "" {
		app, _, _ := strings.Cut(id, ":")
		ns := argoNamespace
		if a, b, ok := strings.Cut(app, "_"); ok {
			ns, app = a, b
		}
		if app != "" {
			return "", &syncSource{gvk: argoApplication, namespace: ns, name: app}
		}
	}
	if app := labels[argoInstanceLabel]; app != "" && argoNamespace != "" {
		return "", &syncSource{gvk: argoApplication, namespace: argoNamespace, name: app}
	}
	return "", nil
}

// revisionReader reads revisions from sync tool objects, once per object per reconcile.
type revisionReader struct {
	reader client.Reader
	cache  map[syncSource]string
}

// revision returns the revision the sync tool is applying or applied: a Kustomization's
// status.lastAttemptedRevision (else lastAppliedRevision), an Application's
// status.sync.revision. ok is false when the sync tool object could not be read for another
// reason than its absence (the caller keeps the revision it had).
func (r *revisionReader) revision(ctx context.Context, labels, annotations map[string]string, argoNamespace string) (rev string, ok bool, err error) {
	direct, src := sourceOf(labels, annotations, argoNamespace)
	if src == nil {
		return direct, true, nil
	}
	if v, hit := r.cache[*src]; hit {
		return v, true, nil
	}
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(src.gvk)
	if err := r.reader.Get(ctx, types.NamespacedName{Namespace: src.namespace, Name: src.name}, u); err != nil {
		if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
			r.cache[*src] = ""
			return "", true, nil
		}
		return "", false, fmt.Errorf("read %s %s/%s: %w", src.gvk.Kind, src.namespace, src.name, err)
	}
	switch src.gvk {
	case fluxKustomization:
		rev, _, _ = unstructured.NestedString(u.Object, "status", "lastAttemptedRevision")
		if rev == "" {
			rev, _, _ = unstructured.NestedString(u.Object, "status", "lastAppliedRevision")
		}
	case argoApplication:
		rev, _, _ = unstructured.NestedString(u.Object, "status", "sync", "revision")
	}
	r.cache[*src] = rev
	return rev, true, nil
}
