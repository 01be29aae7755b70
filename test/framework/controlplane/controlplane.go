package controlplane

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/plinth-storage/plinth/test/framework/cluster"
)

// Options configure Start. The zero value starts etcd and kube-apiserver.
type Options struct {
	// Dir holds certificates, kubeconfigs, etcd data and logs; empty means a
	// new temporary folder that Stop removes (unless KeepDir).
	Dir string
	// KeepDir keeps a temporary Dir after Stop (for reading logs).
	KeepDir bool
	// BinDir overrides TestBinDir().
	BinDir string
	// APIServerPort asks for a port; 0 picks a free one.
	APIServerPort int
	// APIServerArgs are extra kube-apiserver flags ("--name=value"), appended
	// after the defaults (a later flag wins).
	APIServerArgs []string
	// ExtraSANs are more IPs or DNS names for the serving certificate (it
	// always names 127.0.0.1, GuestHostIP, 10.0.0.1, localhost and kubernetes.default.svc...).
	ExtraSANs []string
	// Users get a client certificate and kubeconfig at start (more: AddUser).
	Users []User
	// ControllerManager starts kube-controller-manager with Controllers.
	ControllerManager bool
	// Controllers for kube-controller-manager; nil means DefaultControllers.
	Controllers []string
	// ControllerManagerArgs are extra kube-controller-manager flags.
	ControllerManagerArgs []string
	// StartTimeout bounds each process's start-up (default 60 s; a cold
	// machine under load needs more than the ~3 s of a warm one).
	StartTimeout time.Duration
	// Nodes sets the control plane up for real kubelets (test/framework/cluster,
	// see ClusterOptions) and for pods that call the API server:
	//   - kube-apiserver listens on every address and advertises NodeIP (the
	//     host's own address, cluster.HostIP, unless AdvertiseAddress), so the
	//     `kubernetes` Service's endpoint is reachable from a pod's network
	//     namespace; the endpoint reconciler is the default lease one;
	//   - authorization Node,RBAC and the NodeRestriction, ServiceAccount and
	//     TaintNodesByCondition admission plugins, as in a real cluster;
	//   - a client certificate for reaching kubelets (kubectl logs/exec) and
	//     --kubelet-preferred-address-types=InternalIP (node names do not resolve);
	//   - kube-controller-manager with every default controller ("*":
	//     serviceaccount(-token), root-ca-cert-publisher, daemonset,
	//     deployment, replicaset, statefulset, endpoint(slice), node-lifecycle,
	//     attachdetach, garbage collector, PV controllers...) unless
	//     Controllers says otherwise.
	// Today's tests leave it false and run unchanged.
	Nodes bool
	// AdvertiseAddress overrides the host address Nodes advertises.
	AdvertiseAddress string
	// Scheduler starts the cluster's own kube-scheduler (default-scheduler:
	// DaemonSet, Deployment and other pods that name no scheduler), played
	// by the plinth-scheduler binary with only the stock default profile
	// (PlinthCapacity registered but not enabled), as the system:kube-scheduler
	// user of the RBAC bootstrap policy.
	Scheduler bool
}

// DefaultControllers are the kube-controller-manager controllers Plinth's
// tests need: PV binding and expansion, PV/PVC protection (the
// StorageObjectInUseProtection admission plugin adds finalizers that only
// these remove), garbage collection, namespace deletion, default
// ServiceAccounts. Not included: persistentvolume-attach-detach-controller
// (it needs the annotation kubelet puts on Nodes; a test that stands in for
// kubelet adds it and this controller through Options.Controllers).
var DefaultControllers = []string{
	"persistentvolume-binder-controller",
	"persistentvolume-expander-controller",
	"persistentvolume-protection-controller",
	"persistentvolumeclaim-protection-controller",
	"garbage-collector-controller",
	"namespace-controller",
	"serviceaccount-controller",
}

