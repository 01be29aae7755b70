// Package devenv is `plinth-dev`: the whole storage loop of Plinth on one
// machine, on real parts, with no cloud and no Docker.
//
// Up (this file) brings the environment up: a real control plane (etcd,
// kube-apiserver, kube-controller-manager and the cluster's kube-scheduler,
// through test/framework/controlplane), three real nodes on this host
// (test/framework/cluster: a kubelet, containerd and CNI bridge each, one
// kube-proxy) with the images of `make images` imported, Plinth deployed
// as users deploy it (test/framework/deploy: kustomize build of
// kustomize/overlays/dev and server-side apply: controller, agent DaemonSet,
// CSI controller with its sidecars, CSI node DaemonSet, plinth-scheduler, all
// pods), Debian's Prometheus on loopback scraping all of it and the kubelets
// (prometheus.go), and with Options.Flux (the default of `plinth-dev up`) Flux's
// source-controller and kustomize-controller with a Git repository served on
// loopback. Node and CSINode objects come from the kubelets and the driver's
// own registration. Down stops every process by PID and releases the loop
// devices the agents attached.
//
// Walk (scenario.go, gitops.go, cases.go) is a client of a running Env: it
// walks the quickstart — policy committed to Git and synced by Flux (or
// applied) → StorageClass/Agent/Store, PVC + busybox pod → volume staged and
// published by the real kubelet, written and read through kubectl exec, a
// hand edit Drifted then corrected, a change committed, an invalid policy
// Stalled, then deletion — and the cases beyond it.
//
// Every host process runs as a child of the caller with its log under
// <Dir>/logs (the nodes' under <Dir>/nodes/logs); <Dir>/pids lists "name
// pid" lines so `plinth-dev down` can end them when the parent is gone.
package devenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/test/framework/cluster"
	"github.com/plinth-storage/plinth/test/framework/controlplane"
	"github.com/plinth-storage/plinth/test/framework/deploy"
	"github.com/plinth-storage/plinth/test/framework/monitoring"
)

// Names of the dev fleet.
const (
	// ControllerNamespace is where Plinth runs (kustomize/default).
	ControllerNamespace = "plinth-system"
	// FieldManager is the server-side apply manager of what `plinth-dev` writes itself.
	FieldManager = "plinth-dev"
	// StorageLabel is the label every dev node carries (value "dev"): the
	// quickstart pool's nodeSelector, as an installer would label storage nodes.
	StorageLabel = "plinth.dev/storage"
	// DevOverlay is the kustomization `plinth-dev` deploys, relative to the checkout.
	DevOverlay = "kustomize/overlays/dev"
)

// Options configure Up. The zero value is usable from the repository root.
type Options struct {
	// Dir is the work directory (logs, kubeconfig, nodes). Empty means
	// DefaultDir. It is removed and recreated by Up.
	Dir string
	// Root is the repository checkout (kustomize/, examples); empty means
	// controlplane.ModuleRoot() from the working directory.
	Root string
	// BinDir holds the test peers (`make testbin`); empty means controlplane.TestBinDir().
	BinDir string
	// Images holds the image archives of `make images`; empty means <BinDir>/images.
	Images string
	// Nodes is the number of real nodes (default 3).
	Nodes int
	// Flux, when true, delivers the policy through a local Git repository
	// synced by Flux's source-controller and kustomize-controller.
	Flux bool
	// NoPrometheus leaves Prometheus out (benchmarks: its scrapes would add load to what they
	// measure). Walk.Scenario needs it.
	NoPrometheus bool
	// Out receives the step lines; nil means io.Discard.
	Out io.Writer
	// StartTimeout bounds each process's start-up and the rollout (default 5 minutes).
	StartTimeout time.Duration
}

// DefaultDir is the work directory of `plinth-dev` when Options.Dir is empty.
const DefaultDir = "/tmp/plinth-dev"

