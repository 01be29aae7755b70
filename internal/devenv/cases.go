package devenv

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/internal/cluster"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// The cases below are the end-to-end checks beyond the quickstart walk
// (test/e2e runs them after Scenario, on the same running parts).

// claim creates PVC name (1Gi of class) and a pod using it in
// QuickstartNamespace and waits until the PVC is Bound and the pod bound to
// a node. It returns the PVC.
func (e *Walk) claim(ctx context.Context, name, class string) (*corev1.PersistentVolumeClaim, error) {
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: QuickstartNamespace},
		Spec: corev1.PersistentVolumeClaimSpec{
			StorageClassName: &class,
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	}
	if err := e.Client.Create(ctx, pvc); err != nil {
		return nil, err
	}
	pod := quickstartPod()
	pod.Name = name
	pod.Spec.Volumes[0].PersistentVolumeClaim.ClaimName = name
	if err := e.Client.Create(ctx, pod); err != nil {
		return nil, err
	}
	return pvc, nil
}

// waitBound waits for PVC name to be Bound and its pod Running.
func (e *Walk) waitBound(ctx context.Context, name string, timeout time.Duration) (*corev1.PersistentVolumeClaim, error) {
	var pvc corev1.PersistentVolumeClaim
	err := poll(ctx, timeout, func() error {
		var pod corev1.Pod
		if err := e.Client.Get(ctx, client.ObjectKey{Namespace: QuickstartNamespace, Name: name}, &pvc); err != nil {
			return err
		}
		if err := e.Client.Get(ctx, client.ObjectKey{Namespace: QuickstartNamespace, Name: name}, &pod); err != nil {
			return err
		}
		if pvc.Status.Phase != corev1.ClaimBound || pod.Status.Phase != corev1.PodRunning {
			return fmt.Errorf("PVC %s %s, pod %s on %q: %s", name, pvc.Status.Phase, pod.Status.Phase, pod.Spec.NodeName, podWhy(&pod))
		}
		return nil
	})
	return &pvc, err
}

// unclaim deletes the pod and PVC name and waits until the PV, the
// VolumeState id and its file are gone.
func (e *Walk) unclaim(ctx context.Context, name, id string) error {
	zero := int64(0)
	pod := quickstartPod()
	pod.Name = name
	if err := e.Client.Delete(ctx, pod, &client.DeleteOptions{GracePeriodSeconds: &zero}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	// Kubelet unmounts before the PVC protection lets the claim go.
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: QuickstartNamespace, Name: name}}
	if err := e.Client.Delete(ctx, pvc); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return poll(ctx, 3*time.Minute, func() error {
		var pvs corev1.PersistentVolumeList
		if err := e.Client.List(ctx, &pvs); err != nil {
			return err
		}
		for _, pv := range pvs.Items {
			if pv.Spec.ClaimRef != nil && pv.Spec.ClaimRef.Name == name {
				return fmt.Errorf("PV %s of %s still there (%s)", pv.Name, name, pv.Status.Phase)
			}
		}
		if err := e.Client.Get(ctx, client.ObjectKey{Name: id}, &storev1.VolumeState{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("VolumeState %s still there (%v)", id, err)
		}
		if m := e.volumeFiles(id); len(m) > 0 {
			return fmt.Errorf("files %v still there", m)
		}
		if devs := loopDevicesOf(id); len(devs) > 0 {
			return fmt.Errorf("loop devices %v still attached", devs)
		}
		return nil
	})
}

// volumeFiles lists the files of volume id (and its temp file) on every node.
func (e *Walk) volumeFiles(id string) []string {
	var out []string
	for _, n := range e.Nodes.Nodes {
		m, _ := filepath.Glob(filepath.Join(e.VolumeDir(n.Name), id+"*"))
		out = append(out, m...)
	}
	return out
}

