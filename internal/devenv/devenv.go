// Package devenv is `plinth dev`: the whole storage loop of Plinth on one
// machine, on real parts, with no cluster and no Docker.
//
// Up starts a real control plane (etcd, kube-apiserver,
// kube-controller-manager and plinth-scheduler from bin/, through
// test/controlplane), registers Node and CSINode objects standing in for
// kubelet (DESIGN.md "Tests without a kubelet"), installs Plinth's CRDs and
// the CSIDriver, and runs `plinth controller`, `plinth agent` with the file
// backend on loop devices under the work directory, `plinth csi --mode all`
// and the real csi-provisioner, csi-attacher and csi-resizer, and with
// Options.Flux (the default of `plinth dev up`) Flux's source-controller and
// kustomize-controller with a Git repository served on loopback. Scenario
// then walks the quickstart: policy committed to Git and synced by Flux (or
// applied) → StorageClass/Agent/Store, PVC + pod → volume → staged and
// published through the node plugin's socket as kubelet would, a hand edit
// Drifted then corrected, a change committed, an invalid policy Stalled,
// then deletion. Down stops every process by PID.
//
// Every process runs as a child of the caller with its log under
// <Dir>/logs; <Dir>/pids lists "name pid" lines so `plinth dev down` can end
// them when the parent is gone.
package devenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/test/controlplane"
)

// Names of the dev fleet.
const (
	// StorageNode is the one node with real storage (the file backend on this host).
	StorageNode = "node-a"
	// ControllerNamespace holds the controller's inventory ConfigMap.
	ControllerNamespace = "plinth-system"
	// FieldManager is the server-side apply manager of what `plinth dev` writes itself.
	FieldManager = "plinth-dev"
	// LabelObjectOnly marks the Nodes that exist only as API objects (no agent, no storage).
	LabelObjectOnly = "dev.plinth.dev/object-only"
)

// ObjectOnlyNodes are Nodes registered as objects only, labelled LabelObjectOnly=true.
var ObjectOnlyNodes = []string{"node-b", "node-c"}

// Options configure Up. The zero value is usable from the repository root.
type Options struct {
	// Dir is the work directory (logs, kubeconfig, volumes, sockets). Empty
	// means DefaultDir. It is removed and recreated by Up.
	Dir string
	// Root is the repository checkout (CRDs, examples); empty means
	// controlplane.ModuleRoot() from the working directory.
	Root string
	// BinDir holds the test peers (`make testbin`); empty means controlplane.TestBinDir().
	BinDir string
	// Plinth is the plinth binary run as controller, agent and csi; empty means os.Executable().
	Plinth string
	// Flux, when true, delivers the policy through a local Git repository
	// synced by Flux's source-controller and kustomize-controller.
	Flux bool
	// Out receives the step lines; nil means io.Discard.
	Out io.Writer
	// StartTimeout bounds each process's start-up (default 2 minutes).
	StartTimeout time.Duration
}

// DefaultDir is the work directory of `plinth dev` when Options.Dir is empty.
const DefaultDir = "/tmp/plinth-dev"

