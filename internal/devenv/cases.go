package devenv

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
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

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// The cases below are the end-to-end checks beyond the quickstart walk
// (test/e2e runs them after Scenario, on the same running parts).

// claim creates PVC name (1Gi of class) and a pod using it in
// QuickstartNamespace and waits until the PVC is Bound and the pod bound to
// a node. It returns the PVC.
func (e *Env) claim(ctx context.Context, name, class string) (*corev1.PersistentVolumeClaim, error) {
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

// waitBound waits for PVC name to be Bound and its pod bound to the storage node.
func (e *Env) waitBound(ctx context.Context, name string, timeout time.Duration) (*corev1.PersistentVolumeClaim, error) {
	var pvc corev1.PersistentVolumeClaim
	err := poll(ctx, timeout, func() error {
		var pod corev1.Pod
		if err := e.Client.Get(ctx, client.ObjectKey{Namespace: QuickstartNamespace, Name: name}, &pvc); err != nil {
			return err
		}
		if err := e.Client.Get(ctx, client.ObjectKey{Namespace: QuickstartNamespace, Name: name}, &pod); err != nil {
			return err
		}
		if pvc.Status.Phase != corev1.ClaimBound || pod.Spec.NodeName != StorageNode {
			return fmt.Errorf("PVC %s %s, pod on %q", name, pvc.Status.Phase, pod.Spec.NodeName)
		}
		return nil
	})
	return &pvc, err
}

// unclaim deletes the pod and PVC name and waits until the PV, the
// VolumeState id and its file are gone.
func (e *Env) unclaim(ctx context.Context, name, id string) error {
	zero := int64(0)
	pod := quickstartPod()
	pod.Name = name
	if err := e.Client.Delete(ctx, pod, &client.DeleteOptions{GracePeriodSeconds: &zero}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
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
		if m, _ := filepath.Glob(filepath.Join(e.VolumeDir, id+"*")); len(m) > 0 {
			return fmt.Errorf("files %v still there", m)
		}
		if devs := loopDevicesOf(filepath.Join(e.VolumeDir, id+".img")); len(devs) > 0 {
			return fmt.Errorf("loop devices %v still attached", devs)
		}
		return nil
	})
}

// loopDevicesOf lists the loop devices whose backing file is path.
func loopDevicesOf(path string) []string {
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	var out []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err == nil && strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)") == path {
			out = append(out, "/dev/"+filepath.Base(filepath.Dir(filepath.Dir(f))))
		}
	}
	return out
}