// PlacementRemovedInUse removes ExtraPlacement from Git while a PVC of its
// StorageClass is Bound: Flux prunes the Placement, Plinth keeps the
// StorageClass and reports it on the Placement (finalizer plinth.dev/in-use,
// Ready=False InUse "in use by 1 PVCs", status.inUseBy 1); deleting the PVC
// then lets the Placement and the StorageClass go.
func (e *Walk) PlacementRemovedInUse(ctx context.Context) error {
	const name = "scratch-data"
	return e.step("remove placement "+ExtraPlacement+" from the policy while PVC "+name+" uses "+ExtraClass+" → kept and reported; PVC deleted → gone",
		[]string{BinKustomizeController, "plinth-controller"}, func() (string, error) {
			if _, ok := e.delivered["placement-"+ExtraPlacement+".yaml"]; !ok {
				return "", fmt.Errorf("placement %s is not in the policy repository (run Scenario first)", ExtraPlacement)
			}
			if _, err := e.claim(ctx, name, ExtraClass); err != nil {
				return "", err
			}
			pvc, err := e.waitBound(ctx, name, 3*time.Minute)
			if err != nil {
				return "", err
			}
			set := e.delivered.clone()
			delete(set, "placement-"+ExtraPlacement+".yaml")
			shown, err := e.deliver(ctx, "remove placement scratch", set, true)
			if err != nil {
				return "", err
			}
			var reported string
			if err := poll(ctx, 2*time.Minute, func() error {
				u, err := e.placement(ctx, ExtraPlacement)
				if err != nil {
					return fmt.Errorf("Placement %s: %w (want it kept by its finalizer)", ExtraPlacement, err)
				}
				if u.GetDeletionTimestamp() == nil {
					return fmt.Errorf("Placement %s not deleted yet (prune)", ExtraPlacement)
				}
				if !containsString(u.GetFinalizers(), policyv1.FinalizerInUse) {
					return fmt.Errorf("Placement %s finalizers %v, want %s", ExtraPlacement, u.GetFinalizers(), policyv1.FinalizerInUse)
				}
				s, r, m := conditionOf(u, "Ready")
				n, _, _ := unstructured.NestedInt64(u.Object, "status", "inUseBy")
				if s != "False" || r != "InUse" || !strings.Contains(m, "in use by 1 PVC") || n != 1 {
					return fmt.Errorf("Placement %s Ready=%q %s: %s (inUseBy %d)", ExtraPlacement, s, r, m, n)
				}
				reported = fmt.Sprintf("Ready=False %s: %s; status.inUseBy %d; finalizer %s", r, m, n, policyv1.FinalizerInUse)
				return nil
			}); err != nil {
				return "", err
			}
			if err := e.Client.Get(ctx, client.ObjectKey{Name: ExtraClass}, &storagev1.StorageClass{}); err != nil {
				return "", fmt.Errorf("StorageClass %s of the in-use placement: %w", ExtraClass, err)
			}
			if err := e.unclaim(ctx, name, storev1.VolumeID("pvc-"+string(pvc.UID))); err != nil {
				return "", err
			}
			if err := poll(ctx, 2*time.Minute, func() error {
				if _, err := e.placement(ctx, ExtraPlacement); !apierrors.IsNotFound(err) {
					return fmt.Errorf("Placement %s still there (%v)", ExtraPlacement, err)
				}
				if err := e.Client.Get(ctx, client.ObjectKey{Name: ExtraClass}, &storagev1.StorageClass{}); !apierrors.IsNotFound(err) {
					return fmt.Errorf("StorageClass %s still there (%v)", ExtraClass, err)
				}
				return nil
			}); err != nil {
				return "", err
			}
			how := "pruned by Flux"
			if !e.Opts.Flux {
				how = "deleted"
			}
			return fmt.Sprintf("%s\nPlacement %s %s but kept: %s; StorageClass %s kept\nPVC %s deleted → PV, volume, Placement %s and StorageClass %s gone",
				shown, ExtraPlacement, how, reported, ExtraClass, name, ExtraPlacement, ExtraClass), nil
		})
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// agentProcess is the agent container of a node: its pod, container id,
// restart count and host PID (from the node's containerd).
type agentProcess struct {
	pod      string
	node     string
	restarts int32
	pid      int
}

// taskPID returns the host PID of container id's task in c (`ctr task ls`).
func taskPID(ctx context.Context, c *cluster.Containerd, id string) (int, error) {
	out, err := c.Ctr(ctx, "task", "ls")
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == id {
			return strconv.Atoi(f[1])
		}
	}
	return 0, fmt.Errorf("node %s: no task for container %s", c.Name, id)
}

// agents returns the running agent container of every node.
func (e *Walk) agents(ctx context.Context) (map[string]agentProcess, error) {
	var pods corev1.PodList
	if err := e.Client.List(ctx, &pods, client.InNamespace(ControllerNamespace), client.MatchingLabels{"app.kubernetes.io/component": "agent"}); err != nil {
		return nil, err
	}
	out := map[string]agentProcess{}
	for _, p := range pods.Items {
		for _, cs := range p.Status.ContainerStatuses {
			if cs.Name != "agent" || cs.State.Running == nil || !cs.Ready {
				continue
			}
			n := e.Nodes.Node(p.Spec.NodeName)
			if n == nil {
				continue
			}
			id := strings.TrimPrefix(cs.ContainerID, "containerd://")
			pid, err := taskPID(ctx, n.Containerd, id)
			if err != nil {
				return nil, fmt.Errorf("agent %s on %s: %w", p.Name, n.Name, err)
			}
			out[n.Name] = agentProcess{pod: p.Name, node: n.Name, restarts: cs.RestartCount, pid: pid}
		}
	}
	if len(out) != len(e.Nodes.Nodes) {
		return nil, fmt.Errorf("%d agents running and ready, want one per node (%d)", len(out), len(e.Nodes.Nodes))
	}
	return out, nil
}

