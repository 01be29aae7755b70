// Package recovery loses a control plane for real and re-adopts its volumes: volumes with
// data on the file backend (the host's loop devices) under a real kube-apiserver, etcd and
// kube-controller-manager and the real agent; then the whole control plane is stopped and its
// etcd data removed, a fresh one is started, the same Git checkout is applied again, and
// `plinth adopt`'s code (controllers/adopt, what the subcommand runs) plans and confirms.
//
// Stand-ins, each named where it acts: the test applies the vetted policy and the render
// output as Flux and Plinth's controller would (both are pure code of this repository:
// schema/vet and controllers/render), creates the Node as kubelet would, the VolumeStates as
// CreateVolume would (the policy frozen from the live objects, as csi/controller does) and
// the PVs as csi-provisioner would. No kubelet: the data is written to and read from the
// volumes' loop devices directly. The real-node e2e cluster does not run this yet (see
// docs/operations.md "Disaster recovery").
package recovery

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/plinth-storage/plinth/agents/agent"
	"github.com/plinth-storage/plinth/agents/fencing"
	"github.com/plinth-storage/plinth/agents/file"
	"github.com/plinth-storage/plinth/controllers/adopt"
	"github.com/plinth-storage/plinth/controllers/render"
	"github.com/plinth-storage/plinth/internal/identity"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/schema/vet"
	"github.com/plinth-storage/plinth/test/framework/controlplane"
	"github.com/plinth-storage/plinth/test/framework/crdtest"
	"github.com/plinth-storage/plinth/test/framework/wait"
	"github.com/plinth-storage/plinth/test/prereq"
)

const (
	node      = "node-a"
	mib       = int64(1 << 20)
	volBytes  = 8 * mib
	namespace = "shop"
)

// the Git checkout: the policy and the apps' claims (three with volumes, one whose volume was
// never made)
const policyYAML = `apiVersion: policy.plinth.dev/v1alpha1
kind: StoragePool
metadata:
  name: files
spec:
  nodeSelector:
    matchLabels:
      plinth.dev/storage: dev
  backend:
    file:
      directory: %s
  reserve: 1Mi
  driftPolicy: Correct
---
apiVersion: policy.plinth.dev/v1alpha1
kind: Protocol
metadata:
  name: local
spec:
  local: {}
---
apiVersion: policy.plinth.dev/v1alpha1
kind: Placement
metadata:
  name: fast
spec:
  poolRef: {name: files}
  protocolRef: {name: local}
  storageClass:
    name: plinth-fast
    reclaimPolicy: Delete
    volumeBindingMode: WaitForFirstConsumer
  filesystem:
    fsType: ext4
`

