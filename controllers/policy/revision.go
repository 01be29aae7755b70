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

// syncRevision is what a sync tool says about the revisions of the objects it applies.
type syncRevision struct {
	// tool names the sync tool object ("Flux Kustomization flux-system/storage"); empty when
	// the revision was stated directly or no sync tool object was found.
	tool string
	// applied is the revision whose objects are in the cluster: the last one the sync tool
	// applied in full (empty when none is known).
	applied string
	// refused is a newer revision the sync tool tried and did not apply (empty when none);
	// why is the sync tool's own message about it.
	refused, why string
}

// revisionReader reads revisions from sync tool objects, once per object per reconcile.
type revisionReader struct {
	reader client.Reader
	cache  map[syncSource]syncRevision
}

// revision returns the revision the sync tool last applied, never one it only attempted: a
// Flux Kustomization's status.lastAppliedRevision (kustomize-controller records no revision on
// the objects it applies, and its dry-run of the whole set runs before any object of a
// revision is applied, so the objects in the cluster are those of lastAppliedRevision), an
// Argo CD Application's newest status.history entry (a sync that succeeded). refused is set
// when the sync tool tried a newer revision and failed: a Kustomization whose
// lastAttemptedRevision differs from lastAppliedRevision while its Ready condition is False,
// an Application whose last operation failed on another revision. ok is false when the sync
// tool object could not be read for another reason than its absence (the caller keeps what it
// had).
func (r *revisionReader) revision(ctx context.Context, labels, annotations map[string]string, argoNamespace string) (rev syncRevision, ok bool, err error) {
	direct, src := sourceOf(labels, annotations, argoNamespace)
	if src == nil {
		return syncRevision{applied: direct}, true, nil
	}
	if v, hit := r.cache[*src]; hit {
		return v, true, nil
	}
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(src.gvk)
	if err := r.reader.Get(ctx, types.NamespacedName{Namespace: src.namespace, Name: src.name}, u); err != nil {
		if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
			r.cache[*src] = syncRevision{}
			return syncRevision{}, true, nil
		}
		return syncRevision{}, false, fmt.Errorf("read %s %s/%s: %w", src.gvk.Kind, src.namespace, src.name, err)
	}
	switch src.gvk {
	case fluxKustomization:
		rev = kustomizationRevision(u.Object)
		rev.tool = "Flux Kustomization " + src.namespace + "/" + src.name
	case argoApplication:
		rev = applicationRevision(u.Object)
		rev.tool = "Argo CD Application " + src.namespace + "/" + src.name
	}
	r.cache[*src] = rev
	return rev, true, nil
}

// kustomizationRevision reads a Flux Kustomization's status (kustomize.toolkit.fluxcd.io/v1):
// the applied revision, and the attempted one as refused while Ready is False.
func kustomizationRevision(obj map[string]any) syncRevision {
	applied, _, _ := unstructured.NestedString(obj, "status", "lastAppliedRevision")
	attempted, _, _ := unstructured.NestedString(obj, "status", "lastAttemptedRevision")
	rev := syncRevision{applied: applied}
	if attempted == "" || attempted == applied {
		return rev
	}
	if status, msg := readyOf(obj); status == "False" {
		rev.refused, rev.why = attempted, msg
	}
	return rev
}

// readyOf returns the status and message of the Ready condition in obj's status.conditions.
func readyOf(obj map[string]any) (status, message string) {
	conds, _, _ := unstructured.NestedSlice(obj, "status", "conditions")
	for _, c := range conds {
		m, ok := c.(map[string]any)
		if !ok || m["type"] != "Ready" {
			continue
		}
		status, _ = m["status"].(string)
		message, _ = m["message"].(string)
		return status, message
	}
	return "", ""
}

// applicationRevision reads an Argo CD Application's status (argoproj.io/v1alpha1): the
// revision of its newest history entry (history records successful syncs; status.sync.revision
// is only the revision compared against, applied or not), and the revision of a last operation
// that failed or errored as refused.
func applicationRevision(obj map[string]any) syncRevision {
	var rev syncRevision
	hist, _, _ := unstructured.NestedSlice(obj, "status", "history")
	if n := len(hist); n > 0 {
		if h, ok := hist[n-1].(map[string]any); ok {
			rev.applied, _ = h["revision"].(string)
		}
	}
	phase, _, _ := unstructured.NestedString(obj, "status", "operationState", "phase")
	if phase != "Failed" && phase != "Error" {
		return rev
	}
	tried, _, _ := unstructured.NestedString(obj, "status", "operationState", "syncResult", "revision")
	if tried == "" {
		tried, _, _ = unstructured.NestedString(obj, "status", "operationState", "operation", "sync", "revision")
	}
	if tried != "" && tried != rev.applied {
		rev.refused = tried
		rev.why, _, _ = unstructured.NestedString(obj, "status", "operationState", "message")
	}
	return rev
}