// User is an identity with a client certificate: Name is the user name (the
// certificate's CN), Groups its groups (O), e.g. "system:masters".
type User struct {
	Name   string
	Groups []string
}

// Credentials are a user's kubeconfig file and REST config.
type Credentials struct {
	User
	Kubeconfig string
	Config     *rest.Config
}

// ControlPlane is a running etcd + kube-apiserver (+ controllers and extra
// processes). Its fields are read-only.
type ControlPlane struct {
	// Dir is the working folder (see Options.Dir).
	Dir string
	// URL of the API server, https://127.0.0.1:<port>.
	URL string
	// EtcdURL is etcd's client URL.
	EtcdURL string
	// CAFile is the PEM CA that signed the serving and client certificates.
	CAFile string
	// Admin is a system:masters user ("admin").
	Admin *Credentials
	// StartDuration is Start → kube-apiserver /readyz ok (controllers excluded).
	StartDuration time.Duration
	// NodeIP is the non-loopback address the API server advertises with
	// Options.Nodes (empty otherwise).
	NodeIP string

	opts   Options
	binDir string
	logDir string
	ca     *ca
	tmpDir bool

	mu      sync.Mutex
	procs   []*Process
	users   map[string]*Credentials
	stopped bool
}

const adminUser = "admin"

// Start brings up etcd and kube-apiserver and waits for /readyz, then the
// controller manager when asked. ctx bounds start-up only: the processes run
// until Stop. On error nothing it started is left running.
func Start(ctx context.Context, opts Options) (*ControlPlane, error) {
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		var cp *ControlPlane
		cp, err = start(ctx, opts)
		if err == nil {
			return cp, nil
		}
		// A port picked free can be taken by a neighbour before our process binds it.
		if !addrInUse(err) || opts.APIServerPort != 0 && strings.Contains(err.Error(), "kube-apiserver") {
			break
		}
	}
	return nil, err
}

