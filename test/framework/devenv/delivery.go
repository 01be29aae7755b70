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

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
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

// objectKey names a policy object of a set.
type objectKey struct{ kind, name string }

// keys returns the policy objects of files (none when files is empty).
func (p policySet) keys(files []string) ([]objectKey, error) {
	var out []objectKey
	for _, f := range files {
		objs, err := decodeObjects(p[f])
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		for _, o := range objs {
			out = append(out, objectKey{o.GetKind(), o.GetName()})
		}
	}
	return out, nil
}

// changedFiles lists the files of set that are new or differ from e.delivered.
func (e *Walk) changedFiles(set policySet) []string {
	var out []string
	for _, f := range set.names() {
		if old, ok := e.delivered[f]; !ok || string(old) != string(set[f]) {
			out = append(out, f)
		}
	}
	return out
}

// generations reads metadata.generation of keys (0 for an object that does not exist).
func (e *Walk) generations(ctx context.Context, keys []objectKey) (map[objectKey]int64, error) {
	out := map[objectKey]int64{}
	for _, k := range keys {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(policyv1.GroupVersion.WithKind(k.kind))
		if err := e.Client.Get(ctx, client.ObjectKey{Name: k.name}, u); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return nil, err
		}
		out[k] = u.GetGeneration()
	}
	return out, nil
}

// waitSetReady waits until every policy object of set is Ready=True for its
// generation and every object of a changed file has a generation above the
// one in before (the change reached the API server and Plinth acted on it).
func (e *Walk) waitSetReady(ctx context.Context, set policySet, changed []string, before map[objectKey]int64, timeout time.Duration) error {
	all, err := set.keys(set.names())
	if err != nil {
		return err
	}
	moved, err := set.keys(changed)
	if err != nil {
		return err
	}
	return poll(ctx, timeout, func() error {
		for _, k := range all {
			u := &unstructured.Unstructured{}
			u.SetGroupVersionKind(policyv1.GroupVersion.WithKind(k.kind))
			if err := e.Client.Get(ctx, client.ObjectKey{Name: k.name}, u); err != nil {
				return err
			}
			if s, r, m := conditionOf(u, "Ready"); s != "True" {
				return fmt.Errorf("%s/%s Ready=%q %s: %s", k.kind, k.name, s, r, m)
			}
		}
		for _, k := range moved {
			u := &unstructured.Unstructured{}
			u.SetGroupVersionKind(policyv1.GroupVersion.WithKind(k.kind))
			if err := e.Client.Get(ctx, client.ObjectKey{Name: k.name}, u); err != nil {
				return err
			}
			if g := u.GetGeneration(); g <= before[k] {
				return fmt.Errorf("%s/%s still at generation %d", k.kind, k.name, g)
			}
		}
		return nil
	})
}

// deliver makes set the desired policy: with Flux it commits set to the Git
// repository, asks source-controller to fetch at once (as `flux reconcile
// source git` does) and, when wantReady, waits until every policy object of
// the set is Ready with the change applied (e.policyReady: commit → that),
// then for the Kustomization to be Ready at the new head (without wantReady
// the caller waits for what it expects, then for the Kustomization's verdict). Without Flux it server-side applies every object and
// deletes the objects of files that left the set, as Flux's prune would.
// It returns what to show.
func (e *Walk) deliver(ctx context.Context, msg string, set policySet, wantReady bool) (string, error) {
	defer func() { e.delivered = set.clone() }()
	changed := e.changedFiles(set)
	moved, err := set.keys(changed)
	if err != nil {
		return "", err
	}
	before, err := e.generations(ctx, moved)
	if err != nil {
		return "", err
	}
	start := time.Now()
	e.policyReady = 0
	var lines []string
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
		l := "applied " + strings.Join(set.names(), ", ") + " (kubectl apply --server-side)"
		if len(gone) > 0 {
			l += "; deleted " + strings.Join(gone, ", ")
		}
		lines = append(lines, l)
	} else {
		if err := e.git.commit(msg, set.repoFiles()); err != nil {
			return "", err
		}
		if err := e.requestReconcile(ctx); err != nil && !apierrors.IsNotFound(err) {
			return "", err
		}
		lines = append(lines, fmt.Sprintf("git commit %q pushed to %s", msg, e.git.url))
	}
	if wantReady {
		if err := e.waitSetReady(ctx, set, changed, before, 3*time.Minute); err != nil {
			return "", err
		}
		e.policyReady = time.Since(start)
		lines = append(lines, fmt.Sprintf("every policy object Ready %.1fs after the %s", e.policyReady.Seconds(), e.verb()))
	}
	if e.Opts.Flux && wantReady {
		rev, verdict, err := e.waitKustomization(ctx, 3*time.Minute, true)
		if err != nil {
			return "", err
		}
		lines = append(lines, fmt.Sprintf("Kustomization %s/%s at %s after %.1fs: %s", FluxNamespace, fluxRepoName, rev, time.Since(start).Seconds(), verdict))
	}
	return strings.Join(lines, "\n"), nil
}

// kustomization reads the policy repository's Kustomization.
func (e *Walk) kustomization(ctx context.Context) (*unstructured.Unstructured, error) {
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
func (e *Walk) waitKustomization(ctx context.Context, timeout time.Duration, wantReady bool) (rev, verdict string, err error) {
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
func (e *Walk) requestReconcile(ctx context.Context) error {
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
// of kustomize/flux/policies.yaml are applied (what a production user does);
// e.policyReady is commit → every policy object Ready.
func (e *Walk) startDelivery(ctx context.Context, set policySet) (string, error) {
	if !e.Opts.Flux {
		return e.deliver(ctx, "", set, true)
	}
	defer func() { e.delivered = set.clone() }()
	start := time.Now()
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
	if err := e.waitSetReady(ctx, set, nil, nil, 3*time.Minute); err != nil {
		return "", err
	}
	e.policyReady = time.Since(start)
	rev, verdict, err := e.waitKustomization(ctx, 3*time.Minute, true)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("git repository %s seeded from examples/quickstart (%s)\n%s applied from kustomize/flux/policies.yaml\nevery policy object Ready %.1fs after the commit\nKustomization at %s after %.1fs: %s",
		e.git.url, strings.Join(set.names(), ", "), strings.Join(names, " + "), e.policyReady.Seconds(), rev, time.Since(start).Seconds(), verdict), nil
}
