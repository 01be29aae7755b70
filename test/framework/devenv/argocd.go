package devenv

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/controllers/diff"
	"github.com/plinth-storage/plinth/test/framework/controlplane"
)

// Argo CD peers: its multi-call binary (test/tools/build.sh build_argocd; ARGOCD_VERSION in
// test/tools/versions.env) run as application-controller and repo-server (ARGOCD_BINARY_NAME),
// with Debian's redis-server as their cache.
const (
	// BinArgoCD is Argo CD's multi-call binary in the test bin folder.
	BinArgoCD = "argocd"
	// BinKustomize is the kustomize CLI in the test bin folder (KUSTOMIZE_VERSION), which
	// repo-server runs to render a kustomization.
	BinKustomize = "kustomize"
	// BinRedisServer is Debian's redis-server (hack/install-deps.sh).
	BinRedisServer = "/usr/bin/redis-server"
	// ArgoCDNamespace is the namespace kustomize/argocd puts its Applications and argocd-cm in.
	ArgoCDNamespace = "argocd"
	// ArgoCDPolicyApp is the policy repository's Application in kustomize/argocd/applications.yaml.
	ArgoCDPolicyApp = "storage-policies"
	// ArgoCDPlinthApp is Plinth's own Application (sync wave 0) in kustomize/argocd/applications.yaml.
	ArgoCDPlinthApp = "plinth"
)

// ArgoCDSummary is what the Argo CD phase measured (commit → state seen by Argo CD).
type ArgoCDSummary struct {
	// Synced is the first commit → Application Synced and Healthy.
	Synced time.Duration
	// Degraded is the stalling placement's commit → Application Degraded.
	Degraded time.Duration
	// Pruned is the commit removing a placement → Placement deleted by Argo CD.
	Pruned time.Duration
	// Resources is the number of resources the Application tracks after the first sync;
	// PolicyObjects the number of policy objects in the repository then.
	Resources, PolicyObjects int
	// PlinthSynced is the controllers' start → the plinth Application (wave 0) Synced and
	// Healthy; PlinthResources the objects it tracks (those of the dev overlay).
	PlinthSynced    time.Duration
	PlinthResources int
	// PlinthSpecChanges counts the workloads whose spec Argo CD's first sync changed without
	// changing the pod template (reported in the step's lines; a changed template fails it).
	PlinthSpecChanges int
	// SelfHealed is a Plinth object deleted by hand → created again by Argo CD.
	SelfHealed time.Duration
}

// argoApplication reads an Application of ArgoCDNamespace.
func (e *Walk) argoApplication(ctx context.Context, name string) (*unstructured.Unstructured, error) {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("argoproj.io/v1alpha1")
	u.SetKind("Application")
	err := e.Client.Get(ctx, client.ObjectKey{Namespace: ArgoCDNamespace, Name: name}, u)
	return u, err
}

// argoResource is one entry of an Application's status.resources.
type argoResource struct {
	Kind, Name, Status, Health, Message string
}

func argoResources(app *unstructured.Unstructured) []argoResource {
	list, _, _ := unstructured.NestedSlice(app.Object, "status", "resources")
	var out []argoResource
	for _, r := range list {
		m, _ := r.(map[string]any)
		var ar argoResource
		ar.Kind, _, _ = unstructured.NestedString(m, "kind")
		ar.Name, _, _ = unstructured.NestedString(m, "name")
		ar.Status, _, _ = unstructured.NestedString(m, "status")
		ar.Health, _, _ = unstructured.NestedString(m, "health", "status")
		ar.Message, _, _ = unstructured.NestedString(m, "health", "message")
		out = append(out, ar)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Kind+"/"+out[i].Name < out[j].Kind+"/"+out[j].Name })
	return out
}

// argoState is the Application's sync status, synced revision, health and last operation phase.
func argoState(app *unstructured.Unstructured) (sync, rev, health, phase string) {
	sync, _, _ = unstructured.NestedString(app.Object, "status", "sync", "status")
	rev, _, _ = unstructured.NestedString(app.Object, "status", "sync", "revision")
	health, _, _ = unstructured.NestedString(app.Object, "status", "health", "status")
	phase, _, _ = unstructured.NestedString(app.Object, "status", "operationState", "phase")
	return
}