func start(ctx context.Context, opts Options) (_ *ControlPlane, err error) {
	cp := &ControlPlane{opts: opts, users: map[string]*Credentials{}}
	if cp.binDir = opts.BinDir; cp.binDir == "" {
		if cp.binDir, err = TestBinDir(); err != nil {
			return nil, err
		}
	}
	if opts.Nodes {
		opts.ControllerManager = true
		if opts.Controllers == nil {
			opts.Controllers = []string{"*"}
		}
		if cp.NodeIP = opts.AdvertiseAddress; cp.NodeIP == "" {
			if cp.NodeIP, err = cluster.HostIP(); err != nil {
				return nil, err
			}
		}
		opts.ExtraSANs = append(append([]string(nil), opts.ExtraSANs...), cp.NodeIP)
		cp.opts = opts
	}
	// Every binary and its version first: fail before starting anything.
	if err := checkBinaries(cp.binDir, opts); err != nil {
		return nil, err
	}
	if opts.APIServerPort != 0 {
		if err := checkPortFree(BinKubeAPIServer, opts.APIServerPort); err != nil {
			return nil, err
		}
	}

	if cp.Dir = opts.Dir; cp.Dir == "" {
		if cp.Dir, err = os.MkdirTemp("", "plinth-controlplane-"); err != nil {
			return nil, err
		}
		cp.tmpDir = true
	}
	defer func() {
		if err != nil {
			_ = cp.Stop()
		}
	}()
	cp.logDir = filepath.Join(cp.Dir, "logs")
	for _, d := range []string{cp.logDir, filepath.Join(cp.Dir, "pki"), filepath.Join(cp.Dir, "kubeconfig")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	timeout := opts.StartTimeout
	if timeout == 0 {
		timeout = 60 * time.Second
	}
	t0 := time.Now()

	pki, err := cp.writePKI()
	if err != nil {
		return nil, fmt.Errorf("certificates: %w", err)
	}

	if err := cp.startEtcd(ctx, timeout); err != nil {
		return nil, err
	}
	if err := cp.startAPIServer(ctx, pki, timeout); err != nil {
		return nil, err
	}
	cp.StartDuration = time.Since(t0)

	if opts.ControllerManager {
		if err := cp.startControllerManager(ctx, pki, timeout); err != nil {
			return nil, err
		}
	}
	if opts.Scheduler {
		if err := cp.startScheduler(ctx, timeout); err != nil {
			return nil, err
		}
	}
	return cp, nil
}

// checkBinaries finds every binary start needs in binDir and checks its version against
// the pins (test/tools/versions.env): it fails before anything starts.
func checkBinaries(binDir string, opts Options) error {
	need := []string{BinEtcd, BinKubeAPIServer}
	if opts.Scheduler {
		need = append(need, BinPlinthScheduler)
	}
	if opts.ControllerManager {
		need = append(need, BinKubeControllerManager)
	}
	pins := PinnedVersions()
	want := map[string]string{
		BinEtcd:                  strings.TrimPrefix(pins["ETCD_VERSION"], "v"),
		BinKubeAPIServer:         pins["KUBERNETES_VERSION"],
		BinKubeControllerManager: pins["KUBERNETES_VERSION"],
	}
	for _, name := range need {
		path, err := BinaryPath(binDir, name)
		if err != nil {
			return err
		}
		if err := checkVersion(name, path, want[name]); err != nil {
			return err
		}
	}
	return nil
}

// startEtcd starts etcd on two free loopback ports (client, peer) with its data in cp.Dir
// and waits for /health; it sets cp.EtcdURL.
func (cp *ControlPlane) startEtcd(ctx context.Context, timeout time.Duration) error {
	cport, err := FreePort()
	if err != nil {
		return err
	}
	pport, err := FreePort()
	if err != nil {
		return err
	}
	cp.EtcdURL = fmt.Sprintf("http://127.0.0.1:%d", cport)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", pport)
	if _, err := cp.StartProcess(ctx, ProcessSpec{
		Name:   BinEtcd,
		Binary: BinEtcd,
		Args: []string{
			"--name=default", "--data-dir=" + filepath.Join(cp.Dir, "etcd"),
			"--listen-client-urls=" + cp.EtcdURL, "--advertise-client-urls=" + cp.EtcdURL,
			"--listen-peer-urls=" + peerURL, "--initial-advertise-peer-urls=" + peerURL,
			"--initial-cluster=default=" + peerURL,
			"--unsafe-no-fsync", // test data: durability is not wanted, speed is
			"--log-level=warn",
		},
		Ready:        HTTPReady(cp.EtcdURL+"/health", nil),
		ReadyTimeout: timeout,
	}); err != nil {
		return err
	}

	return nil
}

// startAPIServer starts kube-apiserver on opts.APIServerPort (a free port when 0) against
// cp's etcd, with the node flags when opts.Nodes, and waits for /readyz as the admin; it
// sets cp.URL.
func (cp *ControlPlane) startAPIServer(ctx context.Context, pki map[string]string, timeout time.Duration) error {
	opts := cp.opts
	port := opts.APIServerPort
	if port == 0 {
		var err error
		if port, err = FreePort(); err != nil {
			return err
		}
	}
	cp.URL = fmt.Sprintf("https://127.0.0.1:%d", port)
	args := []string{
		"--etcd-servers=" + cp.EtcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--endpoint-reconciler-type=none", // a loopback advertise address needs it
		fmt.Sprintf("--secure-port=%d", port),
		"--tls-cert-file=" + pki["apiserver.crt"],
		"--tls-private-key-file=" + pki["apiserver.key"],
		"--client-ca-file=" + cp.CAFile,
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + pki["sa.pub"],
		"--service-account-signing-key-file=" + pki["sa.key"],
		"--service-cluster-ip-range=10.0.0.0/24",
		"--allow-privileged=true",
		// No kubelet runs: nothing would create the default ServiceAccount in
		// time for pods, nor lift the not-ready taint TaintNodesByCondition puts
		// on the Nodes tests create.
		"--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
	}
	if opts.Nodes {
		kc, err := cp.issueKubeletClient()
		if err != nil {
			return err
		}
		args = nodeArgs(args, cp.NodeIP, kc)
	}
	args = append(args, opts.APIServerArgs...)
	adminTLS, err := cp.tlsConfig(cp.Admin)
	if err != nil {
		return err
	}
	if _, err := cp.StartProcess(ctx, ProcessSpec{
		Name:         BinKubeAPIServer,
		Binary:       BinKubeAPIServer,
		Args:         args,
		Ready:        HTTPReady(cp.URL+"/readyz", adminTLS),
		ReadyTimeout: timeout,
	}); err != nil {
		return err
	}
	return nil
}

// nodeArgs turns the kube-apiserver flags of a control plane without kubelets
// into those of one with real nodes (Options.Nodes).
func nodeArgs(args []string, nodeIP string, kubeletClient [2]string) []string {
	var out []string
	for _, a := range args {
		switch {
		case strings.HasPrefix(a, "--bind-address="):
			a = "--bind-address=0.0.0.0"
		case strings.HasPrefix(a, "--advertise-address="):
			a = "--advertise-address=" + nodeIP
		case strings.HasPrefix(a, "--endpoint-reconciler-type="):
			continue
		case strings.HasPrefix(a, "--authorization-mode="):
			a = "--authorization-mode=Node,RBAC"
		case strings.HasPrefix(a, "--disable-admission-plugins="):
			a = "--enable-admission-plugins=NodeRestriction"
		}
		out = append(out, a)
	}
	return append(out,
		"--kubelet-client-certificate="+kubeletClient[0],
		"--kubelet-client-key="+kubeletClient[1],
		"--kubelet-preferred-address-types=InternalIP,Hostname",
	)
}

// issueKubeletClient writes the client certificate the API server presents
// to kubelets (system:masters, so kubelet's webhook authorization allows
// logs, exec and port-forward) and returns its certificate and key paths.
func (cp *ControlPlane) issueKubeletClient() ([2]string, error) {
	kp, err := cp.ca.issue("kube-apiserver-kubelet-client", []string{"system:masters"}, nil, nil, false)
	if err != nil {
		return [2]string{}, err
	}
	crt := filepath.Join(cp.Dir, "pki", "apiserver-kubelet-client.crt")
	key := filepath.Join(cp.Dir, "pki", "apiserver-kubelet-client.key")
	return [2]string{crt, key}, writeFiles(map[string][]byte{crt: kp.certPEM, key: kp.keyPEM})
}

// NodeKubeconfig returns the kubeconfig of node's kubelet: user
// system:node:<node> in group system:nodes, which the Node authorizer and
// the NodeRestriction admission plugin know (cluster.Options.NodeKubeconfig).
func (cp *ControlPlane) NodeKubeconfig(node string) (string, error) {
	c, err := cp.AddUser(User{Name: "system:node:" + node, Groups: []string{"system:nodes"}})
	if err != nil {
		return "", err
	}
	return c.Kubeconfig, nil
}

// ClusterOptions returns test/framework/cluster options for this control plane
// (started with Options.Nodes): API server, CA, admin, node and kube-proxy
// credentials, kubelet and kube-proxy from the test bin folder, the node IP.
// The caller adds Nodes, Labels and Images (the sandbox image at least).
func (cp *ControlPlane) ClusterOptions() (cluster.Options, error) {
	if !cp.opts.Nodes {
		return cluster.Options{}, errors.New("control plane was not started with Options.Nodes")
	}
	kubelet, err := BinaryPath(cp.binDir, BinKubelet)
	if err != nil {
		return cluster.Options{}, err
	}
	proxy, err := BinaryPath(cp.binDir, BinKubeProxy)
	if err != nil {
		return cluster.Options{}, err
	}
	kp, err := cp.AddUser(User{Name: "system:kube-proxy"})
	if err != nil {
		return cluster.Options{}, err
	}
	return cluster.Options{
		APIServer: cp.URL, CAFile: cp.CAFile, Admin: cp.Admin.Config,
		NodeKubeconfig: cp.NodeKubeconfig, KubeProxyKubeconfig: kp.Kubeconfig,
		NodeIP: cp.NodeIP, Kubelet: kubelet, KubeProxy: proxy,
	}, nil
}

// writePKI makes the CA, the serving certificate, the service-account key
// pair and the admin and Options.Users credentials; it returns file paths.
func (cp *ControlPlane) writePKI() (map[string]string, error) {
	c, err := newCA("plinth-test-ca")
	if err != nil {
		return nil, err
	}
	cp.ca = c
	dir := filepath.Join(cp.Dir, "pki")
	ips := []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP(GuestHostIP), net.ParseIP(serviceIP)}
	dns := []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}
	for _, s := range cp.opts.ExtraSANs {
		if ip := net.ParseIP(s); ip != nil {
			ips = append(ips, ip)
		} else {
			dns = append(dns, s)
		}
	}
	serving, err := c.issue("kube-apiserver", nil, dns, ips, true)
	if err != nil {
		return nil, err
	}
	saKey, saPub, err := newServiceAccountKey()
	if err != nil {
		return nil, err
	}
	paths := map[string]string{}
	files := map[string][]byte{}
	for name, data := range map[string][]byte{
		"ca.crt": c.certPEM, "apiserver.crt": serving.certPEM, "apiserver.key": serving.keyPEM,
		"sa.key": saKey, "sa.pub": saPub,
	} {
		paths[name] = filepath.Join(dir, name)
		files[paths[name]] = data
	}
	if err := writeFiles(files); err != nil {
		return nil, err
	}
	cp.CAFile = paths["ca.crt"]
	if cp.Admin, err = cp.AddUser(User{Name: adminUser, Groups: []string{"system:masters"}}); err != nil {
		return nil, err
	}
	for _, u := range cp.opts.Users {
		if _, err := cp.AddUser(u); err != nil {
			return nil, err
		}
	}
	return paths, nil
}

