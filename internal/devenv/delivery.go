package devenv

import (
	"context"
	"fmt"
	"os/exec"
	"sort"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// policySet is the policy repository's content: file name (pool.yaml, ...) → YAML.
type policySet map[string][]byte

func (p policySet) clone() policySet {
	out := policySet{}
	for k, v := range p {
		out[k] = append([]byte(nil), v...)
	}
	return out
}

func (p policySet) names() []string {
	var names []string
	for k := range p {
		names = append(names, k)
	}
	sort.Strings(names)
	return names
}

// edit replaces old by new in file f; it fails when old is not there.
func (p policySet) edit(f, old, new string) error {
	s := string(p[f])
	if !strings.Contains(s, old) {
		return fmt.Errorf("%s does not contain %q", f, old)
	}
	p[f] = []byte(strings.Replace(s, old, new, 1))
	return nil
}

// repoFiles lays the set out in the Git repository: every file under
// clusters/dev and a kustomization.yaml listing them (what Flux builds).
func (p policySet) repoFiles() map[string][]byte {
	files := map[string][]byte{}
	var res []string
	for _, f := range p.names() {
		files[fluxRepoPath+"/"+f] = p[f]
		res = append(res, "- "+f)
	}
	files[fluxRepoPath+"/kustomization.yaml"] = []byte("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n" + strings.Join(res, "\n") + "\n")
	return files
}

// deliver makes set the desired policy: with Flux it commits set to the Git
// repository, asks source-controller to fetch at once (as `flux reconcile
// source git` does) and waits for the Kustomization to be applied at the new
// head (wantReady: Ready=True; otherwise any verdict at the head). Without
// Flux it server-side applies every object and deletes the objects of files
// that left the set, as Flux's prune would. It returns what to show.
func (e *Env) deliver(ctx context.Context, msg string, set policySet, wantReady bool) (string, error) {
	defer func() { e.delivered = set.clone() }()
	if !e.Opts.Flux {
		for _, f := range set.names() {
			objs, err := decodeObjects(set[f])
			if err != nil {
				return "", fmt.Errorf("%s: %w", f, err)
			}
			for _, o := range objs {
				if err := e.apply(ctx, o); err != nil {
					return "", fmt.Errorf("%s: %w", f, err)
				}
			}
		}
		var gone []string
		for f, data := range e.delivered {
			if _, ok := set[f]; ok {
				continue
			}
			objs, err := decodeObjects(data)
			if err != nil {
				return "", err
			}
			for _, o := range objs {
				if err := e.Client.Delete(ctx, o); err != nil && !apierrors.IsNotFound(err) {
					return "", err
				}
				gone = append(gone, o.GetKind()+"/"+o.GetName())
			}
		}
		out := "applied " + strings.Join(set.names(), ", ") + " (kubectl apply --server-side)"
		if len(gone) > 0 {
			out += "; deleted " + strings.Join(gone, ", ")
		}
		return out, nil
	}
	if err := e.git.commit(msg, set.repoFiles()); err != nil {
		return "", err
	}
	if err := e.requestReconcile(ctx); err != nil && !apierrors.IsNotFound(err) {
		return "", err
	}
	rev, verdict, err := e.waitKustomization(ctx, 3*time.Minute, wantReady)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("git commit %q pushed to %s\nKustomization %s/%s at %s: %s", msg, e.git.url, FluxNamespace, fluxRepoName, rev, verdict), nil
}

// kustomization reads the policy repository's Kustomization.
func (e *Env) kustomization(ctx context.Context) (*unstructured.Unstructured, error) {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("kustomize.toolkit.fluxcd.io/v1")
	u.SetKind("Kustomization")
	err := e.Client.Get(ctx, client.ObjectKey{Namespace: FluxNamespace, Name: fluxRepoName}, u)
	return u, err
}

// waitKustomization waits until the Kustomization has acted on the
// repository's head: Ready=True at the head (wantReady), or, when not
// wantReady, a final Ready=False whose message names the head (kustomize-
// controller reports the revision it tried). It returns the revision and the
// Ready condition as "Ready=<status> <reason>: <message>".
func (e *Env) waitKustomization(ctx context.Context, timeout time.Duration, wantReady bool) (rev, verdict string, err error) {
	head, err := exec.Command("git", "-C", e.git.work, "rev-parse", "HEAD").Output()
	if err != nil {
		return "", "", err
	}
	sha := strings.TrimSpace(string(head))
	err = poll(ctx, timeout, func() error {
		u, err := e.kustomization(ctx)
		if err != nil {
			return err
		}
		s, r, m := conditionOf(u, "Ready")
		verdict = fmt.Sprintf("Ready=%s %s: %s", s, r, m)
		if wantReady {
			rev, _, _ = unstructured.NestedString(u.Object, "status", "lastAppliedRevision")
			if s != "True" || !strings.HasSuffix(rev, sha) {
				return fmt.Errorf("Kustomization %s (applied %q, head %s)", verdict, rev, sha)
			}
			return nil
		}
		rev, _, _ = unstructured.NestedString(u.Object, "status", "lastAttemptedRevision")
		if s != "False" || !strings.HasSuffix(rev, sha) || r == "Progressing" {
			return fmt.Errorf("Kustomization %s (attempted %q, head %s)", verdict, rev, sha)
		}
		return nil
	})
	return rev, verdict, err
}

// requestReconcile asks source-controller to fetch now, as `flux reconcile source git` does.
func (e *Env) requestReconcile(ctx context.Context) error {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("source.toolkit.fluxcd.io/v1")
	u.SetKind("GitRepository")
	u.SetNamespace(FluxNamespace)
	u.SetName(fluxRepoName)
	patch := []byte(fmt.Sprintf(`{"metadata":{"annotations":{"reconcile.fluxcd.io/requestedAt":%q}}}`, time.Now().Format(time.RFC3339Nano)))
	return e.Client.Patch(ctx, u, client.RawPatch("application/merge-patch+json", patch))
}

// startDelivery makes the policy repository and points Flux at it: the
// quickstart is committed first, then the GitRepository and Kustomization
// of kustomize/flux/policies.yaml are applied (what a production user does).
func (e *Env) startDelivery(ctx context.Context, set policySet) (string, error) {
	if !e.Opts.Flux {
		return e.deliver(ctx, "", set, true)
	}
	defer func() { e.delivered = set.clone() }()
	if err := e.git.commit("quickstart policy", set.repoFiles()); err != nil {
		return "", err
	}
	objs, err := e.fluxObjects()
	if err != nil {
		return "", err
	}
	var names []string
	for _, o := range objs {
		if err := e.apply(ctx, o); err != nil {
			return "", err
		}
		names = append(names, o.GetKind()+" "+o.GetNamespace()+"/"+o.GetName())
	}
	rev, verdict, err := e.waitKustomization(ctx, 3*time.Minute, true)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("git repository %s seeded from examples/quickstart (%s)\n%s applied from kustomize/flux/policies.yaml\nKustomization at %s: %s",
		e.git.url, strings.Join(set.names(), ", "), strings.Join(names, " + "), rev, verdict), nil
}
