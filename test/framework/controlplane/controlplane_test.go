package controlplane_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/plinth-storage/plinth/test/framework/controlplane"
)

// assertGone fails t when any pid is still a live process (pgrep by the PIDs
// the control plane started).
func assertGone(t *testing.T, pids []int) {
	t.Helper()
	for _, pid := range pids {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("pid %d still exists after Stop (kill -0: %v)", pid, err)
		}
	}
	if len(pids) == 0 {
		return
	}
	var list []string
	for _, pid := range pids {
		list = append(list, strconv.Itoa(pid))
	}
	out, err := exec.Command("ps", "-o", "pid=,comm=", "-p", strings.Join(list, ",")).Output()
	if err == nil && len(strings.TrimSpace(string(out))) > 0 {
		t.Errorf("processes still running after Stop:\n%s", out)
	}
}

// assertNoProcessUnder fails t when a process whose command line names dir
// still runs (pgrep -f dir).
func assertNoProcessUnder(t *testing.T, dir string) {
	t.Helper()
	out, err := exec.Command("pgrep", "-a", "-f", dir).Output()
	if err == nil {
		t.Errorf("processes of %s still running:\n%s", dir, out)
	}
}

func TestStartStop(t *testing.T) {
	controlplane.RequireBinaries(t, controlplane.BinEtcd, controlplane.BinKubeAPIServer)
	ctx := t.Context()
	cp, err := controlplane.Start(ctx, controlplane.Options{
		Users: []controlplane.User{{Name: "plinth-controller"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	pids := cp.PIDs()
	defer func() {
		if err := cp.Stop(); err != nil {
			t.Errorf("Stop: %v", err)
		}
		assertGone(t, pids)
	}()
	t.Logf("Start → /readyz: %s (%s)", cp.StartDuration.Round(time.Millisecond), cp)

	cs, _ := clients(t, cp.Admin)
	v, err := cs.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	if want := controlplane.PinnedVersions()["KUBERNETES_VERSION"]; v.GitVersion != want {
		t.Errorf("server version %s, want %s", v.GitVersion, want)
	}
	if _, err := cs.CoreV1().Namespaces().List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("admin lists namespaces: %v", err)
	}

	// RBAC is on: a user without bindings is authenticated but forbidden.
	u, err := cp.Kubeconfig("plinth-controller")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(u); err != nil {
		t.Fatal(err)
	}
	creds, _ := cp.AddUser(controlplane.User{Name: "plinth-controller"})
	ucs, _ := clients(t, creds)
	if _, err := ucs.CoreV1().Namespaces().List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("user without RBAC bindings: want Forbidden, got %v", err)
	}

	// Service-account tokens are signed with the generated key and accepted.
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "tester", Namespace: "default"}}
	if _, err := cs.CoreV1().ServiceAccounts("default").Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tok, err := cs.CoreV1().ServiceAccounts("default").CreateToken(ctx, "tester", &authnv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	saCfg := rest.AnonymousClientConfig(cp.Admin.Config)
	saCfg.BearerToken = tok.Status.Token
	sacs, err := kubernetes.NewForConfig(saCfg)
	if err != nil {
		t.Fatal(err)
	}
	who, err := sacs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authnv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := who.Status.UserInfo.Username; got != "system:serviceaccount:default:tester" {
		t.Errorf("token of ServiceAccount tester authenticates as %q", got)
	}

	// The serving certificate names the qemu guest's view of the host.
	host := strings.TrimPrefix(cp.URL, "https://")
	conn, err := tls.Dial("tcp", host, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // reading the served cert
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var names []string
	for _, ip := range conn.ConnectionState().PeerCertificates[0].IPAddresses {
		names = append(names, ip.String())
	}
	if !strings.Contains(strings.Join(names, " "), controlplane.GuestHostIP) {
		t.Errorf("serving certificate IPs %v lack %s", names, controlplane.GuestHostIP)
	}
}

func TestTwoSideBySide(t *testing.T) {
	controlplane.RequireBinaries(t, controlplane.BinEtcd, controlplane.BinKubeAPIServer)
	var wg sync.WaitGroup
	cps := make([]*controlplane.ControlPlane, 2)
	errs := make([]error, 2)
	for i := range cps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cps[i], errs[i] = controlplane.Start(t.Context(), controlplane.Options{})
		}()
	}
	wg.Wait()
	var pids []int
	for i, cp := range cps {
		if errs[i] != nil {
			t.Errorf("control plane %d: %v", i, errs[i])
			continue
		}
		pids = append(pids, cp.PIDs()...)
		defer cp.Stop()
	}
	if t.Failed() {
		return
	}
	if cps[0].URL == cps[1].URL {
		t.Fatalf("both control planes on %s", cps[0].URL)
	}
	for i, cp := range cps {
		cs, _ := clients(t, cp.Admin)
		name := "only-in-" + strconv.Itoa(i)
		if _, err := cs.CoreV1().Namespaces().Create(t.Context(), namespace(name), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// Each has its own etcd: a namespace made in one is absent in the other.
	cs1, _ := clients(t, cps[1].Admin)
	if _, err := cs1.CoreV1().Namespaces().Get(t.Context(), "only-in-0", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("namespace of control plane 0 seen in 1: %v", err)
	}
	for _, cp := range cps {
		if err := cp.Stop(); err != nil {
			t.Error(err)
		}
	}
	assertGone(t, pids)
}

func TestMissingBinary(t *testing.T) {
	dir := t.TempDir()
	_, err := controlplane.Start(t.Context(), controlplane.Options{BinDir: dir, Dir: filepath.Join(dir, "cp")})
	if !controlplane.IsMissingBinary(err) {
		t.Fatalf("want a missing-binary error, got %v", err)
	}
	if !strings.Contains(err.Error(), "etcd") || !strings.Contains(err.Error(), "make testbin") {
		t.Errorf("error should name the binary and the remedy: %v", err)
	}
	if _, statErr := os.Stat(filepath.Join(dir, "cp")); statErr == nil {
		t.Errorf("nothing should be created before the binaries are found")
	}
}

func TestProcessDiesDuringStartup(t *testing.T) {
	controlplane.RequireBinaries(t, controlplane.BinEtcd, controlplane.BinKubeAPIServer)
	dir := t.TempDir()
	_, err := controlplane.Start(t.Context(), controlplane.Options{
		Dir:           dir,
		APIServerArgs: []string{"--no-such-flag=1"},
	})
	if err == nil {
		t.Fatal("Start with a bad kube-apiserver flag succeeded")
	}
	t.Logf("error: %v", err)
	var pe *controlplane.ProcessError
	if !errors.As(err, &pe) || pe.Name != controlplane.BinKubeAPIServer {
		t.Fatalf("want a ProcessError naming kube-apiserver, got %T %v", err, err)
	}
	if !strings.Contains(err.Error(), "no-such-flag") {
		t.Errorf("error should carry the log tail naming the bad flag: %v", err)
	}
	assertNoProcessUnder(t, dir) // etcd, started first, is gone too
}

func TestPortTaken(t *testing.T) {
	controlplane.RequireBinaries(t, controlplane.BinEtcd, controlplane.BinKubeAPIServer)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	dir := t.TempDir()
	_, err = controlplane.Start(t.Context(), controlplane.Options{Dir: dir, APIServerPort: port})
	if err == nil || !strings.Contains(err.Error(), "kube-apiserver") || !strings.Contains(err.Error(), strconv.Itoa(port)) {
		t.Fatalf("want an error naming kube-apiserver and port %d, got %v", port, err)
	}
	assertNoProcessUnder(t, dir)
}

func TestExtraProcessLogsAndStop(t *testing.T) {
	controlplane.RequireBinaries(t, controlplane.BinEtcd, controlplane.BinKubeAPIServer)
	cp := controlplane.ForTest(t, controlplane.Options{})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	// An extra process that dies in start-up: the error names it with its log.
	_, err := cp.StartProcess(ctx, controlplane.ProcessSpec{
		Name:   "kubectl-bad",
		Binary: controlplane.BinKubectl,
		Args:   []string{"--definitely-not-a-flag"},
		Ready:  func(context.Context) error { return errors.New("never ready") },
	})
	var pe *controlplane.ProcessError
	if !errors.As(err, &pe) || pe.Name != "kubectl-bad" || !strings.Contains(pe.Tail, "definitely-not-a-flag") {
		t.Fatalf("want a ProcessError for kubectl-bad with its log, got %v", err)
	}
	// A long-running one is ended by Stop.
	kc, _ := cp.Kubeconfig("admin")
	p, err := cp.StartProcess(ctx, controlplane.ProcessSpec{
		Name:   "kubectl-watch",
		Binary: controlplane.BinKubectl,
		Args:   []string{"--kubeconfig=" + kc, "get", "namespaces", "--watch"},
	})
	if err != nil {
		t.Fatal(err)
	}
	pids := cp.PIDs()
	if err := cp.Stop(); err != nil {
		t.Fatal(err)
	}
	if !p.Exited() {
		t.Error("kubectl-watch still running after Stop")
	}
	assertGone(t, pids)
}

func namespace(name string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
}