var unsafeName = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// AddUser issues a client certificate for u and writes its kubeconfig to
// <Dir>/kubeconfig/<name>.kubeconfig. Adding a name twice returns the first.
func (cp *ControlPlane) AddUser(u User) (*Credentials, error) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if c, ok := cp.users[u.Name]; ok {
		return c, nil
	}
	kp, err := cp.ca.issue(u.Name, u.Groups, nil, nil, false)
	if err != nil {
		return nil, err
	}
	server := cp.URL
	if server == "" {
		server = "https://127.0.0.1" // filled in by Kubeconfig writing below once known
	}
	creds := &Credentials{
		User:       u,
		Kubeconfig: filepath.Join(cp.Dir, "kubeconfig", unsafeName.ReplaceAllString(u.Name, "_")+".kubeconfig"),
		Config: &rest.Config{
			Host: server,
			TLSClientConfig: rest.TLSClientConfig{
				CAData: cp.ca.certPEM, CertData: kp.certPEM, KeyData: kp.keyPEM,
			},
			QPS: 100, Burst: 200,
		},
	}
	cp.users[u.Name] = creds
	if cp.URL != "" {
		return creds, writeKubeconfig(creds)
	}
	return creds, nil
}

// Kubeconfig returns the kubeconfig path of a user added with AddUser or Options.Users.
func (cp *ControlPlane) Kubeconfig(name string) (string, error) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	c, ok := cp.users[name]
	if !ok {
		return "", fmt.Errorf("no user %q in this control plane", name)
	}
	return c.Kubeconfig, nil
}