// argoHead is the policy repository's head commit.
func (e *Walk) argoHead() (string, error) {
	out, err := exec.Command("git", "-C", e.argoGit.work, "rev-parse", "HEAD").Output()
	return strings.TrimSpace(string(out)), err
}

// argoFiles lays the set out as a plain directory (no kustomization.yaml: Argo CD reads the YAML
// files of a directory Application itself, while a kustomization would need the kustomize CLI in
// repo-server's PATH).
func argoFiles(set policySet) map[string][]byte {
	files := map[string][]byte{}
	for _, f := range set.names() {
		files[fluxRepoPath+"/"+f] = set[f]
	}
	return files
}

// waitArgoApp waits until the policy Application has compared the repository's head and is sync
// (Synced or OutOfSync) with health, and returns its resources.
func (e *Walk) waitArgoApp(ctx context.Context, timeout time.Duration, wantSync, wantHealth string) ([]argoResource, error) {
	return e.waitArgoAppNamed(ctx, ArgoCDPolicyApp, timeout, wantSync, wantHealth)
}

// waitArgoAppNamed is waitArgoApp for the Application name of ArgoCDNamespace.
func (e *Walk) waitArgoAppNamed(ctx context.Context, name string, timeout time.Duration, wantSync, wantHealth string) ([]argoResource, error) {
	head, err := e.argoHead()
	if err != nil {
		return nil, err
	}
	var res []argoResource
	err = poll(ctx, timeout, func() error {
		app, err := e.argoApplication(ctx, name)
		if err != nil {
			return err
		}
		s, rev, h, ph := argoState(app)
		res = argoResources(app)
		if rev != head || s != wantSync || h != wantHealth {
			return fmt.Errorf("Application %s: sync %q at %q (head %s), health %q, operation %q, resources %v", name, s, rev, head, h, ph, res)
		}
		return nil
	})
	return res, err
}

// ArgoCD is the Argo CD phase, run after Scenario and the Flux cases on the same cluster: Flux's
// Kustomization is suspended, Argo CD's CRDs (Application, AppProject, from its module source) are
// applied, redis-server, repo-server and application-controller start as host processes against
// the API server, kustomize/argocd is applied as a user does (the policy Application pointed at a
// second Git repository on loopback holding the delivered policy), and Argo CD takes the policy
// over: Synced and Healthy by argocd-cm's health checks (every policy resource Healthy); a
// stalling placement committed → the Application Degraded with the schema's message, reverted →
// pruned and Healthy; a placement removed from Git while a PVC uses its class → pruned by Argo CD,
// kept by Plinth's finalizer and reported in use, gone with the PVC.
//
// Plinth's own Application (sync wave 0) points at a copy of kustomize/ in the same repository,
// path kustomize/overlays/dev (the overlay test/framework/deploy applied here; users point it at
// kustomize/default or their overlay); repo-server renders it with the kustomize CLI of testbin.
// Argo CD takes the running Plinth over without a rollout (every workload's generation and pod
// kept), reports it Healthy by its own health of Deployments and DaemonSets, and restores a
// Plinth object deleted by hand (self-heal).
func (e *Walk) ArgoCD(ctx context.Context) (*ArgoCDSummary, error) {
	sum := &ArgoCDSummary{}
	if e.delivered == nil {
		return sum, fmt.Errorf("Argo CD phase: no delivered policy (run Scenario first)")
	}
	if err := e.step("Argo CD: Flux suspended; CRDs, redis-server, repo-server and application-controller; kustomize/argocd applied", []string{"argocd-application-controller", "argocd-repo-server"}, func() (string, error) {
		return e.startArgoCD(ctx, sum)
	}); err != nil {
		return sum, e.fail(err)
	}
	if err := e.step("Argo CD: a Plinth object deleted by hand → restored by self-heal", []string{"argocd-application-controller"}, func() (string, error) {
		return e.argoSelfHeal(ctx, sum)
	}); err != nil {
		return sum, e.fail(err)
	}
	if err := e.step("Argo CD: stalling placement committed → Application Degraded with the schema's message; reverted → pruned, Healthy", []string{"argocd-application-controller", "controller"}, func() (string, error) {
		return e.argoStall(ctx, sum)
	}); err != nil {
		return sum, e.fail(err)
	}
	if err := e.step("Argo CD: placement removed from Git while in use → pruned by Argo CD, kept by Plinth; PVC deleted → gone", []string{"argocd-application-controller", "controller"}, func() (string, error) {
		return e.argoPruneInUse(ctx, sum)
	}); err != nil {
		return sum, e.fail(err)
	}
	return sum, nil
}

