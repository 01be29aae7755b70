package observability

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/test/framework/controlplane"
	"github.com/plinth-storage/plinth/test/framework/monitoring"
)

// Names of the harness's fleet.
const (
	// StorageNode carries the pool (the agent and the CSI node plugin run for it).
	StorageNode = "node-a"
	// OtherNode is a Node object only, in another zone.
	OtherNode = "node-b"
	// Namespace is the controller's namespace.
	Namespace = "plinth-system"
	// FieldManager applies what the harness writes itself.
	FieldManager = "plinth-observability"
	// StorageLabel selects the storage node in the test's StoragePool.
	StorageLabel = "plinth.dev/observability"
)

// Zones of the Nodes (topology.kubernetes.io/zone), the failure domains of the dashboards.
var Zones = map[string]string{StorageNode: "zone-a", OtherNode: "zone-b"}

// Options configure Start.
type Options struct {
	// Dir is the work folder; keep it short (unix socket paths are at most 107 bytes).
	Dir string
	// Root is the repository checkout (CRDs, CSIDriver).
	Root string
	// Plinth is the plinth binary.
	Plinth string
	// PoolBytes is the size of the tmpfs mounted at PoolDir, the file backend's directory: a
	// pool this small is filled by provisioning alone.
	PoolBytes int64
	// Log receives progress lines; nil discards them.
	Log io.Writer
}

// Plinth is a running Plinth on a real control plane: controller, agent of StorageNode (file
// backend on a tmpfs, loop devices), CSI controller and node plugin as separate processes,
// and csi-provisioner.
type Plinth struct {
	CP     *controlplane.ControlPlane
	Client client.Client
	Dir    string
	// PoolDir is the file backend's directory (a tmpfs of Options.PoolBytes).
	PoolDir string
	// AgentStateDir is the agent's --state-dir (fencing marks under agent/marks).
	AgentStateDir string
	// Agent is the agent process of StorageNode (stopped by a test to let its heartbeat lapse).
	Agent *controlplane.Process
	// ControllerSocket, NodeSocket are the CSI controller's and node plugin's sockets.
	ControllerSocket, NodeSocket string
	// Targets are the metrics endpoints, for ScrapeConfig.
	Targets []monitoring.Target

	log io.Writer
}

// Scheme knows Kubernetes' kinds and Plinth's.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, policyv1.AddToScheme, storev1.AddToScheme} {
		if err := add(s); err != nil {
			panic(err)
		}
	}
	return s
}

func (p *Plinth) logf(format string, args ...any) {
	fmt.Fprintf(p.log, format+"\n", args...)
}

