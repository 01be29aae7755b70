package devenv

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/internal/failpoint"
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

// volumeFiles lists the files of volume id (its image, its identity record and their temp
// files) on every node.
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
			reported, err := e.placementKeptInUse(ctx, 2*time.Minute)
			if err != nil {
				return "", err
			}
			if err := e.releaseInUsePlacement(ctx, name, pvc); err != nil {
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

// AgentCrashPoints are the named crash points (internal/failpoint) that
// AgentRestartMidProvisioning arms in the agent DaemonSet, in the order one
// provisioning meets them: the volume's file sized but not yet renamed into
// place, then the volume made and attached but not yet reported in status.
var AgentCrashPoints = []string{failpoint.FileCreateSized, failpoint.AgentVolumeCreated}

// AgentRestartMidProvisioning arms AgentCrashPoints in the agent DaemonSet
// (PLINTH_FAILPOINTS, each point "once" per node: the agent exits with
// failpoint.ExitCode there the first time only), claims a PVC, and checks
// that the agent of the volume's node crashed exactly once at each point
// (kubelet restarted it each time), that the PVC came out Bound once with one
// PV, one VolumeState, one file and one loop device and no orphan, and that
// no other node's agent crashed. The DaemonSet is restored afterwards.
func (e *Walk) AgentRestartMidProvisioning(ctx context.Context) error {
	const name = "restart-data"
	armed := make([]string, len(AgentCrashPoints))
	for i, p := range AgentCrashPoints {
		armed[i] = p + "=" + string(failpoint.Once)
	}
	spec := strings.Join(armed, ",")
	return e.step("the agent crashes at "+strings.Join(AgentCrashPoints, ", then ")+" while provisioning PVC "+name+"; kubelet restarts it each time → Bound once, no orphan, no duplicate",
		[]string{"agent", "csi-controller"}, func() (string, error) {
			if err := e.setAgentEnv(ctx, failpoint.Env, spec); err != nil {
				return "", err
			}
			pvc, err := e.claim(ctx, name, QuickstartClass)
			if err != nil {
				return "", err
			}
			start := time.Now()
			if _, err := e.waitBound(ctx, name, 4*time.Minute); err != nil {
				return "", err
			}
			bound := time.Since(start)
			id := storev1.VolumeID("pvc-" + string(pvc.UID))
			vs, err := e.waitVolumeReady(ctx, id)
			if err != nil {
				return "", err
			}
			node := vs.Labels[policyv1.LabelNode]
			var lines []string
			pods, err := e.agentPods(ctx)
			if err != nil {
				return "", err
			}
			for n, p := range pods {
				cs := agentStatus(p)
				if cs == nil {
					return "", fmt.Errorf("agent pod %s on %s has no agent container status", p.Name, n)
				}
				want := int32(0)
				if n == node {
					want = int32(len(AgentCrashPoints))
				}
				if cs.RestartCount != want {
					return "", fmt.Errorf("agent on %s restarted %d times, want %d (one per armed point on the volume's node, none elsewhere)", n, cs.RestartCount, want)
				}
				if n != node {
					continue
				}
				last := cs.LastTerminationState.Terminated
				if last == nil || last.ExitCode != failpoint.ExitCode {
					return "", fmt.Errorf("agent on %s: last termination %+v, want exit code %d (a crash point)", n, last, failpoint.ExitCode)
				}
				lines = append(lines, fmt.Sprintf("agent %s on %s exited %d times with code %d (the armed points) and was restarted by kubelet; PVC Bound, pod Running %.1fs after the claim",
					p.Name, n, cs.RestartCount, last.ExitCode, bound.Seconds()))
			}
			check, err := e.checkNoOrphans(ctx, name, id, node)
			if err != nil {
				return "", err
			}
			lines = append(lines, check)
			if err := e.unclaim(ctx, name, id); err != nil {
				return "", err
			}
			lines = append(lines, "PVC deleted → PV, VolumeState, file and loop device gone")
			if err := e.setAgentEnv(ctx, failpoint.Env, ""); err != nil {
				return "", err
			}
			lines = append(lines, "agent DaemonSet restored (no crash point armed) and rolled out")
			return strings.Join(lines, "\n"), nil
		})
}

// agentPods returns the agent pod of every node, by node.
func (e *Walk) agentPods(ctx context.Context) (map[string]*corev1.Pod, error) {
	var pods corev1.PodList
	if err := e.Client.List(ctx, &pods, client.InNamespace(ControllerNamespace), client.MatchingLabels{"app.kubernetes.io/component": "agent"}); err != nil {
		return nil, err
	}
	out := map[string]*corev1.Pod{}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.DeletionTimestamp == nil && p.Spec.NodeName != "" {
			out[p.Spec.NodeName] = p
		}
	}
	return out, nil
}

// agentStatus is the status of pod's agent container.
func agentStatus(p *corev1.Pod) *corev1.ContainerStatus {
	for i := range p.Status.ContainerStatuses {
		if p.Status.ContainerStatuses[i].Name == "agent" {
			return &p.Status.ContainerStatuses[i]
		}
	}
	return nil
}