func (e *Walk) startArgoCD(ctx context.Context, sum *ArgoCDSummary) (string, error) {
	var lines []string
	if e.Opts.Flux {
		// Flux keeps its inventory of the policy: suspended, it neither re-applies nor prunes.
		k, err := e.kustomization(ctx)
		if err != nil {
			return "", err
		}
		if err := e.Client.Patch(ctx, k, client.RawPatch("application/merge-patch+json", []byte(`{"spec":{"suspend":true}}`))); err != nil {
			return "", fmt.Errorf("suspend Kustomization %s/%s: %w", FluxNamespace, fluxRepoName, err)
		}
		lines = append(lines, fmt.Sprintf("Kustomization %s/%s suspended", FluxNamespace, fluxRepoName))
	}
	bin, err := e.installArgoCD(ctx)
	if err != nil {
		return "", err
	}
	if err := e.commitArgoRepo(); err != nil {
		return "", err
	}
	line, err := e.applyArgoKustomize(ctx)
	if err != nil {
		return "", err
	}
	lines = append(lines, line)
	before, err := e.plinthWorkloads(ctx)
	if err != nil {
		return "", err
	}
	start := time.Now()
	procs, err := e.startArgoProcesses(ctx, bin)
	if err != nil {
		return "", err
	}
	lines = append(lines, procs)
	res, err := e.waitArgoApp(ctx, 3*time.Minute, "Synced", "Healthy")
	if err != nil {
		return "", err
	}
	sum.Synced = time.Since(start)
	keys, err := e.delivered.keys(e.delivered.names())
	if err != nil {
		return "", err
	}
	sum.Resources, sum.PolicyObjects = len(res), len(keys)
	if len(res) != len(keys) {
		return "", fmt.Errorf("Application %s tracks %d resources %v, the policy has %d objects %v", ArgoCDPolicyApp, len(res), res, len(keys), keys)
	}
	for _, r := range res {
		// Healthy only through argocd-cm's scripts: they read Plinth's Ready condition.
		if r.Status != "Synced" || r.Health != "Healthy" {
			return "", fmt.Errorf("Application %s resource %s/%s: %s, health %s: %s", ArgoCDPolicyApp, r.Kind, r.Name, r.Status, r.Health, r.Message)
		}
		lines = append(lines, fmt.Sprintf("  %s/%s Synced, Healthy: %s", r.Kind, r.Name, r.Message))
	}
	lines = append(lines, fmt.Sprintf("Application %s Synced and Healthy %.1fs after the controllers started (%d resources)", ArgoCDPolicyApp, sum.Synced.Seconds(), len(res)))
	plinth, err := e.argoPlinthSynced(ctx, before, sum, start)
	if err != nil {
		return "", err
	}
	lines = append(lines, plinth)
	return strings.Join(lines, "\n"), nil
}