// Start brings everything up. On error what it started is stopped.
func Start(ctx context.Context, opts Options) (_ *Plinth, err error) {
	p := &Plinth{Dir: opts.Dir, log: opts.Log}
	if p.log == nil {
		p.log = io.Discard
	}
	p.PoolDir = filepath.Join(p.Dir, "pool")
	p.AgentStateDir = filepath.Join(p.Dir, "agent")
	for _, d := range []string{p.PoolDir, p.AgentStateDir, filepath.Join(p.Dir, "csi"), filepath.Join(p.Dir, "kubelet")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	defer func() {
		if err != nil {
			_ = p.Stop()
		}
	}()
	if err := syscall.Mount("tmpfs", p.PoolDir, "tmpfs", 0, fmt.Sprintf("size=%d", opts.PoolBytes)); err != nil {
		return nil, fmt.Errorf("mount a tmpfs of %d bytes at %s: %w", opts.PoolBytes, p.PoolDir, err)
	}
	p.CP, err = controlplane.Start(ctx, controlplane.Options{Dir: filepath.Join(p.Dir, "cluster"), ControllerManager: true})
	if err != nil {
		return nil, err
	}
	p.logf("control plane %s", p.CP.URL)
	if p.Client, err = client.New(p.CP.Admin.Config, client.Options{Scheme: Scheme()}); err != nil {
		return nil, err
	}
	if err := p.installCRDs(ctx, opts.Root); err != nil {
		return nil, err
	}
	if err := p.registerNodes(ctx); err != nil {
		return nil, err
	}
	if err := p.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	kc := p.CP.Admin.Kubeconfig
	ports := func() (int, int, error) {
		a, err := controlplane.FreePort()
		if err != nil {
			return 0, 0, err
		}
		b, err := controlplane.FreePort()
		return a, b, err
	}
	// The controller (component controller of kustomize/controller/service.yaml).
	mport, hport, err := ports()
	if err != nil {
		return nil, err
	}
	if _, err := p.CP.StartProcess(ctx, controlplane.ProcessSpec{
		Name: "plinth-controller", Binary: opts.Plinth, ReadyTimeout: 2 * time.Minute,
		Args: []string{"controller", "--kubeconfig", kc, "--namespace", Namespace,
			"--metrics-bind-address", fmt.Sprintf("127.0.0.1:%d", mport), "--health-probe-bind-address", fmt.Sprintf("127.0.0.1:%d", hport),
			"--resync-interval", "30s"},
		Ready: controlplane.HTTPReady(fmt.Sprintf("http://127.0.0.1:%d/readyz", hport), nil),
	}); err != nil {
		return nil, err
	}
	p.Targets = append(p.Targets, monitoring.Target{Job: monitoring.JobPlinth, Address: fmt.Sprintf("127.0.0.1:%d", mport), Component: "controller"})
	// The agent of the storage node.
	if mport, hport, err = ports(); err != nil {
		return nil, err
	}
	if p.Agent, err = p.CP.StartProcess(ctx, controlplane.ProcessSpec{
		Name: "plinth-agent-" + StorageNode, Binary: opts.Plinth, ReadyTimeout: 2 * time.Minute,
		Args: []string{"agent", "--node", StorageNode, "--kubeconfig", kc, "--state-dir", p.AgentStateDir,
			"--refresh-interval", "2s", "--metrics-bind-address", fmt.Sprintf("127.0.0.1:%d", mport),
			"--health-probe-bind-address", fmt.Sprintf("127.0.0.1:%d", hport), "--host-nqn-file", filepath.Join(p.Dir, "agent", "no-hostnqn")},
		Ready: controlplane.HTTPReady(fmt.Sprintf("http://127.0.0.1:%d/healthz", hport), nil),
	}); err != nil {
		return nil, err
	}
	p.Targets = append(p.Targets, monitoring.Target{Job: monitoring.JobPlinth, Address: fmt.Sprintf("127.0.0.1:%d", mport), Component: "agent", Node: StorageNode})
	// The CSI controller and node plugin, apart as deployed (Deployment and DaemonSet).
	p.ControllerSocket = filepath.Join(p.Dir, "csi", "controller.sock")
	p.NodeSocket = filepath.Join(p.Dir, "csi", "node.sock")
	if len(p.ControllerSocket) > 100 {
		return nil, fmt.Errorf("socket path %s is too long for a unix socket: choose a shorter Dir", p.ControllerSocket)
	}
	for _, c := range []struct {
		mode, component, socket, node string
		extra                         []string
	}{
		{"controller", "csi-controller", p.ControllerSocket, "", []string{"--wait-timeout", "60s"}},
		{"node", "csi-node", p.NodeSocket, StorageNode, []string{"--node-name", StorageNode, "--state-dir", filepath.Join(p.Dir, "csi", "state"),
			"--host-nqn-file", filepath.Join(p.Dir, "csi", "no-hostnqn")}},
	} {
		if mport, err = controlplane.FreePort(); err != nil {
			return nil, err
		}
		args := append([]string{"csi", "--mode", c.mode, "--endpoint", "unix://" + c.socket, "--kubeconfig", kc,
			"--metrics-address", fmt.Sprintf("127.0.0.1:%d", mport), "-v", "2",
			"--registration-dir=", "--health-address="}, c.extra...) // no kubelet registers the driver here
		if _, err := p.CP.StartProcess(ctx, controlplane.ProcessSpec{
			Name: "plinth-" + c.component, Binary: opts.Plinth, Args: args, ReadyTimeout: 2 * time.Minute,
			Ready: controlplane.SocketReady(c.socket),
		}); err != nil {
			return nil, err
		}
		p.Targets = append(p.Targets, monitoring.Target{Job: monitoring.JobPlinth, Address: fmt.Sprintf("127.0.0.1:%d", mport), Component: c.component, Node: c.node})
	}
	// csi-provisioner outside a pod (docs/design.md, "Real nodes").
	if _, err := p.CP.StartProcess(ctx, controlplane.ProcessSpec{
		Name: controlplane.BinCSIProvisioner, Binary: controlplane.BinCSIProvisioner,
		Args: []string{"--csi-address=" + p.ControllerSocket, "--kubeconfig=" + kc, "--leader-election=false", "--timeout=60s", "--v=2",
			"--feature-gates=Topology=true", "--extra-create-metadata", "--enable-capacity", "--capacity-ownerref-level=-1",
			"--capacity-poll-interval=5s", "--retry-interval-max=5s"},
		Env: []string{"NAMESPACE=" + Namespace},
	}); err != nil {
		return nil, err
	}
	p.logf("controller, agent, CSI controller and node plugin, csi-provisioner running; targets %v", p.Targets)
	return p, nil
}

// Stop ends every process (by PID, through the control plane), unmounts what is mounted under
// Dir and detaches the loop devices of files under Dir.
func (p *Plinth) Stop() error {
	var errs []error
	if p.CP != nil {
		errs = append(errs, p.CP.Stop())
	}
	errs = append(errs, cleanupMounts(p.Dir))
	return errors.Join(errs...)
}

// apply server-side applies obj as FieldManager.
func (p *Plinth) Apply(ctx context.Context, obj client.Object) error {
	//nolint:staticcheck // client.Apply with typed and unstructured objects is what this needs.
	return p.Client.Patch(ctx, obj, client.Apply, client.FieldOwner(FieldManager), client.ForceOwnership)
}

func (p *Plinth) installCRDs(ctx context.Context, root string) error {
	files, err := filepath.Glob(filepath.Join(root, "schema", "crd", "bases", "*.yaml"))
	if err != nil || len(files) == 0 {
		return fmt.Errorf("no CRDs under %s/schema/crd/bases (%v)", root, err)
	}
	files = append(files, filepath.Join(root, "kustomize", "csi", "csidriver.yaml"))
	var crds []*unstructured.Unstructured
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
		for {
			var m map[string]any
			if err := dec.Decode(&m); err != nil {
				if errors.Is(err, io.EOF) {
					break
				}
				return fmt.Errorf("%s: %w", f, err)
			}
			if len(m) == 0 {
				continue
			}
			o := &unstructured.Unstructured{Object: m}
			if err := p.Apply(ctx, o); err != nil {
				return fmt.Errorf("%s %s: %w", o.GetKind(), o.GetName(), err)
			}
			if o.GetKind() == "CustomResourceDefinition" {
				crds = append(crds, o)
			}
		}
	}
	for _, c := range crds {
		if err := monitoring.Poll(ctx, time.Minute, func() error {
			got := &unstructured.Unstructured{}
			got.SetGroupVersionKind(c.GroupVersionKind())
			if err := p.Client.Get(ctx, client.ObjectKey{Name: c.GetName()}, got); err != nil {
				return err
			}
			conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
			for _, ci := range conds {
				if m, _ := ci.(map[string]any); m["type"] == "Established" && m["status"] == "True" {
					return nil
				}
			}
			return fmt.Errorf("CRD %s not Established", c.GetName())
		}); err != nil {
			return err
		}
	}
	return nil
}