// AgentRestartMidProvisioning kills the agent (SIGKILL of its container's
// process, as a crash would; kubelet restarts the container) while it
// provisions a volume: every node's agent is frozen (SIGSTOP) before the PVC
// is created (the scheduler picks the node); once CreateVolume has created
// the VolumeState the other agents are resumed, and the volume's agent is
// resumed and killed at the first sign of work on the volume (its file or
// temp file on disk, or phase Creating) — or, if none shows before the
// VolumeState is Ready, the window is reported as missed in the returned
// detail. After kubelet restarted it the PVC binds exactly once: one PV, one
// VolumeState, one file with one loop device, no temp file, and no other
// volume file than those of live VolumeStates. The PVC is then deleted and
// everything of it is gone.
func (e *Walk) AgentRestartMidProvisioning(ctx context.Context) error {
	const name = "restart-data"
	return e.step("kill the agent mid-provisioning, kubelet restarts it → PVC "+name+" Bound once, no orphan, no duplicate",
		[]string{"agent", "csi-controller"}, func() (string, error) {
			agents, err := e.agents(ctx)
			if err != nil {
				return "", err
			}
			frozen := map[int]bool{}
			defer func() {
				for pid := range frozen {
					_ = syscall.Kill(pid, syscall.SIGCONT)
				}
			}()
			for _, a := range agents {
				if err := syscall.Kill(a.pid, syscall.SIGSTOP); err != nil {
					return "", fmt.Errorf("freeze agent pid %d on %s: %w", a.pid, a.node, err)
				}
				frozen[a.pid] = true
			}
			pvc, err := e.claim(ctx, name, QuickstartClass)
			if err != nil {
				return "", err
			}
			// pvc.UID is set by Create; the CSI name is the PV name pvc-<uid>.
			id := storev1.VolumeID("pvc-" + string(pvc.UID))
			var vs storev1.VolumeState
			if err := poll(ctx, 3*time.Minute, func() error {
				return e.Client.Get(ctx, client.ObjectKey{Name: id}, &vs)
			}); err != nil {
				return "", fmt.Errorf("VolumeState of %s never created by CreateVolume: %w", name, err)
			}
			node := vs.Labels[policyv1.LabelNode]
			target, ok := agents[node]
			if !ok {
				return "", fmt.Errorf("VolumeState %s names node %q, which has no agent", id, node)
			}
			for _, a := range agents {
				if a.node != node {
					_ = syscall.Kill(a.pid, syscall.SIGCONT)
					delete(frozen, a.pid)
				}
			}
			created := vs.Status.Phase
			file := filepath.Join(e.VolumeDir(node), id+".img")
			// Resume and kill at the first sign of work: stat in a tight loop, the API
			// between stats every few milliseconds.
			caught := ""
			if err := syscall.Kill(target.pid, syscall.SIGCONT); err != nil {
				return "", err
			}
			delete(frozen, target.pid)
			deadline := time.Now().Add(time.Minute)
			for i := 0; caught == "" && time.Now().Before(deadline); i++ {
				if _, err := os.Stat(file + ".tmp"); err == nil {
					caught = "temp file " + file + ".tmp on disk"
				} else if _, err := os.Stat(file); err == nil {
					caught = "file " + file + " on disk"
				} else if i%2000 == 0 {
					if err := e.Client.Get(ctx, client.ObjectKey{Name: id}, &vs); err == nil && vs.Status.Phase != created {
						caught = "VolumeState phase " + string(vs.Status.Phase)
					}
				}
			}
			_ = syscall.Kill(target.pid, syscall.SIGKILL)
			if caught == "" {
				return "", fmt.Errorf("the agent showed no work on %s within a minute of resuming", id)
			}
			if err := e.Client.Get(ctx, client.ObjectKey{Name: id}, &vs); err != nil {
				return "", err
			}
			atKill := fmt.Sprintf("killed agent pid %d (pod %s on %s) at: %s (VolumeState phase %q)", target.pid, target.pod, node, caught, vs.Status.Phase)
			if vs.Status.Phase == storev1.VolumeReady {
				atKill += " — the agent had already finished: the window was missed this time"
			}
			var restarted agentProcess
			if err := poll(ctx, 3*time.Minute, func() error {
				now, err := e.agents(ctx)
				if err != nil {
					return err
				}
				if restarted = now[node]; restarted.restarts <= target.restarts {
					return fmt.Errorf("agent on %s: restart count %d", node, restarted.restarts)
				}
				return nil
			}); err != nil {
				return "", err
			}
			start := time.Now()
			if _, err := e.waitBound(ctx, name, 3*time.Minute); err != nil {
				return "", err
			}
			bound := time.Since(start)
			if _, err := e.waitVolumeReady(ctx, id); err != nil {
				return "", err
			}
			check, err := e.checkNoOrphans(ctx, name, id, node)
			if err != nil {
				return "", err
			}
			if err := e.unclaim(ctx, name, id); err != nil {
				return "", err
			}
			return fmt.Sprintf("%s\nkubelet restarted the agent container (restart %d, pid %d); PVC Bound, pod Running %.1fs later\n%s\nPVC deleted → PV, VolumeState, file and loop device gone",
				atKill, restarted.restarts, restarted.pid, bound.Seconds(), check), nil
		})
}