// installArgoCD makes what Argo CD's install manifests and API server provide and its two
// controllers read: the Application and AppProject CRDs (from testbin), the namespace,
// argocd-secret and the default AppProject. It returns the testbin folder and replaces
// e.Client with one whose REST mapper knows the new kinds.
func (e *Walk) installArgoCD(ctx context.Context) (string, error) {
	bin := e.Opts.BinDir
	if bin == "" {
		var err error
		if bin, err = controlplane.TestBinDir(); err != nil {
			return "", err
		}
	}
	crds := []string{filepath.Join(bin, "crds", "argocd", "application-crd.yaml"), filepath.Join(bin, "crds", "argocd", "appproject-crd.yaml")}
	for _, f := range crds {
		if _, err := os.Stat(f); err != nil {
			return "", fmt.Errorf("Argo CD CRDs: %w (run `make testbin`)", err)
		}
	}
	if _, err := e.applyCRDFiles(ctx, crds); err != nil {
		return "", err
	}
	if err := e.ensureNamespace(ctx, ArgoCDNamespace); err != nil {
		return "", err
	}
	// The API server's discovery can lag the CRDs' Established condition, and the client's
	// REST mapper caches what it found: a new client, once both kinds are listable.
	if err := poll(ctx, time.Minute, func() error {
		c, err := client.New(e.CP.Admin.Config, client.Options{Scheme: Scheme()})
		if err != nil {
			return err
		}
		for _, kind := range []string{"ApplicationList", "AppProjectList"} {
			l := &unstructured.UnstructuredList{}
			l.SetAPIVersion("argoproj.io/v1alpha1")
			l.SetKind(kind)
			if err := c.List(ctx, l, client.InNamespace(ArgoCDNamespace)); err != nil {
				return err
			}
		}
		e.Client = c
		return nil
	}); err != nil {
		return "", fmt.Errorf("Argo CD kinds not served: %w", err)
	}
	// argocd-secret (settings) and the default AppProject.
	partOf := map[string]string{"app.kubernetes.io/part-of": "argocd"}
	// server.secretkey: argocd-server generates it at its first start; the application-controller
	// refuses every cluster (InvalidSpecError "server.secretkey is missing") without it.
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return "", err
	}
	if err := e.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "argocd-secret", Namespace: ArgoCDNamespace, Labels: partOf},
		Data: map[string][]byte{"server.secretkey": []byte(base64.StdEncoding.EncodeToString(key))}}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", err
	}
	proj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
		"metadata": map[string]any{"name": "default", "namespace": ArgoCDNamespace},
		"spec": map[string]any{
			"sourceRepos":              []any{"*"},
			"destinations":             []any{map[string]any{"server": "*", "namespace": "*"}},
			"clusterResourceWhitelist": []any{map[string]any{"group": "*", "kind": "*"}},
		},
	}}
	if err := e.apply(ctx, proj); err != nil {
		return "", fmt.Errorf("AppProject default: %w", err)
	}
	return bin, nil
}

// commitArgoRepo commits, on a second Git repository, what Argo CD syncs: the policy Flux
// delivered last and Plinth's kustomize tree.
func (e *Walk) commitArgoRepo() error {
	var err error
	if e.argoGit, err = newGitRepo(filepath.Join(e.Dir, "argocd")); err != nil {
		return err
	}
	files := argoFiles(e.delivered)
	plinthFiles, err := argoPlinthFiles(e.Root)
	if err != nil {
		return err
	}
	for p, data := range plinthFiles {
		files[p] = data
	}
	if err := e.argoGit.commit("Plinth's kustomize tree and the policy, for Argo CD", files); err != nil {
		return err
	}
	return nil
}