// Env is a running dev environment: a control plane, real nodes and Plinth
// deployed on them (and Flux). Scenario drives it.
type Env struct {
	Opts   Options
	Dir    string
	Root   string
	CP     *controlplane.ControlPlane
	Nodes  *cluster.Cluster
	Client client.Client
	CS     *kubernetes.Clientset
	// Kubeconfig is the admin kubeconfig, for kubectl; Kubectl the kubectl binary.
	Kubeconfig, Kubectl string
	// Deployed is what deploying Plinth did.
	Deployed *deploy.Result
	// Prom is the Prometheus on loopback that scrapes Plinth, plinth-scheduler and the
	// kubelets (prometheus.go).
	Prom *monitoring.Prometheus

	rep    *reporter
	procs  map[string]*controlplane.Process
	pidLog *os.File
	ownLog *os.File
	git    *gitRepo
	// argoGit is the policy repository of the Argo CD phase (argocd.go).
	argoGit *gitRepo
	// discovery serves Prom's HTTP service discovery.
	discovery *http.Server
	// failed names the components of the step that failed (for the log tails).
	failed []string
}

// Scheme knows the Kubernetes kinds and Plinth's.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, policyv1.AddToScheme, storev1.AddToScheme} {
		if err := add(s); err != nil {
			panic(err)
		}
	}
	return s
}

// Results returns the steps run so far.
func (e *Env) Results() []StepResult {
	e.rep.mu.Lock()
	defer e.rep.mu.Unlock()
	return append([]StepResult(nil), e.rep.results...)
}

// Step runs f as a reported step (for callers adding their own steps).
func (e *Env) Step(title string, f func() (string, error)) error { return e.rep.run(title, f) }

// Up starts the environment step by step. On error everything it started is
// stopped (the returned Env is still usable for Results and LogTails).
func Up(ctx context.Context, opts Options) (_ *Env, err error) {
	if opts.Out == nil {
		opts.Out = io.Discard
	}
	if opts.StartTimeout == 0 {
		opts.StartTimeout = 5 * time.Minute
	}
	if opts.Nodes == 0 {
		opts.Nodes = 3
	}
	e := &Env{Opts: opts, rep: &reporter{out: opts.Out}, procs: map[string]*controlplane.Process{}}
	if e.Dir = opts.Dir; e.Dir == "" {
		e.Dir = DefaultDir
	}
	if e.Dir, err = filepath.Abs(e.Dir); err != nil {
		return e, err
	}
	if e.Root = opts.Root; e.Root == "" {
		if e.Root, err = controlplane.ModuleRoot(); err != nil {
			return e, fmt.Errorf("repository root (run from the checkout or set Root): %w", err)
		}
	}
	if err := checkNotRunning(e.Dir); err != nil {
		return e, err
	}
	if holder, held := cluster.LockHeld(); held {
		// Said at once: the nodes step waits for this lock, and nothing else would tell why.
		e.rep.printf("… another node cluster holds %s (%s): dev up starts the control plane, then waits for that lock before starting nodes\n", cluster.LockPath, holder)
	}
	defer func() {
		if err != nil {
			e.failureTails()
			_ = e.Down()
		}
	}()
	steps := []struct {
		title string
		f     func() (string, error)
	}{
		{"work directory " + e.Dir, e.prepareDir},
		{"control plane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler", func() (string, error) { return e.startControlPlane(ctx) }},
		{fmt.Sprintf("%d real nodes: containerd, kubelet, CNI bridge each; kube-proxy; images imported", opts.Nodes), func() (string, error) { return e.startNodes(ctx) }},
		{"deploy Plinth: kustomize build " + DevOverlay + " | server-side apply; rollouts", func() (string, error) { return e.deployPlinth(ctx) }},
	}
	if !opts.NoPrometheus {
		steps = append(steps, struct {
			title string
			f     func() (string, error)
		}{"Prometheus: scrape configuration from " + ServiceMonitorFile + " + kubelets + plinth-scheduler, rules of " + PrometheusRuleFile, func() (string, error) { return e.startPrometheus(ctx) }})
	}
	if opts.Flux {
		steps = append(steps, struct {
			title string
			f     func() (string, error)
		}{"Flux: git server, source-controller, kustomize-controller", func() (string, error) { return e.startFlux(ctx) }})
	}
	for _, s := range steps {
		if err := e.rep.run(s.title, s.f); err != nil {
			return e, err
		}
	}
	return e, nil
}