// KubeconfigFor returns kubeconfig bytes for a user added before, with the
// server URL replaced by server (e.g. https://10.0.2.100:<port> for a guest).
func (cp *ControlPlane) KubeconfigFor(name, server string) ([]byte, error) {
	cp.mu.Lock()
	c, ok := cp.users[name]
	cp.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("no user %q in this control plane", name)
	}
	cfg := rest.CopyConfig(c.Config)
	cfg.Host = server
	return clientcmd.Write(*kubeconfigOf(c.Name, cfg))
}

func kubeconfigOf(user string, cfg *rest.Config) *clientcmdapi.Config {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["plinth-test"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData}
	kc.Contexts["plinth-test"] = &clientcmdapi.Context{Cluster: "plinth-test", AuthInfo: user}
	kc.CurrentContext = "plinth-test"
	return kc
}

func writeKubeconfig(c *Credentials) error {
	return clientcmd.WriteToFile(*kubeconfigOf(c.Name, c.Config), c.Kubeconfig)
}

// tlsConfig is the client TLS of creds (for health probes with a real CA check).
func (cp *ControlPlane) tlsConfig(creds *Credentials) (*tls.Config, error) {
	cert, err := tls.X509KeyPair(creds.Config.CertData, creds.Config.KeyData)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(cp.ca.certPEM)
	return &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}