// applyArgoKustomize applies kustomize/argocd as a user does, with the repository URL and
// revisions set, checks that exactly the shipped objects were applied and that argocd-cm
// holds the shipped health checks key for key, and returns a line saying so.
func (e *Walk) applyArgoKustomize(ctx context.Context) (string, error) {
	// kustomize/argocd as a user applies it, with the repository URL and revision set.
	out, err := exec.CommandContext(ctx, e.Kubectl, "kustomize", filepath.Join(e.Root, "kustomize", "argocd")).Output()
	if err != nil {
		return "", fmt.Errorf("kubectl kustomize kustomize/argocd: %w", err)
	}
	objs, err := decodeObjects(out)
	if err != nil {
		return "", err
	}
	var applied []string
	for _, o := range objs {
		if o.GetKind() == "Application" {
			switch o.GetName() {
			case ArgoCDPlinthApp:
				// Plinth's own kustomize tree in the same repository; the overlay this
				// cluster runs, so Argo CD takes the running Plinth over.
				_ = unstructured.SetNestedField(o.Object, e.argoGit.url, "spec", "source", "repoURL")
				_ = unstructured.SetNestedField(o.Object, "main", "spec", "source", "targetRevision")
				_ = unstructured.SetNestedField(o.Object, argoPlinthRoot+"/"+DevOverlay, "spec", "source", "path")
			case ArgoCDPolicyApp:
				_ = unstructured.SetNestedField(o.Object, e.argoGit.url, "spec", "source", "repoURL")
				_ = unstructured.SetNestedField(o.Object, "main", "spec", "source", "targetRevision")
				_ = unstructured.SetNestedField(o.Object, fluxRepoPath, "spec", "source", "path")
			default:
				return "", fmt.Errorf("kustomize/argocd: unexpected Application %s", o.GetName())
			}
		}
		if err := e.apply(ctx, o); err != nil {
			return "", fmt.Errorf("%s %s: %w", o.GetKind(), o.GetName(), err)
		}
		applied = append(applied, o.GetKind()+"/"+o.GetName())
	}
	sort.Strings(applied)
	if want := []string{"Application/" + ArgoCDPlinthApp, "Application/" + ArgoCDPolicyApp, "ConfigMap/argocd-cm", "Role/plinth-controller-read-applications", "RoleBinding/plinth-controller-read-applications"}; strings.Join(applied, " ") != strings.Join(want, " ") {
		return "", fmt.Errorf("kustomize/argocd applied %v, want %v", applied, want)
	}
	// argocd-cm's health checks are the shipped file's, key for key.
	shipped, err := readObjects(filepath.Join(e.Root, "kustomize", "argocd", "argocd-cm.yaml"))
	if err != nil {
		return "", err
	}
	var cm corev1.ConfigMap
	if err := e.Client.Get(ctx, client.ObjectKey{Namespace: ArgoCDNamespace, Name: "argocd-cm"}, &cm); err != nil {
		return "", err
	}
	want, _, _ := unstructured.NestedStringMap(shipped[0].Object, "data")
	healthKeys := 0
	for k, v := range want {
		if cm.Data[k] != v {
			return "", fmt.Errorf("argocd-cm %s differs from kustomize/argocd/argocd-cm.yaml", k)
		}
		if strings.HasPrefix(k, "resource.customizations.health.") {
			healthKeys++
		}
	}
	if healthKeys != 3 || len(cm.Data) != len(want) {
		return "", fmt.Errorf("argocd-cm: %d health keys, %d keys live, %d shipped; want 3 health keys, live = shipped", healthKeys, len(cm.Data), len(want))
	}
	return fmt.Sprintf("applied kustomize/argocd: %s (Application %s → %s, path %s; Application %s, path %s/%s); argocd-cm = the shipped file (%d health checks)",
		strings.Join(applied, ", "), ArgoCDPolicyApp, e.argoGit.url, fluxRepoPath, ArgoCDPlinthApp, argoPlinthRoot, DevOverlay, healthKeys), nil
}

// startArgoProcesses starts redis-server on loopback, repo-server and application-controller.
// repo-server runs the kustomize CLI of bin (BinKustomize) for the plinth Application.
func (e *Walk) startArgoProcesses(ctx context.Context, bin string) (string, error) {
	if _, err := os.Stat(filepath.Join(bin, BinKustomize)); err != nil {
		return "", fmt.Errorf("the kustomize CLI repo-server runs: %w (run `make testbin`)", err)
	}
	var ports [5]int
	var err error
	for i := range ports {
		if ports[i], err = controlplane.FreePort(); err != nil {
			return "", err
		}
	}
	dir := filepath.Join(e.Dir, "argocd")
	tmp := filepath.Join(dir, "tmp")
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return "", err
	}
	redisAddr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	redis, err := e.startHost(ctx, controlplane.ProcessSpec{
		Name: "redis-server", Binary: BinRedisServer,
		Args: []string{"--bind", "127.0.0.1", "--port", fmt.Sprint(ports[0]), "--save", "", "--appendonly", "no", "--dir", dir, "--daemonize", "no"},
		Ready: func(ctx context.Context) error {
			c, err := (&net.Dialer{}).DialContext(ctx, "tcp", redisAddr)
			if err != nil {
				return err
			}
			return c.Close()
		},
	})
	if err != nil {
		return "", err
	}
	// Argo CD's environment: no GnuPG (not used by the repository), temp files under the env dir.
	env := []string{"TMPDIR=" + tmp, "ARGOCD_GPG_ENABLED=false", "HOME=" + dir}
	repo, err := e.startHost(ctx, controlplane.ProcessSpec{
		Name: "argocd-repo-server", Binary: BinArgoCD,
		Args: []string{"--address", "127.0.0.1", "--port", fmt.Sprint(ports[1]), "--disable-tls",
			"--metrics-address", "127.0.0.1", "--metrics-port", fmt.Sprint(ports[2]), "--redis", redisAddr,
			// A commit is seen at the next resync, not up to 3 minutes later (the default).
			"--revision-cache-expiration", "1s", "--loglevel", "info"},
		// kustomize from testbin first in PATH: repo-server runs `kustomize build`.
		Env:   append([]string{"ARGOCD_BINARY_NAME=argocd-repo-server", "PATH=" + bin + string(os.PathListSeparator) + os.Getenv("PATH")}, env...),
		Ready: controlplane.HTTPReady(fmt.Sprintf("http://127.0.0.1:%d/healthz?full=true", ports[2]), nil),
	})
	if err != nil {
		return "", err
	}
	ctrl, err := e.startHost(ctx, controlplane.ProcessSpec{
		Name: "argocd-application-controller", Binary: BinArgoCD,
		Args: []string{"--kubeconfig", e.Kubeconfig, "--namespace", ArgoCDNamespace,
			"--repo-server", fmt.Sprintf("127.0.0.1:%d", ports[1]), "--repo-server-plaintext", "--redis", redisAddr,
			"--metrics-port", fmt.Sprint(ports[3]),
			// Git is polled every 5 s instead of 120-180 s (a webhook's role in production).
			"--app-resync", "5", "--app-resync-jitter", "0", "--loglevel", "info",
			// Each resource's health (and its message) in the Application's status.resources, as
			// in Argo CD 2.x; 3.x keeps it in redis for its API server by default
			// (argocd-cmd-params-cm controller.resource.health.persist).
			"--persist-resource-health"},
		// ARGOCD_FAKE_IN_CLUSTER: Argo CD's switch for running outside a pod (its own local
		// development uses it): the in-cluster destination https://kubernetes.default.svc is
		// reached through KUBECONFIG instead of the service account's token.
		Env:   append([]string{"ARGOCD_BINARY_NAME=argocd-application-controller", "ARGOCD_FAKE_IN_CLUSTER=true", "KUBECONFIG=" + e.Kubeconfig}, env...),
		Ready: controlplane.HTTPReady(fmt.Sprintf("http://127.0.0.1:%d/healthz", ports[3]), nil),
	})
	if err != nil {
		return "", err
	}
	v := controlplane.PinnedVersions()["ARGOCD_VERSION"]
	return fmt.Sprintf("redis-server %s pid %d; Argo CD %s repo-server pid %d, application-controller pid %d", redisAddr, redis.PID(), v, repo.PID(), ctrl.PID()), nil
}