// registerNodes creates the Nodes, their status and the storage node's CSINode, standing in
// for kubelet's registration and the CSI node registrar (docs/design.md, "Real nodes").
func (p *Plinth) registerNodes(ctx context.Context) error {
	for _, name := range []string{StorageNode, OtherNode} {
		labels := map[string]string{"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", corev1.LabelTopologyZone: Zones[name]}
		if name == StorageNode {
			labels[StorageLabel] = "true"
			labels[policyv1.TopologyKeyNode] = name // kubelet adds the driver's topology key from NodeGetInfo
		}
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
		if err := p.Client.Create(ctx, node); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
		rl := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("8Gi"), corev1.ResourcePods: resource.MustParse("110")}
		node.Status = corev1.NodeStatus{Capacity: rl, Allocatable: rl, Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue,
			Reason: "KubeletStandIn", LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}}
		if err := p.Client.Status().Update(ctx, node); err != nil {
			return fmt.Errorf("node %s status: %w", name, err)
		}
		if name != StorageNode {
			continue
		}
		cn := &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{{Name: policyv1.DriverName, NodeID: name, TopologyKeys: []string{policyv1.TopologyKeyNode}}}}}
		if err := p.Client.Create(ctx, cn); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	}
	return nil
}

// cleanupMounts unmounts every mount under dir and detaches the loop devices whose backing
// file is under dir, in the order they depend on each other: the filesystems staged on loop
// devices (deepest first), then the loop devices, then the tmpfs their files live on.
func cleanupMounts(dir string) error {
	if dir == "" {
		return nil
	}
	prefix := filepath.Clean(dir) + "/"
	var errs []error
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	var mps, tmpfs []string
	for _, l := range strings.Split(string(data), "\n") {
		f := strings.Fields(l)
		if len(f) < 5 || !strings.HasPrefix(f[4]+"/", prefix) {
			continue
		}
		fstype := ""
		for i, x := range f {
			if x == "-" && i+1 < len(f) {
				fstype = f[i+1]
			}
		}
		if fstype == "tmpfs" {
			tmpfs = append(tmpfs, f[4])
		} else {
			mps = append(mps, f[4])
		}
	}
	sort.Slice(mps, func(i, j int) bool { return len(mps[i]) > len(mps[j]) })
	for _, m := range mps {
		if err := syscall.Unmount(m, 0); err != nil {
			errs = append(errs, fmt.Errorf("unmount %s: %w", m, err))
		}
	}
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil || !strings.HasPrefix(strings.TrimSpace(string(b)), prefix) {
			continue
		}
		dev := "/dev/" + filepath.Base(filepath.Dir(filepath.Dir(f)))
		if out, err := exec.Command("losetup", "-d", dev).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("losetup -d %s: %v: %s", dev, err, out))
		}
	}
	for _, m := range tmpfs {
		if err := syscall.Unmount(m, 0); err != nil {
			// a loop device detaches lazily (autoclear): let the tmpfs go when it is released
			if err2 := syscall.Unmount(m, syscall.MNT_DETACH); err2 != nil {
				errs = append(errs, fmt.Errorf("unmount %s: %w", m, err))
			}
		}
	}
	return errors.Join(errs...)
}
