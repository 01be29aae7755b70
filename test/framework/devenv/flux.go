package devenv

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/cgi"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/plinth-storage/plinth/test/framework/controlplane"
)

// Flux peers (test/tools/flux-controllers; versions in test/tools/versions.env).
const (
	BinSourceController    = "flux-source-controller"
	BinKustomizeController = "flux-kustomize-controller"
	FluxNamespace          = "flux-system"
	fluxRepoName           = "plinth-policy"
	fluxRepoPath           = "clusters/dev"
)

// gitRepo is a bare repository served over smart HTTP on loopback by git
// http-backend (net/http/cgi in this process), plus a work tree to commit from.
type gitRepo struct {
	bare, work, url string
	srv             *http.Server
}

func (g *gitRepo) close() {
	if g.srv != nil {
		g.srv.Close()
	}
}

func git(dir string, args ...string) error {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=plinth dev", "GIT_AUTHOR_EMAIL=dev@plinth.invalid",
		"GIT_COMMITTER_NAME=plinth dev", "GIT_COMMITTER_EMAIL=dev@plinth.invalid")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

func newGitRepo(dir string) (*gitRepo, error) {
	g := &gitRepo{bare: filepath.Join(dir, "git", fluxRepoName+".git"), work: filepath.Join(dir, "git", "work")}
	if err := os.MkdirAll(g.work, 0o755); err != nil {
		return nil, err
	}
	if err := git(dir, "init", "-q", "--bare", "-b", "main", g.bare); err != nil {
		return nil, err
	}
	if err := git(g.bare, "config", "http.receivepack", "true"); err != nil {
		return nil, err
	}
	if err := git(g.work, "init", "-q", "-b", "main"); err != nil {
		return nil, err
	}
	out, err := exec.Command("git", "--exec-path").Output()
	if err != nil {
		return nil, fmt.Errorf("git --exec-path: %w", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	h := &cgi.Handler{
		Path: filepath.Join(strings.TrimSpace(string(out)), "git-http-backend"),
		Root: "/git",
		Env:  []string{"GIT_PROJECT_ROOT=" + filepath.Dir(g.bare), "GIT_HTTP_EXPORT_ALL=1"},
	}
	mux := http.NewServeMux()
	mux.Handle("/git/", h)
	g.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go g.srv.Serve(l) //nolint:errcheck // closed by close()
	g.url = fmt.Sprintf("http://%s/git/%s.git", l.Addr(), fluxRepoName)
	return g, nil
}

// ServeGit serves files (path relative to the repository → content), committed on branch main,
// as a Git repository over smart HTTP on loopback (git http-backend), kept under dir. It
// returns the repository's URL, for a Flux GitRepository, and stop, which closes the server.
func ServeGit(dir string, files map[string][]byte) (url string, stop func(), err error) {
	g, err := newGitRepo(dir)
	if err != nil {
		return "", nil, err
	}
	if err := g.commit("policy", files); err != nil {
		g.close()
		return "", nil, err
	}
	return g.url, g.close, nil
}

// CommitServed commits files (path relative to the repository → content) on top of what the
// repository ServeGit serves from dir at url holds, with message msg, and pushes them: the
// next commit of a policy repository. Files not named stay.
func CommitServed(dir, url, msg string, files map[string][]byte) error {
	g := &gitRepo{bare: filepath.Join(dir, "git", fluxRepoName+".git"), work: filepath.Join(dir, "git", "work"), url: url}
	return g.commit(msg, files)
}

// commit writes files (path relative to the repository → content), commits
// and pushes to the served bare repository.
func (g *gitRepo) commit(msg string, files map[string][]byte) error {
	// The policy folder is rewritten whole: a file left out of files leaves Git.
	if err := os.RemoveAll(filepath.Join(g.work, fluxRepoPath)); err != nil {
		return err
	}
	for p, data := range files {
		full := filepath.Join(g.work, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(full, data, 0o644); err != nil {
			return err
		}
	}
	if err := git(g.work, "add", "-A"); err != nil {
		return err
	}
	if err := git(g.work, "commit", "-q", "-m", msg); err != nil {
		return err
	}
	return git(g.work, "push", "-q", g.url, "main")
}

// fluxCRDs lists the CRD files of the pinned Flux controllers that `make
// testbin` copied from the Go module cache into <bin>/crds/flux (every
// source.toolkit.fluxcd.io kind, and Kustomization).
func (e *Env) fluxCRDs() ([]string, error) {
	bin := e.Opts.BinDir
	if bin == "" {
		var err error
		if bin, err = controlplane.TestBinDir(); err != nil {
			return nil, err
		}
	}
	files, err := filepath.Glob(filepath.Join(bin, "crds", "flux", "*.yaml"))
	if err != nil {
		return nil, err
	}
	// source-controller does not start without every kind it watches.
	for _, want := range []string{"gitrepositories", "helmrepositories", "helmcharts", "buckets", "ocirepositories", "kustomizations"} {
		found := false
		for _, f := range files {
			found = found || strings.Contains(filepath.Base(f), "_"+want+".yaml")
		}
		if !found {
			return nil, fmt.Errorf("Flux CRDs: no %s CRD under %s/crds/flux (run `make testbin`)", want, bin)
		}
	}
	return files, nil
}

// startFlux installs the CRDs of Flux's two controllers, serves the
// policy repository and starts source-controller and kustomize-controller.
func (e *Env) startFlux(ctx context.Context) (string, error) {
	crds, err := e.fluxCRDs()
	if err != nil {
		return "", err
	}
	if _, err := e.applyCRDFiles(ctx, crds); err != nil {
		return "", err
	}
	if err := e.ensureNamespace(ctx, FluxNamespace); err != nil {
		return "", err
	}
	if e.git, err = newGitRepo(e.Dir); err != nil {
		return "", err
	}
	var ports [5]int
	for i := range ports {
		if ports[i], err = controlplane.FreePort(); err != nil {
			return "", err
		}
	}
	storage := fmt.Sprintf("127.0.0.1:%d", ports[0])
	sc, err := e.startHost(ctx, controlplane.ProcessSpec{
		Name: BinSourceController, Binary: BinSourceController,
		Args: []string{fmt.Sprintf("--metrics-addr=127.0.0.1:%d", ports[1]), fmt.Sprintf("--health-addr=127.0.0.1:%d", ports[2]),
			"--storage-path=" + filepath.Join(e.Dir, "flux-storage"), "--storage-addr=" + storage, "--storage-adv-addr=" + storage,
			"--enable-leader-election=false", "--log-level=info"},
		// Flux's controllers take no --kubeconfig flag: controller-runtime reads KUBECONFIG.
		Env:   []string{"KUBECONFIG=" + e.Kubeconfig},
		Ready: controlplane.HTTPReady(fmt.Sprintf("http://127.0.0.1:%d/readyz", ports[2]), nil),
	})
	if err != nil {
		return "", err
	}
	kc, err := e.startHost(ctx, controlplane.ProcessSpec{
		Name: BinKustomizeController, Binary: BinKustomizeController,
		Args: []string{fmt.Sprintf("--metrics-addr=127.0.0.1:%d", ports[3]), fmt.Sprintf("--health-addr=127.0.0.1:%d", ports[4]),
			"--enable-leader-election=false", "--log-level=info"},
		Env:   []string{"KUBECONFIG=" + e.Kubeconfig},
		Ready: controlplane.HTTPReady(fmt.Sprintf("http://127.0.0.1:%d/readyz", ports[4]), nil),
	})
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("git repository %s\nsource-controller pid %d, kustomize-controller pid %d", e.git.url, sc.PID(), kc.PID()), nil
}

// startHost runs a process on the host owned by the control plane and records its PID.
func (e *Env) startHost(ctx context.Context, spec controlplane.ProcessSpec) (*controlplane.Process, error) {
	if spec.ReadyTimeout == 0 {
		spec.ReadyTimeout = e.Opts.StartTimeout
	}
	p, err := e.CP.StartProcess(ctx, spec)
	if err != nil {
		return nil, err
	}
	e.recordPID(p)
	return p, nil
}

// fluxObjects are the GitRepository and Kustomization of the policy
// repository that a production user applies (kustomize/flux/policies.yaml,
// health checks included), pointed at the local repository with short
// intervals and without the dependency on Plinth's own Kustomization (the
// dev environment runs Plinth as processes).
func (e *Walk) fluxObjects() ([]*unstructured.Unstructured, error) {
	objs, err := readObjects(filepath.Join(e.Root, "kustomize", "flux", "policies.yaml"))
	if err != nil {
		return nil, err
	}
	for _, o := range objs {
		o.SetName(fluxRepoName)
		o.SetNamespace(FluxNamespace)
		switch o.GetKind() {
		case "GitRepository":
			_ = unstructured.SetNestedField(o.Object, e.git.url, "spec", "url")
			_ = unstructured.SetNestedField(o.Object, "2s", "spec", "interval")
		case "Kustomization":
			unstructured.RemoveNestedField(o.Object, "spec", "dependsOn")
			_ = unstructured.SetNestedField(o.Object, fluxRepoName, "spec", "sourceRef", "name")
			_ = unstructured.SetNestedField(o.Object, "./"+fluxRepoPath, "spec", "path")
			_ = unstructured.SetNestedField(o.Object, "2s", "spec", "retryInterval")
			_ = unstructured.SetNestedField(o.Object, "1m", "spec", "interval")
			_ = unstructured.SetNestedField(o.Object, "2m", "spec", "timeout")
		}
	}
	return objs, nil
}
