package policy_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/plinth-storage/plinth/controllers/policy"
	"github.com/plinth-storage/plinth/test/framework/controlplane"
	"github.com/plinth-storage/plinth/test/prereq"
)

// The suite runs one real etcd + kube-apiserver (test/framework/controlplane, built by make testbin)
// for all tests, started in TestMain, with Plinth's CRDs installed; each test that needs the
// controller starts a manager with startController and stops it at its end.
var suite struct {
	cp      *controlplane.ControlPlane
	c       client.Client
	skip    error // missing binaries
	startUp error
}

const namespace = "plinth-system"

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	for _, n := range []string{controlplane.BinEtcd, controlplane.BinKubeAPIServer} {
		if _, err := controlplane.BinaryPath("", n); err != nil {
			suite.skip = err
		}
	}
	if suite.skip == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		cp, err := controlplane.Start(ctx, controlplane.Options{})
		cancel()
		if err != nil {
			suite.startUp = err
		} else {
			suite.cp = cp
			defer func() {
				if err := cp.Stop(); err != nil {
					fmt.Fprintf(os.Stderr, "stop control plane: %v\n", err)
				}
			}()
			suite.startUp = setUp(cp)
		}
	}
	return m.Run()
}

func setUp(cp *controlplane.ControlPlane) error {
	c, err := prepare(cp)
	suite.c = c
	return err
}

// prepare installs Plinth's CRDs (and testdata/crds) on cp, creates the controller's
// namespace and returns an admin client with the policy scheme.
func prepare(cp *controlplane.ControlPlane) (client.Client, error) {
	root, err := controlplane.ModuleRoot()
	if err != nil {
		return nil, err
	}
	if _, err := envtest.InstallCRDs(cp.Admin.Config, envtest.CRDInstallOptions{
		Paths: []string{filepath.Join(root, "schema", "crd", "bases"), filepath.Join("testdata", "crds")}, ErrorIfPathMissing: true,
	}); err != nil {
		return nil, fmt.Errorf("install CRDs: %w", err)
	}
	scheme, err := policy.Scheme()
	if err != nil {
		return nil, err
	}
	c, err := client.New(cp.Admin.Config, client.Options{Scheme: scheme})
	if err != nil {
		return nil, err
	}
	return c, c.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}})
}

// env returns the suite's client, or skips t (binaries absent, PLINTH_INTEGRATION unset) or
// fails it (absent with PLINTH_INTEGRATION=1, or the control plane did not start).
func env(t testing.TB) client.Client {
	t.Helper()
	if suite.skip != nil {
		prereq.Missing(t, "test binary: %v (make testbin builds it)", suite.skip)
	}
	if suite.startUp != nil {
		t.Fatalf("control plane: %v", suite.startUp)
	}
	t.Cleanup(func() {
		if t.Failed() && suite.cp != nil {
			for name, tail := range suite.cp.LogTails(30) {
				t.Logf("--- %s log, last lines:\n%s", name, tail)
			}
		}
	})
	return suite.c
}

// writeCounter counts the writes the reconciler makes (dry-runs excluded).
type writeCounter struct {
	client.Client
	n   atomic.Int64
	mu  sync.Mutex
	log []string
}

// note records a write as "<verb> <Kind> <name>".
func (w *writeCounter) note(verb string, obj client.Object, dryRun []string) {
	if len(dryRun) > 0 {
		return
	}
	w.n.Add(1)
	w.mu.Lock()
	w.log = append(w.log, fmt.Sprintf("%s %s %s", verb, kindOf(obj), obj.GetName()))
	w.mu.Unlock()
}

// kindOf is obj's kind: its GroupVersionKind's (set on unstructured objects) or, for typed
// objects sent without one, the name of its Go type.
func kindOf(obj client.Object) string {
	if k := obj.GetObjectKind().GroupVersionKind().Kind; k != "" {
		return k
	}
	return reflect.TypeOf(obj).Elem().Name()
}

// writesByKind counts the writes with verb of log (entries of writes()) by kind.
func writesByKind(log []string, verb string) map[string]int {
	n := map[string]int{}
	for _, e := range log {
		if f := strings.Fields(e); len(f) >= 2 && f[0] == verb {
			n[f[1]]++
		}
	}
	return n
}

func (w *writeCounter) writes() (int64, []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n.Load(), append([]string(nil), w.log...)
}

func (w *writeCounter) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	o := &client.CreateOptions{}
	o.ApplyOptions(opts)
	w.note("create", obj, o.DryRun)
	return w.Client.Create(ctx, obj, opts...)
}