// Env is a running dev environment.
type Env struct {
	Opts   Options
	Dir    string
	Root   string
	CP     *controlplane.ControlPlane
	Client client.Client
	CS     *kubernetes.Clientset
	// Kubeconfig is the admin kubeconfig, for kubectl.
	Kubeconfig string
	// ControllerMetrics, AgentMetrics are the http://host:port/metrics URLs.
	ControllerMetrics, AgentMetrics string
	// CSISocket is the node plugin's (and controller's) unix socket.
	CSISocket string
	// VolumeDir is the storage node's file-backend directory.
	VolumeDir string

	rep    *reporter
	procs  map[string]*controlplane.Process
	pidLog *os.File
	git    *gitRepo
	// delivered is the policy set last committed (or applied).
	delivered policySet
	// policyReady is the last deliver's commit (apply) → every policy object Ready.
	policyReady time.Duration
	// agentSpec starts the storage node's agent (again, after a kill).
	agentSpec *controlplane.ProcessSpec
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
		opts.StartTimeout = 2 * time.Minute
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
	if opts.Plinth == "" {
		if e.Opts.Plinth, err = os.Executable(); err != nil {
			return e, err
		}
	}
	if err := checkNotRunning(e.Dir); err != nil {
		return e, err
	}
	defer func() {
		if err != nil {
			e.failureTails()
			_ = e.Down()
		}
	}()
	if err := e.rep.run("work directory "+e.Dir, e.prepareDir); err != nil {
		return e, err
	}
	if err := e.rep.run("control plane: etcd, kube-apiserver, kube-controller-manager", func() (string, error) { return e.startControlPlane(ctx) }); err != nil {
		return e, err
	}
	steps := []struct {
		title string
		f     func() (string, error)
	}{
		{"plinth-scheduler (kube-scheduler)", func() (string, error) { return e.startScheduler(ctx) }},
		{"Plinth CRDs and the CSIDriver", func() (string, error) { return e.installCRDs(ctx) }},
		{"Nodes and CSINodes (standing in for kubelet)", func() (string, error) { return e.registerNodes(ctx) }},
		{"plinth controller", func() (string, error) { return e.startController(ctx) }},
		{"plinth agent on " + StorageNode + " (file backend, loop devices)", func() (string, error) { return e.startAgent(ctx) }},
		{"plinth csi (controller + node plugin of " + StorageNode + ")", func() (string, error) { return e.startCSI(ctx) }},
		{"csi-provisioner, csi-attacher, csi-resizer", func() (string, error) { return e.startSidecars(ctx) }},
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
	for _, d := range []string{"logs", "volumes", "agent", "csi", "kubelet", "flux-storage"} {
		if err := os.MkdirAll(filepath.Join(e.Dir, d), 0o755); err != nil {
			return "", err
		}
	}
	e.VolumeDir = filepath.Join(e.Dir, "volumes")
	var err error
	e.pidLog, err = os.OpenFile(filepath.Join(e.Dir, "pids"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return "", err
	}
	fmt.Fprintf(e.pidLog, "plinth-dev %d\n", os.Getpid())
	return "", nil
}

func (e *Env) startControlPlane(ctx context.Context) (string, error) {
	controllers := append(append([]string(nil), controlplane.DefaultControllers...), "persistentvolume-attach-detach-controller")
	cp, err := controlplane.Start(ctx, controlplane.Options{
		Dir: filepath.Join(e.Dir, "cluster"), BinDir: e.Opts.BinDir,
		ControllerManager: true, Controllers: controllers, StartTimeout: e.Opts.StartTimeout,
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
	kubectl, _ := controlplane.BinaryPath(e.Opts.BinDir, controlplane.BinKubectl)
	return fmt.Sprintf("API server %s (ready in %.1fs)\nexport KUBECONFIG=%s\n%s get storagepools,placements,stores,volumestates,pvc,pv",
		cp.URL, cp.StartDuration.Seconds(), e.Kubeconfig, kubectl), nil
}

func (e *Env) recordPID(p *controlplane.Process) {
	e.procs[p.Name] = p
	if e.pidLog != nil {
		fmt.Fprintf(e.pidLog, "%s %d\n", p.Name, p.PID())
	}
}

// start runs a process owned by the control plane and records its PID.
func (e *Env) start(ctx context.Context, spec controlplane.ProcessSpec) (*controlplane.Process, error) {
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

func (e *Env) startScheduler(ctx context.Context) (string, error) {
	port, err := controlplane.FreePort()
	if err != nil {
		return "", err
	}
	kc := e.CP.Admin.Kubeconfig
	cfg, err := e.schedulerConfig(kc)
	if err != nil {
		return "", err
	}
	p, err := e.start(ctx, controlplane.ProcessSpec{
		Name: controlplane.BinPlinthScheduler, Binary: controlplane.BinPlinthScheduler,
		Args: []string{"--config=" + cfg, "--authentication-kubeconfig=" + kc, "--authorization-kubeconfig=" + kc,
			"--bind-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", port)},
		Ready: controlplane.HTTPReady(fmt.Sprintf("https://127.0.0.1:%d/healthz", port), nil),
	})
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("pid %d, log %s", p.PID(), p.LogPath), nil
}

// SchedulerProfile is the schedulerName with which pods opt in to PlinthCapacity: the profile
// of kustomize/scheduler/config.yaml, which plinth dev runs as it is deployed.
const SchedulerProfile = "plinth-scheduler"

// schedulerConfig writes the KubeSchedulerConfiguration plinth-scheduler runs with: the one
// deployed (kustomize/scheduler/config.yaml, profile plinth-scheduler with PlinthCapacity),
// with this control plane's kubeconfig, no leader election, and a plain default-scheduler
// profile standing in for the cluster's own kube-scheduler (nothing else schedules here).
func (e *Env) schedulerConfig(kubeconfig string) (string, error) {
	src := filepath.Join(e.Root, "kustomize", "scheduler", "config.yaml")
	raw, err := os.ReadFile(src)
	if err != nil {
		return "", fmt.Errorf("scheduler configuration: %w", err)
	}
	var cfg map[string]any
	if err := yaml.Unmarshal(raw, &cfg); err != nil {
		return "", fmt.Errorf("%s: %w", src, err)
	}
	profiles, _ := cfg["profiles"].([]any)
	found := false
	for _, p := range profiles {
		if m, ok := p.(map[string]any); ok && m["schedulerName"] == SchedulerProfile {
			found = true
		}
	}
	if !found {
		return "", fmt.Errorf("%s: no profile %q", src, SchedulerProfile)
	}
	cfg["profiles"] = append(profiles, map[string]any{"schedulerName": corev1.DefaultSchedulerName})
	cfg["leaderElection"] = map[string]any{"leaderElect": false}
	cfg["clientConnection"] = map[string]any{"kubeconfig": kubeconfig}
	out, err := yaml.Marshal(cfg)
	if err != nil {
		return "", err
	}
	path := filepath.Join(e.Dir, "scheduler-config.yaml")
	return path, os.WriteFile(path, out, 0o600)
}

func (e *Env) startController(ctx context.Context) (string, error) {
	if err := e.ensureNamespace(ctx, ControllerNamespace); err != nil {
		return "", err
	}
	mport, err := controlplane.FreePort()
	if err != nil {
		return "", err
	}
	hport, err := controlplane.FreePort()
	if err != nil {
		return "", err
	}
	e.ControllerMetrics = fmt.Sprintf("http://127.0.0.1:%d/metrics", mport)
	p, err := e.start(ctx, controlplane.ProcessSpec{
		Name: "plinth-controller", Binary: e.Opts.Plinth,
		Args: []string{"controller", "--kubeconfig", e.Kubeconfig, "--namespace", ControllerNamespace,
			"--metrics-bind-address", fmt.Sprintf("127.0.0.1:%d", mport), "--health-probe-bind-address", fmt.Sprintf("127.0.0.1:%d", hport),
			"--resync-interval", "30s"},
		Ready: controlplane.HTTPReady(fmt.Sprintf("http://127.0.0.1:%d/readyz", hport), nil),
	})
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("pid %d, metrics %s", p.PID(), e.ControllerMetrics), nil
}

func (e *Env) startAgent(ctx context.Context) (string, error) {
	mport, err := controlplane.FreePort()
	if err != nil {
		return "", err
	}
	hport, err := controlplane.FreePort()
	if err != nil {
		return "", err
	}
	e.AgentMetrics = fmt.Sprintf("http://127.0.0.1:%d/metrics", mport)
	e.agentSpec = &controlplane.ProcessSpec{
		Name: "plinth-agent-" + StorageNode, Binary: e.Opts.Plinth,
		Args: []string{"agent", "--node", StorageNode, "--kubeconfig", e.Kubeconfig, "--state-dir", filepath.Join(e.Dir, "agent"),
			"--refresh-interval", "2s", "--metrics-bind-address", fmt.Sprintf("127.0.0.1:%d", mport),
			"--health-probe-bind-address", fmt.Sprintf("127.0.0.1:%d", hport), "--host-nqn-file", filepath.Join(e.Dir, "agent", "no-hostnqn")},
		Ready: controlplane.HTTPReady(fmt.Sprintf("http://127.0.0.1:%d/healthz", hport), nil),
	}
	p, err := e.start(ctx, *e.agentSpec)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("pid %d, volumes under %s, metrics %s", p.PID(), e.VolumeDir, e.AgentMetrics), nil
}

func (e *Env) startCSI(ctx context.Context) (string, error) {
	e.CSISocket = filepath.Join(e.Dir, "csi", "csi.sock")
	if len(e.CSISocket) > 100 {
		return "", fmt.Errorf("socket path %s is too long for a unix socket: choose a shorter --dir", e.CSISocket)
	}
	mport, err := controlplane.FreePort()
	if err != nil {
		return "", err
	}
	p, err := e.start(ctx, controlplane.ProcessSpec{
		Name: "plinth-csi", Binary: e.Opts.Plinth,
		Args: []string{"csi", "--mode", "all", "--endpoint", "unix://" + e.CSISocket, "--kubeconfig", e.Kubeconfig,
			"--node-name", StorageNode, "--state-dir", filepath.Join(e.Dir, "csi", "state"),
			"--host-nqn-file", filepath.Join(e.Dir, "csi", "no-hostnqn"), "--wait-timeout", "60s",
			"--metrics-address", fmt.Sprintf("127.0.0.1:%d", mport), "-v", "2",
			"--registration-dir=", "--health-address="}, // the stand-in kubelet calls the socket directly
		Ready: controlplane.SocketReady(e.CSISocket),
	})
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("pid %d, socket %s", p.PID(), e.CSISocket), nil
}

func (e *Env) startSidecars(ctx context.Context) (string, error) {
	var lines []string
	for _, sc := range []struct {
		bin  string
		args []string
		env  []string
	}{
		// Outside a pod: no owner for CSIStorageCapacity objects (DESIGN.md "Tests without a kubelet").
		{controlplane.BinCSIProvisioner, []string{"--feature-gates=Topology=true", "--extra-create-metadata", "--enable-capacity",
			"--capacity-ownerref-level=-1", "--capacity-poll-interval=5s"}, []string{"NAMESPACE=" + ControllerNamespace}},
		{controlplane.BinCSIAttacher, nil, nil},
		{controlplane.BinCSIResizer, nil, nil},
	} {
		args := append([]string{"--csi-address=" + e.CSISocket, "--kubeconfig=" + e.Kubeconfig, "--leader-election=false", "--timeout=60s", "--v=2",
			"--kube-api-qps=50", "--kube-api-burst=100"}, sc.args...)
		p, err := e.start(ctx, controlplane.ProcessSpec{Name: sc.bin, Binary: sc.bin, Args: args, Env: sc.env})
		if err != nil {
			return "", err
		}
		lines = append(lines, fmt.Sprintf("%s pid %d", sc.bin, p.PID()))
	}
	// A sidecar that cannot talk to the driver exits at once: give them a moment, then check.
	time.Sleep(time.Second)
	if err := e.CP.Dead(); err != nil {
		return "", err
	}
	return strings.Join(lines, ", "), nil
}

// LogTails returns the last n lines of each process's log, by name.
func (e *Env) LogTails(n int) map[string]string {
	if e.CP == nil {
		return nil
	}
	return e.CP.LogTails(n)
}

// Down stops every process Up started (by PID, newest first), unmounts what
// the kubelet stand-in mounted and detaches the loop devices of the volumes.
// The work directory stays for reading logs.
func (e *Env) Down() error {
	var errs []error
	if e.git != nil {
		e.git.close()
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
	return errors.Join(errs...)
}

// DownDir stops what a `plinth dev up` recorded in <dir>/pids (the parent
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

// checkNotRunning refuses to start over a live `plinth dev up` in dir.
func checkNotRunning(dir string) error {
	data, err := os.ReadFile(filepath.Join(dir, "pids"))
	if err != nil {
		return nil
	}
	f := strings.Fields(strings.SplitN(string(data), "\n", 2)[0])
	if len(f) == 2 && f[0] == "plinth-dev" {
		if pid, err := strconv.Atoi(f[1]); err == nil && syscall.Kill(pid, 0) == nil {
			return fmt.Errorf("plinth dev is already running in %s (pid %d): run `plinth dev down` first", dir, pid)
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