// argoCommit commits files to the policy repository and asks Argo CD to compare the Application
// with Git now, as Argo CD's Git webhook does (annotation argocd.argoproj.io/refresh: normal).
// Without it a commit was not compared within 3 minutes in this scenario: after the first sync
// the controller logged no refresh at all, --app-resync 5 notwithstanding (cause not found).
func (e *Walk) argoCommit(ctx context.Context, msg string, files map[string][]byte) error {
	if err := e.argoGit.commit(msg, files); err != nil {
		return err
	}
	app := &unstructured.Unstructured{}
	app.SetAPIVersion("argoproj.io/v1alpha1")
	app.SetKind("Application")
	app.SetNamespace(ArgoCDNamespace)
	app.SetName(ArgoCDPolicyApp)
	return e.Client.Patch(ctx, app, client.RawPatch("application/merge-patch+json", []byte(`{"metadata":{"annotations":{"argocd.argoproj.io/refresh":"normal"}}}`)))
}

// argoStall commits an invalid placement (the API server accepts its name, Plinth's schema does
// not): Plinth marks it Stalled and argocd-cm's health check turns the Application Degraded with
// Plinth's message. The revert prunes it and the Application is Healthy again.
func (e *Walk) argoStall(ctx context.Context, sum *ArgoCDSummary) (string, error) {
	bad := e.delivered.clone()
	bad["placement-invalid.yaml"] = []byte(invalidPlacementYAML)
	// Reviewed first: plinth diff on the pull request stops at the schema error, with its place.
	rep, text, err := e.argoDiff(ctx, argoFiles(bad))
	if err != nil {
		return "", err
	}
	if rep.ExitCode() != diff.ExitErrors || len(rep.Problems) != 1 || !strings.Contains(rep.Problems[0].String(), "placement-invalid.yaml:") || !strings.Contains(rep.Problems[0].String(), "DNS-1123") {
		return "", fmt.Errorf("plinth diff on the pull request adding placement %s: exit %d, problems %v, want exit %d and one DNS-1123 problem in placement-invalid.yaml:\n%s",
			InvalidPlacement, rep.ExitCode(), rep.Problems, diff.ExitErrors, text)
	}
	reviewed := fmt.Sprintf("plinth diff (live) on the pull request: exit %d, %s", rep.ExitCode(), rep.Problems[0])
	start := time.Now()
	if err := e.argoCommit(ctx, "placement dev.xfs (invalid name)", argoFiles(bad)); err != nil {
		return "", err
	}
	res, err := e.waitArgoApp(ctx, 3*time.Minute, "Synced", "Degraded")
	if err != nil {
		return "", err
	}
	sum.Degraded = time.Since(start)
	var degraded []argoResource
	for _, r := range res {
		if r.Health == "Degraded" {
			degraded = append(degraded, r)
		}
	}
	if len(degraded) != 1 || degraded[0].Kind != "Placement" || degraded[0].Name != InvalidPlacement || !strings.Contains(degraded[0].Message, "DNS-1123") {
		return "", fmt.Errorf("Degraded resources %v, want only Placement %s with the schema's DNS-1123 message", degraded, InvalidPlacement)
	}
	u, err := e.placement(ctx, InvalidPlacement)
	if err != nil {
		return "", err
	}
	if s, _, m := conditionOf(u, "Stalled"); s != "True" || m != degraded[0].Message {
		return "", fmt.Errorf("Placement %s Stalled=%q %q; Argo CD shows %q", InvalidPlacement, s, m, degraded[0].Message)
	}
	shown := fmt.Sprintf("%s\nmerged anyway: Application %s Degraded %.1fs after the commit; Placement %s: %s", reviewed, ArgoCDPolicyApp, sum.Degraded.Seconds(), InvalidPlacement, degraded[0].Message)
	if err := e.argoCommit(ctx, "revert: remove placement dev.xfs", argoFiles(e.delivered)); err != nil {
		return "", err
	}
	if _, err := e.waitArgoApp(ctx, 3*time.Minute, "Synced", "Healthy"); err != nil {
		return "", fmt.Errorf("after the revert: %w", err)
	}
	if err := poll(ctx, time.Minute, func() error {
		if _, err := e.placement(ctx, InvalidPlacement); !apierrors.IsNotFound(err) {
			return fmt.Errorf("Placement %s still there after the revert (%v)", InvalidPlacement, err)
		}
		return nil
	}); err != nil {
		return "", err
	}
	return shown + fmt.Sprintf("\nreverted: Placement %s pruned by Argo CD, Application Synced and Healthy", InvalidPlacement), nil
}