func claimYAML(name string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: %s
  namespace: %s
spec:
  storageClassName: plinth-fast
  accessModes: [ReadWriteOnce]
  resources:
    requests:
      storage: 8Mi
`, name, namespace)
}

func scheme(t testing.TB) *runtime.Scheme {
	s, err := adopt.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	if err := storagev1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	return s
}

// cluster is one control plane with Plinth's CRDs, the checkout's policy and render applied,
// and the agent running on node-a.
type cluster struct {
	cp     *controlplane.ControlPlane
	c      client.Client
	stop   context.CancelFunc
	done   chan error
	policy *vet.Policies
}

func up(t testing.TB, ctx context.Context, gitDir string, opts agent.Options) *cluster {
	t.Helper()
	cp, err := controlplane.Start(ctx, controlplane.Options{ControllerManager: true})
	if err != nil {
		t.Fatalf("control plane: %v", err)
	}
	cl := &cluster{cp: cp}
	t.Cleanup(func() { cl.down(t) })
	if err := crdtest.Install(cp); err != nil {
		t.Fatal(err)
	}
	if cl.c, err = client.New(cp.Admin.Config, client.Options{Scheme: scheme(t)}); err != nil {
		t.Fatal(err)
	}
	// stand-in for kubelet registering its Node
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, Labels: map[string]string{"plinth.dev/storage": "dev"}}}
	// stand-in for Flux: the checkout's policy, vetted (schema defaults filled in) as plinth vet does
	set, err := vet.Load(filepath.Join(gitDir, "policy"))
	if err != nil {
		t.Fatal(err)
	}
	v, err := vet.NewVetter()
	if err != nil {
		t.Fatal(err)
	}
	pol, problems := v.Vet(set)
	if len(problems) > 0 {
		t.Fatalf("policy: %v", problems)
	}
	cl.policy = pol
	// stand-in for Plinth's controller: its render of the policy for the Node
	out, err := render.Render(render.Input{Pools: pol.Pools, Protocols: pol.Protocols, Placements: pol.Placements, Nodes: []corev1.Node{*n}})
	if err != nil {
		t.Fatal(err)
	}
	objs := []client.Object{n, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}}
	for i := range pol.Pools {
		objs = append(objs, &pol.Pools[i])
	}
	for i := range pol.Protocols {
		objs = append(objs, &pol.Protocols[i])
	}
	for i := range pol.Placements {
		objs = append(objs, &pol.Placements[i])
	}
	for i := range out.StorageClasses {
		objs = append(objs, &out.StorageClasses[i])
	}
	for i := range out.Agents {
		objs = append(objs, &out.Agents[i])
	}
	for i := range out.Stores {
		objs = append(objs, &out.Stores[i])
	}
	for _, o := range objs {
		o = o.DeepCopyObject().(client.Object)
		o.SetResourceVersion("")
		if err := cl.c.Create(ctx, o); err != nil {
			t.Fatalf("create %T %s: %v", o, o.GetName(), err)
		}
	}
	mgr, err := agent.NewManager(cp.Admin.Config, opts)
	if err != nil {
		t.Fatal(err)
	}
	actx, cancel := context.WithCancel(context.Background())
	cl.stop, cl.done = cancel, make(chan error, 1)
	go func() { cl.done <- mgr.Start(actx) }()
	return cl
}

// down stops the agent and the whole control plane; its etcd data goes with its folder.
func (cl *cluster) down(t testing.TB) {
	if cl.stop != nil {
		cl.stop()
		select {
		case err := <-cl.done:
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("agent: %v", err)
			}
		case <-time.After(60 * time.Second):
			t.Error("agent did not stop")
		}
		cl.stop = nil
	}
	if err := cl.cp.Stop(); err != nil {
		t.Errorf("stop control plane: %v", err)
	}
}

func poll(t testing.TB, ctx context.Context, d time.Duration, what string, f func() error) {
	t.Helper()
	if err := wait.Poll(ctx, d, 200*time.Millisecond, f); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// frozen is the policy CreateVolume freezes from the live objects (csi/controller
// newVolumeState: the Placement, its pool's backend, its protocol, the filesystem with the
// class's fsType).
func frozen(t testing.TB, ctx context.Context, c client.Client) storev1.FrozenPolicy {
	var pl policyv1.Placement
	var pool policyv1.StoragePool
	var proto policyv1.Protocol
	for _, g := range []struct {
		name string
		o    client.Object
	}{{"fast", &pl}, {"files", &pool}, {"local", &proto}} {
		if err := c.Get(ctx, client.ObjectKey{Name: g.name}, g.o); err != nil {
			t.Fatal(err)
		}
	}
	fs := pl.Spec.Filesystem
	if fs.FSType == "" {
		fs.FSType = "ext4"
	}
	return storev1.FrozenPolicy{Placement: pl.Name, Pool: pool.Name, Protocol: proto.Name, Backend: pool.Spec.Backend, ProtocolSpec: proto.Spec, Filesystem: fs}
}

func sum(t testing.TB, dev string) [32]byte {
	t.Helper()
	f, err := os.Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.CopyN(h, f, volBytes); err != nil {
		t.Fatal(err)
	}
	var out [32]byte
	copy(out[:], h.Sum(nil))
	return out
}

// treeDigest is the sha256 of every file's name, size, mtime and bytes under dirs: the node's
// data and the agent's state, to prove that planning writes nothing to them.
func treeDigest(t testing.TB, dirs ...string) string {
	t.Helper()
	h := sha256.New()
	for _, d := range dirs {
		err := filepath.WalkDir(d, func(p string, e fs.DirEntry, err error) error {
			if err != nil || e.IsDir() {
				return err
			}
			info, err := e.Info()
			if err != nil {
				return err
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			fmt.Fprintf(h, "%s %d %d\n", p, info.Size(), info.ModTime().UnixNano())
			h.Write(b)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return fmt.Sprintf("%x", h.Sum(nil))
}

// TestControlPlaneLostVolumesReadopted: three claimed volumes with data, an orphan (its claim
// left Git) and a volume with a torn stamp; the control plane is destroyed; on a fresh one
// the plan is adopt 3 / ambiguous 1 / orphan 1 / missing 1 and writes nothing; --confirm
// re-binds the three claims to their old PVs with byte-equal data under a new fencing
// lifecycle; a second plan finds nothing more to adopt.
func TestControlPlaneLostVolumesReadopted(t *testing.T) {
	f := scenario(t, 3)
	t.Logf("plan %s, --confirm → VolumeStates Ready %s, → claims Bound %s", f.plan, f.ready, f.bound)
}

// BenchmarkControlPlaneLost100 is the scenario of TestControlPlaneLostVolumesReadopted at
// PLINTH_BENCH_RECOVERY_VOLUMES claimed volumes (default 100): every checksum equal, nothing
// written to the node before --confirm (digest of the volumes and the agent's state, and the
// agent's stamp-write counter), then reports the plan time (plan-s: loading the checkout and
// the cluster, and the plan), --confirm → every VolumeState Ready (ready-s) and → every claim
// Bound to its old PV (bound-s). One run (b.N is ignored: run it with -benchtime 1x).
func BenchmarkControlPlaneLost100(b *testing.B) {
	n := controlplane.BenchKnob(b, "PLINTH_BENCH_RECOVERY_VOLUMES", 100, 1)
	f := scenario(b, n)
	b.ReportMetric(float64(n), "volumes")
	b.ReportMetric(f.plan.Seconds(), "plan-s")
	b.ReportMetric(f.ready.Seconds(), "ready-s")
	b.ReportMetric(f.bound.Seconds(), "bound-s")
	b.ReportMetric(float64(f.equal), "checksums-equal")
	b.ReportMetric(f.stampWrites, "stamp-writes-before-confirm")
	b.ReportMetric(0, "ns/op")
}

// figures are the scenario's timings.
type figures struct {
	// plan: LoadGit + LoadInput + Build; ready: Apply (--confirm) until every VolumeState is
	// Ready; bound: --confirm until every claim is Bound to its old PV.
	plan, ready, bound time.Duration
	// stampWrites is the agent's identity-stamp writes between the plan and --confirm (the
	// test fails unless 0); equal is how many volumes' checksums were equal after adoption.
	stampWrites float64
	equal       int
}

func claimNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("db-%d", i)
	}
	return out
}

func newClaim(name string) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}, Spec: corev1.PersistentVolumeClaimSpec{
		StorageClassName: ptr("plinth-fast"), AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
		Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("8Mi")}}}}
}

// scenario runs the loss and the recovery with n claimed volumes (plus the orphan, the torn
// stamp and the claim whose volume was never made) and fails t on any difference.
func scenario(t testing.TB, n int) figures {
	if os.Getenv(controlplane.EnvIntegration) != "1" {
		prereq.Missing(t, "%s=1: the recovery test runs a real control plane", controlplane.EnvIntegration)
	}
	prereq.LoopControl(t)
	controlplane.RequireBinaries(t, controlplane.BinEtcd, controlplane.BinKubeAPIServer, controlplane.BinKubeControllerManager)
	if tt, ok := t.(*testing.T); ok {
		ctrllog.SetLogger(testr.New(tt))
	} else {
		ctrllog.SetLogger(logr.Discard()) // the benchmark's output is its figures
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute+time.Duration(n)*3*time.Second)
	defer cancel()
	claims := claimNames(n)

	nodeDir := t.TempDir() // the node's disk: outlives both control planes
	volDir, stateDir := filepath.Join(nodeDir, "volumes"), filepath.Join(nodeDir, "state")
	gitDir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(gitDir, "policy"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(gitDir, "apps"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(gitDir, "policy", "policy.yaml"), []byte(fmt.Sprintf(policyYAML, volDir)), 0o644)
	var apps []string
	for _, c := range append(append([]string(nil), claims...), "lost-0") {
		apps = append(apps, claimYAML(c))
	}
	opts := agent.Options{NodeName: node, StateDir: stateDir, RefreshInterval: time.Second, MetricsAddr: "0", ProbeAddr: "0",
		HostNQNFile: filepath.Join(nodeDir, "hostnqn"), SysRoot: t.TempDir(), NVMetRoot: filepath.Join(nodeDir, "no-nvmet")}
	os.WriteFile(opts.HostNQNFile, []byte("nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-0000000000ab\n"), 0o644)
	t.Cleanup(func() { detachAll(t, volDir) })

	// --- before: volumes made, bound, written, stamped
	one := up(t, ctx, gitDir, opts)
	c := one.c
	storeName := storev1.StoreName("files", node)
	sums := map[string][32]byte{}
	oldUID := map[string]string{}
	ids := map[string]string{}
	pvcs := map[string]*corev1.PersistentVolumeClaim{}
	made := append(append([]string(nil), claims...), "gone-0")
	pol := frozen(t, ctx, c)
	for _, name := range made {
		pvc := newClaim(name)
		if err := c.Create(ctx, pvc); err != nil {
			t.Fatal(err)
		}
		pvcs[name] = pvc
		pvName := "pvc-" + string(pvc.UID)
		// stand-in for CreateVolume: the VolumeState it creates
		vs := &storev1.VolumeState{ObjectMeta: metav1.ObjectMeta{Name: storev1.VolumeID(pvName), Finalizers: []string{storev1.FinalizerVolume},
			Labels: map[string]string{policyv1.LabelPool: "files", policyv1.LabelNode: node}},
			Spec: storev1.VolumeStateSpec{CSIName: pvName, StoreName: storeName, CapacityBytes: volBytes, VolumeMode: "Filesystem", Policy: pol}}
		if err := c.Create(ctx, vs); err != nil {
			t.Fatal(err)
		}
		ids[name] = vs.Name
	}
	for _, name := range made {
		vs := &storev1.VolumeState{}
		poll(t, ctx, time.Minute+time.Duration(n)*time.Second, "VolumeState Ready", func() error {
			if err := c.Get(ctx, client.ObjectKey{Name: ids[name]}, vs); err != nil {
				return err
			}
			if vs.Status.Phase != storev1.VolumeReady || vs.Status.DevicePath == "" {
				return fmt.Errorf("%s phase %q", name, vs.Status.Phase)
			}
			return nil
		})
		oldUID[name] = string(vs.UID)
		pvc := pvcs[name]
		pvName := vs.Spec.CSIName
		// stand-in for csi-provisioner: the PV of the answer, bound to the claim
		mode := corev1.PersistentVolumeFilesystem
		pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: pvName, Annotations: map[string]string{adopt.AnnotationProvisionedBy: policyv1.DriverName}},
			Spec: corev1.PersistentVolumeSpec{Capacity: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("8Mi")},
				AccessModes: pvc.Spec.AccessModes, StorageClassName: "plinth-fast", VolumeMode: &mode, PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
				ClaimRef:               &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: namespace, Name: name, UID: pvc.UID},
				PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: policyv1.DriverName, VolumeHandle: vs.Name, FSType: "ext4"}}}}
		if err := c.Create(ctx, pv); err != nil {
			t.Fatal(err)
		}
		// the app's data, through the volume's device
		data := make([]byte, volBytes)
		rand.Read(data)
		if err := os.WriteFile(vs.Status.DevicePath, data, 0); err != nil {
			t.Fatal(err)
		}
		f, _ := os.OpenFile(vs.Status.DevicePath, os.O_RDWR, 0)
		f.Sync()
		f.Close()
		sums[name] = sum(t, vs.Status.DevicePath)
	}
	var store storev1.Store
	poll(t, ctx, time.Minute+time.Duration(n)*time.Second, "every volume stamped with its claim", func() error {
		if err := c.Get(ctx, client.ObjectKey{Name: storeName}, &store); err != nil {
			return err
		}
		for name, id := range ids {
			b, err := os.ReadFile(filepath.Join(volDir, id+".id"))
			if err != nil {
				return err
			}
			st, err := identity.ParseText(string(b))
			if err != nil {
				return err
			}
			if st.PVCName != name || st.StoreUID != string(store.UID) {
				return fmt.Errorf("stamp of %s: %+v", name, st)
			}
		}
		return nil
	})
	// a volume with a torn stamp (a hand edit, a disk error): not Plinth's VolumeState's any more
	torn := storev1.VolumeID("pvc-torn-by-hand")
	if err := os.WriteFile(filepath.Join(volDir, torn+".img"), nil, 0o600); err == nil {
		os.Truncate(filepath.Join(volDir, torn+".img"), volBytes)
	}
	os.WriteFile(filepath.Join(volDir, torn+".id"), []byte("v=1\nvol="+torn+"\nsize="), 0o600)

	// --- the loss: the whole control plane and its etcd data; the node's files stay
	one.down(t)
	for _, name := range claims {
		if _, err := os.Stat(filepath.Join(volDir, ids[name]+".img")); err != nil {
			t.Fatalf("node data lost with the control plane: %v", err)
		}
	}

	// --- a fresh control plane, the same checkout (the claim gone-0 left Git)
	two := up(t, ctx, gitDir, opts)
	c = two.c
	poll(t, ctx, time.Minute, "the agent lists the volumes as unclaimed", func() error {
		if err := c.Get(ctx, client.ObjectKey{Name: storeName}, &store); err != nil {
			return err
		}
		if len(store.Status.Unclaimed) != n+2 {
			return fmt.Errorf("%d unclaimed, want %d", len(store.Status.Unclaimed), n+2)
		}
		return nil
	})
	os.WriteFile(filepath.Join(gitDir, "apps", "claims.yaml"), []byte(strings.Join(apps, "---\n")), 0o644)
	before := treeDigest(t, volDir, stateDir)
	stampsBefore := counterValue(t, agent.StampWrites)
	planStart := time.Now()
	git, err := adopt.LoadGit([]string{gitDir})
	if err != nil {
		t.Fatal(err)
	}
	in, err := adopt.LoadInput(ctx, c, git)
	if err != nil {
		t.Fatal(err)
	}
	p := adopt.Build(in)
	fig := figures{plan: time.Since(planStart)}
	t.Logf("plan in %s: adopt %d / ambiguous %d / orphan %d / missing %d", fig.plan, len(p.Adopt), len(p.Ambiguous), len(p.Orphan), len(p.Missing))
	var text bytes.Buffer
	adopt.Write(&text, &adopt.Report{Plan: p}, adopt.FormatText)
	if n <= 10 {
		t.Log(text.String())
	}
	if len(p.Adopt) != n || len(p.Ambiguous) != 1 || len(p.Orphan) != 1 || len(p.Missing) != 1 ||
		p.Ambiguous[0].VolumeID != torn || p.Orphan[0].VolumeID != ids["gone-0"] || p.Missing[0].Claim != namespace+"/lost-0" {
		t.Fatalf("plan:\n%s", text.String())
	}
	// the agent keeps refreshing meanwhile: two Store heartbeats after the plan pass before
	// the digest is taken again, so a write made by a refresh would show
	for range 2 {
		var hb time.Time
		if store.Status.LastHeartbeatTime != nil {
			hb = store.Status.LastHeartbeatTime.Time
		}
		poll(t, ctx, time.Minute, "a Store refresh after the plan", func() error {
			if err := c.Get(ctx, client.ObjectKey{Name: storeName}, &store); err != nil {
				return err
			}
			if h := store.Status.LastHeartbeatTime; h == nil || !h.After(hb) {
				return fmt.Errorf("heartbeat %v", h)
			}
			return nil
		})
	}
	if got := treeDigest(t, volDir, stateDir); got != before {
		t.Fatal("planning wrote to the node's volumes or the agent's state")
	}
	fig.stampWrites = counterValue(t, agent.StampWrites) - stampsBefore
	if w := counterValue(t, agent.StampWrites); w != stampsBefore {
		t.Fatalf("the agent wrote %v identity stamps before --confirm", w-stampsBefore)
	}
	var vss storev1.VolumeStateList
	var pvs corev1.PersistentVolumeList
	if err := c.List(ctx, &vss); err != nil || len(vss.Items) != 0 {
		t.Fatalf("VolumeStates before --confirm: %d %v", len(vss.Items), err)
	}
	if err := c.List(ctx, &pvs); err != nil || len(pvs.Items) != 0 {
		t.Fatalf("PVs before --confirm: %d %v", len(pvs.Items), err)
	}

	// --- --confirm, then the apps' claims arrive (stand-in for Flux syncing apps/)
	confirmStart := time.Now()
	res, err := adopt.Apply(ctx, c, p, 2*time.Minute+time.Duration(n)*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if !r.Ready {
			t.Fatalf("adoption %+v", r)
		}
	}
	fig.ready = time.Since(confirmStart)
	t.Logf("--confirm: %d VolumeStates Ready in %s", len(res), fig.ready)
	for _, name := range append(append([]string(nil), claims...), "lost-0") {
		if err := c.Create(ctx, newClaim(name)); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	marks, err := fencing.Open(opts.MarksDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range claims {
		var pvc corev1.PersistentVolumeClaim
		poll(t, ctx, time.Minute+time.Duration(n)*time.Second, "claim "+name+" bound to its old PV", func() error {
			if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &pvc); err != nil {
				return err
			}
			if pvc.Status.Phase != corev1.ClaimBound {
				return fmt.Errorf("phase %s", pvc.Status.Phase)
			}
			return nil
		})
	}
	fig.bound = time.Since(confirmStart)
	equal := 0
	for _, name := range claims {
		var pvc corev1.PersistentVolumeClaim
		if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &pvc); err != nil {
			t.Fatal(err)
		}
		var vs storev1.VolumeState
		if err := c.Get(ctx, client.ObjectKey{Name: ids[name]}, &vs); err != nil {
			t.Fatal(err)
		}
		if pvc.Spec.VolumeName != vs.Spec.CSIName {
			t.Errorf("claim %s bound to %s, want its old PV %s", name, pvc.Spec.VolumeName, vs.Spec.CSIName)
		}
		if got := sum(t, vs.Status.DevicePath); got != sums[name] {
			t.Errorf("data of %s differs after adoption", name)
		} else {
			equal++
		}
		m, found, err := marks.Load(vs.Name)
		if err != nil || !found || m.UID != string(vs.UID) || len(m.Retired) == 0 || m.Retired[len(m.Retired)-1] != oldUID[name] {
			t.Errorf("fencing mark of %s: %+v %v %v; want UID %s retiring %s", name, m, found, err, vs.UID, oldUID[name])
		}
	}
	t.Logf("%d of %d checksums equal after adoption", equal, n)
	fig.equal = equal
	// lost-0 stays Pending: nothing was created for it (no CSI driver runs here, and adopt made no volume)
	var lost corev1.PersistentVolumeClaim
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "lost-0"}, &lost); err != nil || lost.Status.Phase == corev1.ClaimBound {
		t.Errorf("claim lost-0: %s %v", lost.Status.Phase, err)
	}
	if _, err := os.Stat(filepath.Join(volDir, ids["gone-0"]+".img")); err != nil {
		t.Errorf("the orphan was removed: %v", err)
	}

	// --- a second run finds nothing more to adopt
	in, err = adopt.LoadInput(ctx, c, git)
	if err != nil {
		t.Fatal(err)
	}
	if p := adopt.Build(in); len(p.Adopt) != 0 {
		t.Errorf("second plan adopts %d volumes", len(p.Adopt))
	}
	return fig
}

// counterValue reads a Prometheus counter of the agent.
func counterValue(t testing.TB, c prometheus.Counter) float64 {
	m := &dto.Metric{}
	if err := c.Write(m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

func ptr[T any](v T) *T { return &v }

// detachAll removes the volumes left in dir with their loop devices.
func detachAll(t testing.TB, dir string) {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), ".img")
		if !ok || !storev1.IsVolumeID(id) {
			continue
		}
		if err := deleteVolume(dir, id); err != nil {
			t.Errorf("cleanup %s: %v", id, err)
		}
	}
}

func deleteVolume(dir, id string) error {
	fb, err := file.New(file.Config{Directory: dir})
	if err != nil {
		return err
	}
	return fb.Delete(context.Background(), id)
}