func (w *writeCounter) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	o := &client.UpdateOptions{}
	o.ApplyOptions(opts)
	w.note("update", obj, o.DryRun)
	return w.Client.Update(ctx, obj, opts...)
}

func (w *writeCounter) Patch(ctx context.Context, obj client.Object, p client.Patch, opts ...client.PatchOption) error {
	o := &client.PatchOptions{}
	o.ApplyOptions(opts)
	w.note("patch", obj, o.DryRun)
	return w.Client.Patch(ctx, obj, p, opts...)
}

func (w *writeCounter) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	o := &client.DeleteOptions{}
	o.ApplyOptions(opts)
	w.note("delete", obj, o.DryRun)
	return w.Client.Delete(ctx, obj, opts...)
}

func (w *writeCounter) Status() client.SubResourceWriter {
	return &statusCounter{SubResourceWriter: w.Client.Status(), w: w}
}

type statusCounter struct {
	client.SubResourceWriter
	w *writeCounter
}

func (s *statusCounter) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	s.w.note("status-update", obj, nil)
	return s.SubResourceWriter.Update(ctx, obj, opts...)
}

func (s *statusCounter) Patch(ctx context.Context, obj client.Object, p client.Patch, opts ...client.SubResourcePatchOption) error {
	o := &client.SubResourcePatchOptions{}
	o.ApplyOptions(opts)
	s.w.note("status-patch", obj, o.DryRun)
	return s.SubResourceWriter.Patch(ctx, obj, p, opts...)
}

// controller is a running manager with the policy reconciler.
type controller struct {
	r      *policy.Reconciler
	writes *writeCounter
	stop   func()
}

// startController runs the controller until the test ends (or stop is called); with, when
// given, changes its options.
func startController(t *testing.T, with ...func(*policy.Options)) *controller {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	wc := &writeCounter{}
	logger := logr.Discard()
	if testing.Verbose() {
		logger = zap.New(zap.UseDevMode(true), zap.WriteTo(os.Stderr))
	}
	o := policy.Options{
		Config: suite.cp.Admin.Config, MetricsAddr: "0", HealthAddr: "0",
		Namespace: namespace, Logger: logger, Resync: 0, SkipNameValidation: true,
		WrapClient: func(c client.Client) client.Client { wc.Client = c; return wc },
	}
	for _, f := range with {
		f(&o)
	}
	mgr, r, err := policy.NewManager(ctx, o)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	r.ReplacementPoll = 200 * time.Millisecond
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("manager: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return &controller{r: r, writes: wc, stop: stop}
}

// eventually polls f every 100 ms until it returns nil or timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, f func() error) {
	t.Helper()
	controlplane.Eventually(t, timeout, 100*time.Millisecond, what, f)
}

// reconcileNow runs one reconcile of the whole set directly (the manager's cache is used)
// and returns the writes it made.
func reconcileNow(t *testing.T, c *controller) (int64, []string) {
	t.Helper()
	_, n, log := reconcileResult(t, c)
	return n, log
}

// reconcileResult is reconcileNow that also returns the reconcile's result (its requeue).
func reconcileResult(t *testing.T, c *controller) (ctrl.Result, int64, []string) {
	t.Helper()
	settle(t)
	before, _ := c.writes.writes()
	res, err := c.r.Reconcile(context.Background(), ctrl.Request{})
	if err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	after, log := c.writes.writes()
	return res, after - before, log[before:]
}

// settle waits until the running controller has had no reconcile for a second, so its own
// last writes have reached its informer cache (a reconcile that starts from a cache that has
// not seen the previous status patch sends that patch again: a write the server discards, but
// a write).
// A controller that never goes quiet (a reconcile loop) fails the test after 30 s.
func settle(t *testing.T) {
	t.Helper()
	last := reconciles(t)
	deadline := time.Now().Add(30 * time.Second)
	for quiet := 0; quiet < 10; {
		if time.Now().After(deadline) {
			t.Fatalf("the controller never had a second without a reconcile in 30 s (%d reconciles so far): a reconcile loop", last)
		}
		time.Sleep(100 * time.Millisecond)
		if n := reconciles(t); n != last {
			last, quiet = n, 0
			continue
		}
		quiet++
	}
}

// reconciles is how many reconciles of the policy set have finished in this process.
func reconciles(t *testing.T) uint64 {
	t.Helper()
	var m dto.Metric
	if err := policy.ReconcileDuration.WithLabelValues(policy.KindPolicySet).(prometheus.Metric).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount()
}