// checkNoOrphans asserts one PV for claim, one VolumeState for it (id), its
// file with exactly one loop device, no temp files, and no volume file
// without a VolumeState.
func (e *Walk) checkNoOrphans(ctx context.Context, claim, id, node string) (string, error) {
	var pvs corev1.PersistentVolumeList
	if err := e.Client.List(ctx, &pvs); err != nil {
		return "", err
	}
	n := 0
	for _, pv := range pvs.Items {
		if pv.Spec.ClaimRef != nil && pv.Spec.ClaimRef.Name == claim {
			n++
			if pv.Spec.CSI == nil || pv.Spec.CSI.VolumeHandle != id {
				return "", fmt.Errorf("PV %s of %s has volume handle %v, want %s", pv.Name, claim, pv.Spec.CSI, id)
			}
		}
	}
	if n != 1 {
		return "", fmt.Errorf("%d PVs for %s, want 1", n, claim)
	}
	var states storev1.VolumeStateList
	if err := e.Client.List(ctx, &states); err != nil {
		return "", err
	}
	live := map[string]bool{}
	for _, s := range states.Items {
		live[s.Name] = true
	}
	if !live[id] {
		return "", fmt.Errorf("VolumeState %s missing", id)
	}
	dir := e.VolumeDir(node)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", err
	}
	var files []string
	for _, en := range entries {
		f := en.Name()
		files = append(files, f)
		if strings.HasSuffix(f, ".tmp") {
			return "", fmt.Errorf("temp file %s left under %s", f, dir)
		}
		if vid, ok := strings.CutSuffix(f, ".img"); ok && !live[vid] {
			return "", fmt.Errorf("orphan volume file %s: no VolumeState %s", f, vid)
		}
	}
	devs := loopDevicesOf(id)
	if len(devs) != 1 {
		return "", fmt.Errorf("loop devices of %s: %v, want exactly one", id, devs)
	}
	return fmt.Sprintf("1 PV, 1 VolumeState %s (Ready), files under %s: %v, loop device %s: no orphan, no duplicate", id, dir, files, devs[0]), nil
}

// PodWithVolume creates PVC name (1Gi of class) and a busybox pod using it,
// waits until the PVC is Bound and the pod Running with the volume, then
// deletes both and waits until the PV, the VolumeState and its file are
// gone. It returns the time from the PVC's creation to the pod Running (the
// figure users feel: scheduling, provisioning, attach, stage, publish and
// the container's start).
func (e *Walk) PodWithVolume(ctx context.Context, name, class string) (time.Duration, error) {
	start := time.Now()
	if _, err := e.claim(ctx, name, class); err != nil {
		return 0, err
	}
	pvc, err := e.waitBound(ctx, name, 3*time.Minute)
	took := time.Since(start)
	if err != nil {
		return took, err
	}
	var pv corev1.PersistentVolume
	if err := e.Client.Get(ctx, client.ObjectKey{Name: pvc.Spec.VolumeName}, &pv); err != nil {
		return took, err
	}
	if pv.Spec.CSI == nil {
		return took, fmt.Errorf("PV %s is not a CSI volume", pv.Name)
	}
	return took, e.unclaim(ctx, name, pv.Spec.CSI.VolumeHandle)
}