// setAgentEnv sets (value "" removes) environment variable name on the agent
// DaemonSet's agent container and waits until the DaemonSet has rolled out:
// every node runs a new agent pod, ready.
func (e *Walk) setAgentEnv(ctx context.Context, name, value string) error {
	var ds appsv1.DaemonSet
	key := client.ObjectKey{Namespace: ControllerNamespace, Name: "plinth-agent"}
	if err := e.Client.Get(ctx, key, &ds); err != nil {
		return err
	}
	patch := client.MergeFrom(ds.DeepCopy())
	found := false
	for i := range ds.Spec.Template.Spec.Containers {
		c := &ds.Spec.Template.Spec.Containers[i]
		if c.Name != "agent" {
			continue
		}
		found = true
		env := c.Env[:0]
		for _, v := range c.Env {
			if v.Name != name {
				env = append(env, v)
			}
		}
		if value != "" {
			env = append(env, corev1.EnvVar{Name: name, Value: value})
		}
		c.Env = env
	}
	if !found {
		return fmt.Errorf("DaemonSet %s has no agent container", key)
	}
	if err := e.Client.Patch(ctx, &ds, patch); err != nil {
		return err
	}
	return poll(ctx, 3*time.Minute, func() error {
		if err := e.Client.Get(ctx, key, &ds); err != nil {
			return err
		}
		st := ds.Status
		if st.ObservedGeneration < ds.Generation || st.UpdatedNumberScheduled != st.DesiredNumberScheduled || st.NumberReady != st.DesiredNumberScheduled || st.NumberUnavailable > 0 {
			return fmt.Errorf("DaemonSet %s rolling out: %d/%d updated, %d ready (generation %d, observed %d)",
				key, st.UpdatedNumberScheduled, st.DesiredNumberScheduled, st.NumberReady, ds.Generation, st.ObservedGeneration)
		}
		return nil
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

// PodWithoutVolume creates a busybox pod like PodWithVolume's, scheduled by
// the same profile but with no volume, waits until it is Running, then
// deletes it and waits until it is gone. It returns the time from its
// creation to Running: the floor under PodWithVolume's figure (scheduling,
// sandbox and container start on a real kubelet, no storage work).
func (e *Walk) PodWithoutVolume(ctx context.Context, name string) (time.Duration, error) {
	pod := quickstartPod()
	pod.Name = name
	pod.Spec.Volumes = nil
	pod.Spec.Containers[0].VolumeMounts = nil
	start := time.Now()
	if err := e.Client.Create(ctx, pod); err != nil {
		return 0, err
	}
	var took time.Duration
	err := poll(ctx, 2*time.Minute, func() error {
		var p corev1.Pod
		if err := e.Client.Get(ctx, client.ObjectKeyFromObject(pod), &p); err != nil {
			return err
		}
		if p.Status.Phase != corev1.PodRunning {
			return fmt.Errorf("pod %s %s: %s", name, p.Status.Phase, podWhy(&p))
		}
		took = time.Since(start)
		return nil
	})
	if err != nil {
		return time.Since(start), err
	}
	zero := int64(0)
	if err := e.Client.Delete(ctx, pod, &client.DeleteOptions{GracePeriodSeconds: &zero}); err != nil && !apierrors.IsNotFound(err) {
		return took, err
	}
	return took, poll(ctx, 2*time.Minute, func() error {
		if err := e.Client.Get(ctx, client.ObjectKeyFromObject(pod), &corev1.Pod{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("pod %s still there (%v)", name, err)
		}
		return nil
	})
}

// placementKeptInUse waits up to timeout until Placement ExtraPlacement, deleted by a prune, is
// kept by its in-use finalizer and says so (Ready=False InUse, "in use by 1 PVC", status.inUseBy
// 1), and returns what it reported.
func (e *Walk) placementKeptInUse(ctx context.Context, timeout time.Duration) (string, error) {
	var reported string
	err := poll(ctx, timeout, func() error {
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
	})
	return reported, err
}

// releaseInUsePlacement checks that the StorageClass of the pruned, in-use Placement
// ExtraPlacement is kept, deletes the claim name (pvc, which uses it), and waits up to 2 minutes
// until the Placement and its StorageClass are gone.
func (e *Walk) releaseInUsePlacement(ctx context.Context, name string, pvc *corev1.PersistentVolumeClaim) error {
	if err := e.Client.Get(ctx, client.ObjectKey{Name: ExtraClass}, &storagev1.StorageClass{}); err != nil {
		return fmt.Errorf("StorageClass %s of the in-use placement: %w", ExtraClass, err)
	}
	if err := e.unclaim(ctx, name, storev1.VolumeID("pvc-"+string(pvc.UID))); err != nil {
		return err
	}
	return poll(ctx, 2*time.Minute, func() error {
		if _, err := e.placement(ctx, ExtraPlacement); !apierrors.IsNotFound(err) {
			return fmt.Errorf("Placement %s still there (%v)", ExtraPlacement, err)
		}
		if err := e.Client.Get(ctx, client.ObjectKey{Name: ExtraClass}, &storagev1.StorageClass{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("StorageClass %s still there (%v)", ExtraClass, err)
		}
		return nil
	})
}