func (e *Env) prepareDir() (string, error) {
	cleanupMounts(e.Dir)
	if err := os.RemoveAll(e.Dir); err != nil {
		return "", err
	}
	for _, d := range []string{"logs", "flux-storage"} {
		if err := os.MkdirAll(filepath.Join(e.Dir, d), 0o755); err != nil {
			return "", err
		}
	}
	var err error
	e.pidLog, err = os.OpenFile(filepath.Join(e.Dir, "pids"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return "", err
	}
	fmt.Fprintf(e.pidLog, "plinth-dev %d\n", os.Getpid())
	// The clients of this process (server-side apply, the scenario's) log
	// through controller-runtime: into logs/plinth-dev.log, not the terminal.
	lf, err := os.OpenFile(filepath.Join(e.Dir, "logs", "plinth-dev.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return "", err
	}
	e.ownLog = lf
	ctrllog.SetLogger(funcr.New(func(prefix, args string) { fmt.Fprintln(lf, time.Now().Format(time.RFC3339Nano), prefix, args) }, funcr.Options{}))
	return "", nil
}

func (e *Env) startControlPlane(ctx context.Context) (string, error) {
	cp, err := controlplane.Start(ctx, controlplane.Options{
		Dir: filepath.Join(e.Dir, "cluster"), BinDir: e.Opts.BinDir, Nodes: true, Scheduler: true, StartTimeout: e.Opts.StartTimeout,
	})
	if err != nil {
		return "", err
	}
	e.CP = cp
	for _, p := range cp.Processes() {
		e.recordPID(p)
	}
	e.Kubeconfig = cp.Admin.Kubeconfig
	if e.Client, err = client.New(cp.Admin.Config, client.Options{Scheme: Scheme()}); err != nil {
		return "", err
	}
	if e.CS, err = kubernetes.NewForConfig(cp.Admin.Config); err != nil {
		return "", err
	}
	if e.Kubectl, err = controlplane.BinaryPath(e.Opts.BinDir, controlplane.BinKubectl); err != nil {
		return "", err
	}
	return fmt.Sprintf("API server %s, advertised on %s (ready in %.1fs)\nexport KUBECONFIG=%s\n%s get nodes,pods -A; %s get storagepools,placements,stores,volumestates,pvc,pv",
		cp.URL, cp.NodeIP, cp.StartDuration.Seconds(), e.Kubeconfig, e.Kubectl, e.Kubectl), nil
}

func (e *Env) recordPID(p *controlplane.Process) {
	e.procs[p.Name] = p
	if e.pidLog != nil {
		fmt.Fprintf(e.pidLog, "%s %d\n", p.Name, p.PID())
	}
}

// imagesDir is where the image archives are.
func (e *Env) imagesDir() (string, error) {
	if e.Opts.Images != "" {
		return e.Opts.Images, nil
	}
	bin := e.Opts.BinDir
	if bin == "" {
		var err error
		if bin, err = controlplane.TestBinDir(); err != nil {
			return "", err
		}
	}
	return filepath.Join(bin, "images"), nil
}

// ImageArchives are the archives Up imports into every node: Plinth's, its
// sidecars', the sandbox image and busybox (for the users' own pods).
var ImageArchives = []string{"plinth", "plinth-scheduler", "csi-provisioner", "csi-attacher", "csi-resizer", "csi-snapshotter", "snapshot-controller", "pause", "busybox"}

func (e *Env) startNodes(ctx context.Context) (string, error) {
	dir, err := e.imagesDir()
	if err != nil {
		return "", err
	}
	var images []string
	for _, name := range ImageArchives {
		p := filepath.Join(dir, name+".tar")
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("image archive %s: %w (run `make images`)", p, err)
		}
		images = append(images, p)
	}
	opts, err := e.CP.ClusterOptions()
	if err != nil {
		return "", err
	}
	opts.Dir = filepath.Join(e.Dir, "nodes")
	opts.Images = images
	opts.Nodes = cluster.DefaultNodes(e.Opts.Nodes)
	opts.Labels = map[string]string{StorageLabel: "dev"}
	opts.StartTimeout = e.Opts.StartTimeout
	opts.LockWaiting = func(holder string) {
		e.rep.printf("… waiting for %s: another node cluster runs on this host, held by %s\n", cluster.LockPath, holder)
	}
	c, err := cluster.Start(ctx, opts)
	if err != nil {
		return "", err
	}
	e.Nodes = c
	e.logNodePIDs()
	var lines []string
	for _, n := range c.Nodes {
		lines = append(lines, fmt.Sprintf("node %s (zone %s): kubelet on %s:%d, root %s, log %s", n.Name, n.Zone, c.NodeIP, n.KubeletPort, n.RootDir, n.KubeletLogPath()))
	}
	lines = append(lines, fmt.Sprintf("all Ready in %.1fs; %d images imported into each", c.StartDuration.Seconds(), len(images)))
	return strings.Join(lines, "\n"), nil
}

// logNodePIDs adds the node processes (kubelets, containerds, kube-proxy) to the PID log, so
// clean-up after a crashed run finds them; a PID logged twice is harmless.
func (e *Env) logNodePIDs() {
	if e.pidLog == nil || e.Nodes == nil {
		return
	}
	for _, pid := range e.Nodes.PIDs() {
		fmt.Fprintf(e.pidLog, "node-process %d\n", pid)
	}
}

// deployPlinth deploys Plinth as users do (test/framework/deploy) and waits until
// kubelet lists the driver on every node's CSINode (the node plugin's own
// registration).
func (e *Env) deployPlinth(ctx context.Context) (string, error) {
	objs, err := deploy.Build(filepath.Join(e.Root, DevOverlay))
	if err != nil {
		return "", err
	}
	e.Deployed, err = deploy.Apply(ctx, e.CP.Admin.Config, objs, e.Opts.StartTimeout)
	if err != nil {
		return "", err
	}
	for _, n := range e.Nodes.Nodes {
		if err := poll(ctx, 2*time.Minute, func() error {
			var cn storagev1.CSINode
			if err := e.Client.Get(ctx, client.ObjectKey{Name: n.Name}, &cn); err != nil {
				return err
			}
			for _, d := range cn.Spec.Drivers {
				if d.Name == policyv1.DriverName {
					return nil
				}
			}
			return fmt.Errorf("CSINode %s does not list %s yet", n.Name, policyv1.DriverName)
		}); err != nil {
			return "", err
		}
	}
	return fmt.Sprintf("%s\nCSINode of every node lists %s (registered with kubelet by the node plugin)", e.Deployed, policyv1.DriverName), nil
}

// VolumeDir is the host path of node's quickstart file-backend directory
// (/var/lib/plinth/dev on the node).
func (e *Env) VolumeDir(node string) string {
	n := e.Nodes.Node(node)
	if n == nil {
		return ""
	}
	return filepath.Join(n.Dir, "plinth", "dev")
}

// LogTails returns the last n lines of each process's log, by name.
func (e *Env) LogTails(n int) map[string]string {
	if e.CP == nil {
		return nil
	}
	return e.CP.LogTails(n)
}

// Down stops every process Up started (by PID, newest first), unmounts what is
// still mounted under the work directory (volumes of a node stopped mid-way) and detaches
// the loop devices of the volumes.
// The work directory stays for reading logs.
func (e *Env) Down() error {
	var errs []error
	if e.argoGit != nil {
		e.argoGit.close()
	}
	if e.git != nil {
		e.git.close()
	}
	if err := e.stopDiscovery(); err != nil {
		errs = append(errs, err)
	}
	if e.Nodes != nil {
		if err := e.Nodes.Stop(); err != nil {
			errs = append(errs, err)
		}
		detachLoops(e.Dir)
	}
	if e.CP != nil {
		if err := e.CP.Stop(); err != nil {
			errs = append(errs, err)
		}
	}
	cleanupMounts(e.Dir)
	if e.pidLog != nil {
		e.pidLog.Close()
		os.Remove(e.pidLog.Name())
		e.pidLog = nil
	}
	if e.ownLog != nil {
		ctrllog.SetLogger(logr.Discard())
		e.ownLog.Close()
		e.ownLog = nil
	}
	return errors.Join(errs...)
}

// DownDir stops what a `plinth-dev up` recorded in <dir>/pids (the parent
// first, which stops its children itself, then any child left) and cleans
// up mounts and loop devices under dir. It returns the PIDs it signalled.
func DownDir(dir string) ([]int, error) {
	data, err := os.ReadFile(filepath.Join(dir, "pids"))
	if errors.Is(err, os.ErrNotExist) {
		cleanupMounts(dir)
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, l := range strings.Split(string(data), "\n") {
		f := strings.Fields(l)
		if len(f) != 2 {
			continue
		}
		if pid, err := strconv.Atoi(f[1]); err == nil && pid > 1 && pid != os.Getpid() {
			pids = append(pids, pid)
		}
	}
	var signalled []int
	for i, pid := range pids {
		if syscall.Kill(pid, syscall.SIGTERM) == nil {
			signalled = append(signalled, pid)
		}
		if i == 0 { // the parent stops its children; wait for it a while
			waitGone(pid, 20*time.Second)
		}
	}
	for _, pid := range signalled {
		if !waitGone(pid, 5*time.Second) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	cleanupMounts(dir)
	detachLoops(dir)
	os.Remove(filepath.Join(dir, "pids"))
	return signalled, nil
}

func waitGone(pid int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if syscall.Kill(pid, 0) != nil {
			return true
		}
		time.Sleep(100 * time.Millisecond)
	}
	return syscall.Kill(pid, 0) != nil
}

// checkNotRunning refuses to start over a live `plinth-dev up` in dir.
func checkNotRunning(dir string) error {
	data, err := os.ReadFile(filepath.Join(dir, "pids"))
	if err != nil {
		return nil
	}
	f := strings.Fields(strings.SplitN(string(data), "\n", 2)[0])
	if len(f) == 2 && f[0] == "plinth-dev" {
		if pid, err := strconv.Atoi(f[1]); err == nil && syscall.Kill(pid, 0) == nil {
			return fmt.Errorf("plinth-dev is already running in %s (pid %d): run `plinth-dev down` first", dir, pid)
		}
	}
	return nil
}

// cleanupMounts unmounts every mount under dir (deepest first) and detaches
// loop devices whose backing file is under dir. Errors are ignored: it is
// best effort on the way out.
func cleanupMounts(dir string) {
	if dir == "" {
		return
	}
	dir = filepath.Clean(dir) + "/"
	if data, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		var mps []string
		for _, l := range strings.Split(string(data), "\n") {
			f := strings.Fields(l)
			if len(f) > 4 && strings.HasPrefix(f[4]+"/", dir) {
				mps = append(mps, f[4])
			}
		}
		sort.Slice(mps, func(i, j int) bool { return len(mps[i]) > len(mps[j]) })
		for _, m := range mps {
			_ = syscall.Unmount(m, 0)
		}
	}
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil || !strings.HasPrefix(strings.TrimSpace(string(b)), dir) {
			continue
		}
		dev := "/dev/" + filepath.Base(filepath.Dir(filepath.Dir(f)))
		_ = exec.Command("losetup", "-d", dev).Run()
	}
}

// detachLoops detaches the loop devices whose backing file is a volume file
// under dir (matched by device and inode: the agents opened them through
// their own mount namespaces, so the kernel's path for them is not the
// host's). Best effort, on the way out.
func detachLoops(dir string) {
	files, _ := filepath.Glob(filepath.Join(dir, "nodes", "*", "plinth", "*", "*.img"))
	want := map[string]bool{}
	for _, f := range files {
		var st syscall.Stat_t
		if syscall.Stat(f, &st) == nil {
			want[fmt.Sprintf("%d %d:%d", st.Ino, unixMajor(st.Dev), unixMinor(st.Dev))] = true
		}
	}
	if len(want) == 0 {
		return
	}
	out, err := exec.Command("losetup", "--list", "--noheadings", "--output", "NAME,BACK-INO,BACK-MAJ:MIN").Output()
	if err != nil {
		return
	}
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		if len(f) == 3 && want[f[1]+" "+f[2]] {
			_ = exec.Command("losetup", "-d", f[0]).Run()
		}
	}
}

func unixMajor(dev uint64) uint64 { return (dev >> 8) & 0xfff }
func unixMinor(dev uint64) uint64 { return (dev & 0xff) | ((dev >> 12) & 0xfff00) }