// PlacementRemovedInUse removes ExtraPlacement from Git while a PVC of its
// StorageClass is Bound: Flux prunes the Placement, Plinth keeps the
// StorageClass and reports it on the Placement (finalizer plinth.dev/in-use,
// Ready=False InUse "in use by 1 PVCs", status.inUseBy 1); deleting the PVC
// then lets the Placement and the StorageClass go.
func (e *Env) PlacementRemovedInUse(ctx context.Context) error {
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

// AgentRestartMidProvisioning kills the agent (SIGKILL) while it provisions
// a volume and starts it again: the agent is frozen (SIGSTOP) before the PVC
// is created; once CreateVolume has created the VolumeState it is resumed and
// killed at the first sign of work on the volume (its file or temp file on
// disk, or phase Creating) — or, if none shows before the VolumeState is
// Ready, the window is reported as missed in the returned detail. After the
// restart the PVC binds exactly once: one PV, one VolumeState, one file with
// one loop device, no temp file, and no other volume file than those of live
// VolumeStates. The PVC is then deleted and everything of it is gone.
func (e *Env) AgentRestartMidProvisioning(ctx context.Context) error {
	const name = "restart-data"
	return e.step("kill the agent mid-provisioning, restart it → PVC "+name+" Bound once, no orphan, no duplicate",
		[]string{"plinth-agent-" + StorageNode, "plinth-csi", "csi-provisioner"}, func() (string, error) {
			agent := e.procs["plinth-agent-"+StorageNode]
			if agent == nil || e.agentSpec == nil {
				return "", fmt.Errorf("no agent running")
			}
			pid := agent.PID()
			if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
				return "", fmt.Errorf("freeze agent pid %d: %w", pid, err)
			}
			resumed := false
			defer func() {
				if !resumed {
					_ = syscall.Kill(pid, syscall.SIGCONT)
				}
			}()
			pvc, err := e.claim(ctx, name, QuickstartClass)
			if err != nil {
				return "", err
			}
			// pvc.UID is set by Create; the CSI name is the PV name pvc-<uid>.
			id := storev1.VolumeID("pvc-" + string(pvc.UID))
			file := filepath.Join(e.VolumeDir, id+".img")
			var vs storev1.VolumeState
			if err := poll(ctx, 3*time.Minute, func() error {
				return e.Client.Get(ctx, client.ObjectKey{Name: id}, &vs)
			}); err != nil {
				return "", fmt.Errorf("VolumeState of %s never created by CreateVolume: %w", name, err)
			}
			created := vs.Status.Phase
			// Resume and kill at the first sign of work: stat in a tight loop, the API
			// between stats every few milliseconds.
			caught := ""
			resumed = true
			if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
				return "", err
			}
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
			_ = syscall.Kill(pid, syscall.SIGKILL)
			<-agent.Done()
			if caught == "" {
				return "", fmt.Errorf("the agent showed no work on %s within a minute of resuming", id)
			}
			if err := e.Client.Get(ctx, client.ObjectKey{Name: id}, &vs); err != nil {
				return "", err
			}
			atKill := fmt.Sprintf("killed agent pid %d at: %s (VolumeState phase %q)", pid, caught, vs.Status.Phase)
			if vs.Status.Phase == storev1.VolumeReady {
				atKill += " — the agent had already finished: the window was missed this time"
			}
			p, err := e.start(ctx, *e.agentSpec)
			if err != nil {
				return "", fmt.Errorf("restart agent: %w", err)
			}
			start := time.Now()
			if _, err := e.waitBound(ctx, name, 3*time.Minute); err != nil {
				return "", err
			}
			bound := time.Since(start)
			if _, err := e.waitVolumeReady(ctx, id); err != nil {
				return "", err
			}
			check, err := e.checkNoOrphans(ctx, name, id)
			if err != nil {
				return "", err
			}
			if err := e.unclaim(ctx, name, id); err != nil {
				return "", err
			}
			return fmt.Sprintf("%s\nagent restarted (pid %d); PVC Bound %.1fs later\n%s\nPVC deleted → PV, VolumeState, file and loop device gone",
				atKill, p.PID(), bound.Seconds(), check), nil
		})
}

// checkNoOrphans asserts one PV for claim, one VolumeState for it (id), its
// file with exactly one loop device, no temp files, and no volume file
// without a VolumeState.
func (e *Env) checkNoOrphans(ctx context.Context, claim, id string) (string, error) {
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
	entries, err := os.ReadDir(e.VolumeDir)
	if err != nil {
		return "", err
	}
	var files []string
	for _, en := range entries {
		f := en.Name()
		files = append(files, f)
		if strings.HasSuffix(f, ".tmp") {
			return "", fmt.Errorf("temp file %s left under %s", f, e.VolumeDir)
		}
		if vid, ok := strings.CutSuffix(f, ".img"); ok && !live[vid] {
			return "", fmt.Errorf("orphan volume file %s: no VolumeState %s", f, vid)
		}
	}
	devs := loopDevicesOf(filepath.Join(e.VolumeDir, id+".img"))
	if len(devs) != 1 {
		return "", fmt.Errorf("loop devices of %s: %v, want exactly one", id, devs)
	}
	return fmt.Sprintf("1 PV, 1 VolumeState %s (Ready), files under %s: %v, loop device %s: no orphan, no duplicate", id, e.VolumeDir, files, devs[0]), nil
}