// argoPruneInUse commits placement scratch, binds a PVC of its class, then removes it from Git:
// Argo CD prunes the Placement, Plinth's finalizer keeps it (and its StorageClass) while the PVC
// exists and reports it in use; with the PVC deleted both go.
func (e *Walk) argoPruneInUse(ctx context.Context, sum *ArgoCDSummary) (string, error) {
	const name = "argo-scratch-data"
	// without is the policy without placement scratch (the Flux cases leave it out; a run whose
	// Flux case failed may still hold it), with the policy plus it.
	without := e.delivered.clone()
	delete(without, "placement-"+ExtraPlacement+".yaml")
	with := without.clone()
	with["placement-"+ExtraPlacement+".yaml"] = []byte(extraPlacementYAML)
	base := sum.Resources - (len(e.delivered) - len(without))
	if err := e.argoCommit(ctx, "add placement scratch", argoFiles(with)); err != nil {
		return "", err
	}
	res, err := e.waitArgoApp(ctx, 3*time.Minute, "Synced", "Healthy")
	if err != nil {
		return "", err
	}
	if len(res) != base+1 {
		return "", fmt.Errorf("Application %s tracks %d resources after adding placement %s, want %d", ArgoCDPolicyApp, len(res), ExtraPlacement, base+1)
	}
	if _, err := e.claim(ctx, name, ExtraClass); err != nil {
		return "", err
	}
	pvc, err := e.waitBound(ctx, name, 3*time.Minute)
	if err != nil {
		return "", err
	}
	// The pull request's review (docs/policy-review.md, "With Argo CD"): plinth diff's live mode on
	// the pull request's checkout predicts that the removal keeps the class in use.
	review, err := e.argoReview(ctx, argoFiles(without))
	if err != nil {
		return "", err
	}
	start := time.Now()
	if err := e.argoCommit(ctx, "remove placement scratch", argoFiles(without)); err != nil {
		return "", err
	}
	reported, err := e.placementKeptInUse(ctx, 3*time.Minute)
	if err != nil {
		return "", err
	}
	sum.Pruned = time.Since(start)
	// Argo CD's own record of the prune: the sync operation's result for the Placement.
	var prunedBy, op string
	if err := poll(ctx, time.Minute, func() error {
		app, err := e.argoApplication(ctx, ArgoCDPolicyApp)
		if err != nil {
			return err
		}
		results, _, _ := unstructured.NestedSlice(app.Object, "status", "operationState", "syncResult", "resources")
		phase, _, _ := unstructured.NestedString(app.Object, "status", "operationState", "phase")
		msg, _, _ := unstructured.NestedString(app.Object, "status", "operationState", "message")
		op = phase + ": " + msg
		for _, r := range results {
			m, _ := r.(map[string]any)
			if m["kind"] == "Placement" && m["name"] == ExtraPlacement {
				prunedBy = fmt.Sprintf("%v: %v", m["status"], m["message"])
			}
		}
		if !strings.HasPrefix(prunedBy, "Pruned") {
			return fmt.Errorf("Application %s sync result for Placement %s: %q, want Pruned (operation %s)", ArgoCDPolicyApp, ExtraPlacement, prunedBy, op)
		}
		return nil
	}); err != nil {
		return "", err
	}
	prunedBy += "; operation " + op
	if err := e.releaseInUsePlacement(ctx, name, pvc); err != nil {
		return "", err
	}
	res, err = e.waitArgoApp(ctx, 2*time.Minute, "Synced", "Healthy")
	if err != nil {
		return "", err
	}
	if len(res) != base {
		return "", fmt.Errorf("Application %s tracks %d resources after the prune, want %d", ArgoCDPolicyApp, len(res), base)
	}
	return fmt.Sprintf("%s\nPlacement %s pruned by Argo CD (sync result %s) %.1fs after the commit, kept by Plinth: %s; StorageClass %s kept\nPVC %s deleted → Placement %s and StorageClass %s gone; Application Synced, Healthy, %d resources",
		review, ExtraPlacement, prunedBy, sum.Pruned.Seconds(), reported, ExtraClass, name, ExtraPlacement, ExtraClass, len(res)), nil
}