// setServer points every credential made before the API server port was
// known at cp.URL and writes the kubeconfigs.
func (cp *ControlPlane) setServer() error {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	for _, c := range cp.users {
		c.Config.Host = cp.URL
		if err := writeKubeconfig(c); err != nil {
			return err
		}
	}
	return nil
}

func (cp *ControlPlane) startControllerManager(ctx context.Context, pki map[string]string, timeout time.Duration) error {
	// The identity the RBAC bootstrap policy knows; with
	// --use-service-account-credentials each controller then runs as its own
	// kube-system ServiceAccount with its bootstrap role, as in a real cluster.
	kcm, err := cp.AddUser(User{Name: "system:kube-controller-manager"})
	if err != nil {
		return err
	}
	port, err := FreePort()
	if err != nil {
		return err
	}
	controllers := cp.opts.Controllers
	if controllers == nil {
		controllers = DefaultControllers
	}
	args := []string{
		"--kubeconfig=" + kcm.Kubeconfig,
		"--authentication-kubeconfig=" + kcm.Kubeconfig,
		"--authorization-kubeconfig=" + kcm.Kubeconfig,
		"--bind-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", port),
		"--leader-elect=false",
		"--use-service-account-credentials=true",
		"--controllers=" + strings.Join(controllers, ","),
		"--service-account-private-key-file=" + pki["sa.key"],
		"--root-ca-file=" + cp.CAFile,
		"--cert-dir=" + filepath.Join(cp.Dir, "kcm-certs"),
	}
	args = append(args, cp.opts.ControllerManagerArgs...)
	_, err = cp.StartProcess(ctx, ProcessSpec{
		Name:         BinKubeControllerManager,
		Binary:       BinKubeControllerManager,
		Args:         args,
		Ready:        HTTPReady(fmt.Sprintf("https://127.0.0.1:%d/healthz", port), nil),
		ReadyTimeout: timeout,
	})
	return err
}

// schedulerConfig is the KubeSchedulerConfiguration of the cluster's own
// kube-scheduler: one default-scheduler profile, no leader election.
const schedulerConfig = `apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection: {kubeconfig: %q}
leaderElection: {leaderElect: false}
profiles:
- schedulerName: default-scheduler
`

func (cp *ControlPlane) startScheduler(ctx context.Context, timeout time.Duration) error {
	ks, err := cp.AddUser(User{Name: "system:kube-scheduler"})
	if err != nil {
		return err
	}
	port, err := FreePort()
	if err != nil {
		return err
	}
	cfg := filepath.Join(cp.Dir, "kube-scheduler.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(schedulerConfig, ks.Kubeconfig)), 0o600); err != nil {
		return err
	}
	_, err = cp.StartProcess(ctx, ProcessSpec{
		Name:   "kube-scheduler",
		Binary: BinPlinthScheduler,
		Args: []string{"--config=" + cfg, "--authentication-kubeconfig=" + ks.Kubeconfig, "--authorization-kubeconfig=" + ks.Kubeconfig,
			"--bind-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", port)},
		Ready:        HTTPReady(fmt.Sprintf("https://127.0.0.1:%d/healthz", port), nil),
		ReadyTimeout: timeout,
	})
	return err
}

// StartProcess starts a process owned by the control plane (Stop ends it) and
// waits for spec.Ready. Its log is <Dir>/logs/<Name>.log.
func (cp *ControlPlane) StartProcess(ctx context.Context, spec ProcessSpec) (*Process, error) {
	if spec.Name == "" {
		spec.Name = filepath.Base(spec.Binary)
	}
	cp.mu.Lock()
	if cp.stopped {
		cp.mu.Unlock()
		return nil, errors.New("control plane is stopped")
	}
	cp.mu.Unlock()
	if spec.Name == BinKubeAPIServer {
		// From here on kubeconfigs know the API server's URL.
		if err := cp.setServer(); err != nil {
			return nil, err
		}
	}
	p, err := startProcess(ctx, cp.binDir, cp.logDir, spec)
	if err != nil {
		return nil, err
	}
	cp.mu.Lock()
	cp.procs = append(cp.procs, p)
	cp.mu.Unlock()
	return p, nil
}

// Processes returns the processes started so far, in start order.
func (cp *ControlPlane) Processes() []*Process {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return append([]*Process(nil), cp.procs...)
}

// PIDs returns the process ids of everything started, in start order.
func (cp *ControlPlane) PIDs() []int {
	var pids []int
	for _, p := range cp.Processes() {
		pids = append(pids, p.PID())
	}
	return pids
}

// LogTails returns the last n lines of every process's log, by process name.
func (cp *ControlPlane) LogTails(n int) map[string]string {
	out := map[string]string{}
	for _, p := range cp.Processes() {
		out[p.Name] = p.Tail(n)
	}
	return out
}

// Dead returns an error naming every process that exited before Stop, with
// the tail of its log; nil when all are running.
func (cp *ControlPlane) Dead() error {
	var errs []error
	for _, p := range cp.Processes() {
		if p.Exited() {
			errs = append(errs, p.Failure(fmt.Sprintf("(pid %d) exited: %v", p.PID(), p.Err())))
		}
	}
	return errors.Join(errs...)
}

// KeepDir makes Stop keep a temporary Dir (one Start created) for reading
// its logs; it reports whether Dir is such a folder.
func (cp *ControlPlane) KeepDir() bool {
	if cp.tmpDir {
		cp.opts.KeepDir = true
	}
	return cp.tmpDir
}

// Stop ends every process the control plane started, newest first, by PID
// (SIGTERM, then SIGKILL after 5 s), and removes a temporary Dir unless
// KeepDir. Calling it again does nothing.
func (cp *ControlPlane) Stop() error {
	cp.mu.Lock()
	if cp.stopped {
		cp.mu.Unlock()
		return nil
	}
	cp.stopped = true
	procs := append([]*Process(nil), cp.procs...)
	cp.mu.Unlock()
	var errs []error
	for i := len(procs) - 1; i >= 0; i-- {
		if err := procs[i].StopWithin(5 * time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	if cp.tmpDir && !cp.opts.KeepDir && len(errs) == 0 {
		if err := os.RemoveAll(cp.Dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// String lists the processes for logs: "etcd(pid 12) kube-apiserver(pid 13)".
func (cp *ControlPlane) String() string {
	var parts []string
	for _, p := range cp.Processes() {
		parts = append(parts, fmt.Sprintf("%s(pid %d)", p.Name, p.PID()))
	}
	return cp.URL + " " + strings.Join(parts, " ")
}