// argoDiff runs plinth diff's live mode (controllers/diff.Live, the code of `plinth diff
// --kubeconfig`) on a pull request's checkout of the policy repository: files are written under
// a folder of their own, as CI checks the pull request out. It returns the report and its text.
func (e *Walk) argoDiff(ctx context.Context, files map[string][]byte) (*diff.Report, string, error) {
	pr := filepath.Join(e.Dir, "argocd", "pull-request")
	if err := os.RemoveAll(pr); err != nil {
		return nil, "", err
	}
	for p, data := range files {
		full := filepath.Join(pr, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			return nil, "", err
		}
		if err := os.WriteFile(full, data, 0o644); err != nil {
			return nil, "", err
		}
	}
	rep, err := diff.Live(ctx, []string{filepath.Join(pr, fluxRepoPath)}, diff.LiveOptions{Client: e.Client})
	if err != nil {
		return nil, "", fmt.Errorf("plinth diff on the pull request: %w", err)
	}
	var text strings.Builder
	if err := diff.Write(&text, rep, diff.FormatText); err != nil {
		return nil, "", err
	}
	return rep, text.String(), nil
}

// argoReview wants plinth diff to report the pull request removing placement scratch as exit
// status 3 (violations) with one PrunedClassInUse violation for it.
func (e *Walk) argoReview(ctx context.Context, files map[string][]byte) (string, error) {
	rep, text, err := e.argoDiff(ctx, files)
	if err != nil {
		return "", err
	}
	if rep.ExitCode() != diff.ExitViolations || len(rep.Violations) != 1 || rep.Violations[0].Rule != "PrunedClassInUse" || rep.Violations[0].Object != "Placement/"+ExtraPlacement {
		return "", fmt.Errorf("plinth diff on the pull request removing placement %s: exit %d, violations %v, want exit %d and one PrunedClassInUse for it:\n%s",
			ExtraPlacement, rep.ExitCode(), rep.Violations, diff.ExitViolations, text)
	}
	return fmt.Sprintf("plinth diff (live) on the pull request: exit %d, %s", rep.ExitCode(), rep.Violations[0]), nil
}
