package devenv

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// The quickstart's names (examples/quickstart).
const (
	QuickstartPool       = "dev"
	QuickstartPlacement  = "dev"
	QuickstartProtocol   = "local"
	QuickstartClass      = "plinth-dev"
	QuickstartPVC        = "data"
	QuickstartNamespace  = "default"
	QuickstartPod        = "app"
	quickstartPolicyDir  = "/var/lib/plinth/dev"
	quickstartPolicyYAML = "pool.yaml protocol.yaml placement.yaml"
)

// Summary holds the measured figures of a scenario run.
type Summary struct {
	// PolicyReady is apply (or commit, with Flux) → all policy objects Ready.
	PolicyReady time.Duration
	// PVCBound is PVC (and pod) created → PVC Bound.
	PVCBound time.Duration
	// DriftShown is the hand edit → Drifted=True on the Placement.
	DriftShown time.Duration
	// VolumeID is the CSI volume id (VolumeState name) of the quickstart PVC.
	VolumeID string
	// VolumeFile is the volume's file on disk.
	VolumeFile string
}

// policyDocs returns the quickstart policy documents with the pool's file
// directory moved under the work directory.
func (e *Env) policyDocs() (map[string][]byte, error) {
	out := map[string][]byte{}
	for _, f := range strings.Fields(quickstartPolicyYAML) {
		data, err := os.ReadFile(filepath.Join(e.Root, "examples", "quickstart", f))
		if err != nil {
			return nil, err
		}
		s := strings.ReplaceAll(string(data), quickstartPolicyDir, e.VolumeDir)
		out[f] = []byte(s)
	}
	return out, nil
}

var policyKinds = []schema.GroupVersionKind{
	policyv1.GroupVersion.WithKind("StoragePool"),
	policyv1.GroupVersion.WithKind("Protocol"),
	policyv1.GroupVersion.WithKind("Placement"),
}

// conditionOf returns the status and message of condition typ on u when its
// observedGeneration is current ("" when absent or stale).
func conditionOf(u *unstructured.Unstructured, typ string) (status, reason, message string) {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, ci := range conds {
		m, _ := ci.(map[string]any)
		if m["type"] != typ {
			continue
		}
		if og, ok := m["observedGeneration"].(int64); ok && og != u.GetGeneration() {
			return "", "", "stale"
		}
		s, _ := m["status"].(string)
		r, _ := m["reason"].(string)
		msg, _ := m["message"].(string)
		return s, r, msg
	}
	return "", "", ""
}

// waitPolicyReady waits until the quickstart's pool, protocol and placement are Ready=True.
func (e *Env) waitPolicyReady(ctx context.Context, timeout time.Duration) (string, error) {
	names := map[string]string{"StoragePool": QuickstartPool, "Protocol": QuickstartProtocol, "Placement": QuickstartPlacement}
	var lines []string
	err := poll(ctx, timeout, func() error {
		lines = lines[:0]
		for _, gvk := range policyKinds {
			u := &unstructured.Unstructured{}
			u.SetGroupVersionKind(gvk)
			if err := e.Client.Get(ctx, client.ObjectKey{Name: names[gvk.Kind]}, u); err != nil {
				return err
			}
			s, r, m := conditionOf(u, "Ready")
			if s != "True" {
				return fmt.Errorf("%s/%s Ready=%q %s: %s", gvk.Kind, u.GetName(), s, r, m)
			}
			lines = append(lines, fmt.Sprintf("%s/%s Ready", gvk.Kind, u.GetName()))
		}
		return nil
	})
	return strings.Join(lines, ", "), err
}

// ApplyPolicy applies the quickstart policy directly (no Flux) and waits for it to be Ready.
func (e *Env) ApplyPolicy(ctx context.Context, sum *Summary) error {
	return e.rep.run("apply the quickstart policy (examples/quickstart) and wait for Ready", func() (string, error) {
		docs, err := e.policyDocs()
		if err != nil {
			return "", err
		}
		start := time.Now()
		for _, f := range strings.Fields(quickstartPolicyYAML) {
			objs, err := decodeObjects(docs[f])
			if err != nil {
				return "", err
			}
			for _, o := range objs {
				if err := e.apply(ctx, o); err != nil {
					return "", fmt.Errorf("%s: %w", f, err)
				}
			}
		}
		s, err := e.waitPolicyReady(ctx, 2*time.Minute)
		sum.PolicyReady = time.Since(start)
		return s, err
	})
}

// ShowRendered waits for and prints what the controller rendered and the agent reported.
func (e *Env) ShowRendered(ctx context.Context, _ *Summary) error {
	return e.rep.run("rendered StorageClass, Agent, Store; Store capacity from the agent", func() (string, error) {
		store := storev1.StoreName(QuickstartPool, StorageNode)
		var sc storagev1.StorageClass
		var ag storev1.Agent
		var st storev1.Store
		err := poll(ctx, 2*time.Minute, func() error {
			if err := e.Client.Get(ctx, client.ObjectKey{Name: QuickstartClass}, &sc); err != nil {
				return err
			}
			if err := e.Client.Get(ctx, client.ObjectKey{Name: StorageNode}, &ag); err != nil {
				return err
			}
			if err := e.Client.Get(ctx, client.ObjectKey{Name: store}, &st); err != nil {
				return err
			}
			if st.Status.Capacity == nil || st.Status.Capacity.Available <= 0 {
				return fmt.Errorf("store %s reports no capacity yet", store)
			}
			return nil
		})
		if err != nil {
			return "", err
		}
		c := st.Status.Capacity
		return fmt.Sprintf("StorageClass %s: provisioner %s, parameters %v, binding %s\nAgent %s: stores %v\nStore %s: total %s, allocatable %s, provisioned %s, available %s",
			sc.Name, sc.Provisioner, sc.Parameters, deref(sc.VolumeBindingMode), ag.Name, ag.Spec.Stores, st.Name,
			bytesStr(c.Total), bytesStr(c.Allocatable), bytesStr(c.Provisioned), bytesStr(c.Available)), nil
	})
}

func deref[T any](p *T) any {
	if p == nil {
		return "<nil>"
	}
	return *p
}

func bytesStr(b int64) string {
	switch {
	case b >= 1<<30:
		return fmt.Sprintf("%.2fGiB", float64(b)/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.1fMiB", float64(b)/(1<<20))
	}
	return fmt.Sprintf("%dB", b)
}

// Claim creates the quickstart PVC and a pod using it, waits for the pod to
// be scheduled and the PVC Bound, and shows the VolumeState and the file on disk.
func (e *Env) Claim(ctx context.Context, sum *Summary) error {
	var pv corev1.PersistentVolume
	if err := e.rep.run("PVC "+QuickstartNamespace+"/"+QuickstartPVC+" + pod "+QuickstartPod+" → scheduled, PVC Bound", func() (string, error) {
		objs, err := readObjects(filepath.Join(e.Root, "examples", "quickstart", "pvc.yaml"))
		if err != nil {
			return "", err
		}
		start := time.Now()
		for _, o := range objs {
			if err := e.apply(ctx, o); err != nil {
				return "", err
			}
		}
		if err := e.Client.Create(ctx, quickstartPod()); err != nil && !apierrors.IsAlreadyExists(err) {
			return "", err
		}
		var pod corev1.Pod
		var pvc corev1.PersistentVolumeClaim
		err = poll(ctx, 3*time.Minute, func() error {
			if err := e.Client.Get(ctx, client.ObjectKey{Namespace: QuickstartNamespace, Name: QuickstartPVC}, &pvc); err != nil {
				return err
			}
			if err := e.Client.Get(ctx, client.ObjectKey{Namespace: QuickstartNamespace, Name: QuickstartPod}, &pod); err != nil {
				return err
			}
			// The PVC is Bound before the scheduler's VolumeBinding PreBind returns and binds
			// the pod, so wait for both.
			if pvc.Status.Phase != corev1.ClaimBound || pod.Spec.NodeName == "" {
				return fmt.Errorf("PVC %s, pod on %q", pvc.Status.Phase, pod.Spec.NodeName)
			}
			return e.Client.Get(ctx, client.ObjectKey{Name: pvc.Spec.VolumeName}, &pv)
		})
		sum.PVCBound = time.Since(start)
		if err != nil {
			return "", err
		}
		if pod.Spec.NodeName != StorageNode {
			return "", fmt.Errorf("pod bound to %q, want the storage node %s", pod.Spec.NodeName, StorageNode)
		}
		size := pv.Spec.Capacity[corev1.ResourceStorage]
		return fmt.Sprintf("PVC Bound to %s (%s) in %.1fs; pod %s bound to %s by plinth-scheduler", pv.Name, size.String(), sum.PVCBound.Seconds(), pod.Name, pod.Spec.NodeName), nil
	}); err != nil {
		return err
	}
	return e.rep.run("VolumeState Ready and the volume on disk", func() (string, error) {
		id := pv.Spec.CSI.VolumeHandle
		sum.VolumeID = id
		var vs storev1.VolumeState
		if err := poll(ctx, time.Minute, func() error {
			if err := e.Client.Get(ctx, client.ObjectKey{Name: id}, &vs); err != nil {
				return err
			}
			if vs.Status.Phase != storev1.VolumeReady {
				return fmt.Errorf("VolumeState %s phase %s", id, vs.Status.Phase)
			}
			return nil
		}); err != nil {
			return "", err
		}
		files, _ := filepath.Glob(filepath.Join(e.VolumeDir, id+"*"))
		if len(files) != 1 {
			return "", fmt.Errorf("want one file for %s under %s, found %v", id, e.VolumeDir, files)
		}
		sum.VolumeFile = files[0]
		fi, err := os.Stat(files[0])
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("VolumeState %s: phase %s, device %s, %s\nfile %s (%s apparent size)",
			vs.Name, vs.Status.Phase, vs.Status.DevicePath, bytesStr(vs.Status.ActualBytes), files[0], bytesStr(fi.Size())), nil
	})
}

func quickstartPod() *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: QuickstartPod, Namespace: QuickstartNamespace},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "app", Image: "busybox", Command: []string{"sleep", "infinity"},
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: QuickstartPVC}}}},
		},
	}
}

// HandDrift edits the rendered StorageClass by hand (allowVolumeExpansion →
// false, a field Plinth owns) and waits for the Placement's Drifted=True and
// plinth_drift_objects on the controller's /metrics. Under the quickstart's
// driftPolicy Report the edit stays; the step then restores it.
func (e *Env) HandDrift(ctx context.Context, sum *Summary) error {
	return e.rep.run("edit StorageClass "+QuickstartClass+" by hand → Placement Drifted", func() (string, error) {
		var sc storagev1.StorageClass
		if err := e.Client.Get(ctx, client.ObjectKey{Name: QuickstartClass}, &sc); err != nil {
			return "", err
		}
		no := false
		patch := client.MergeFrom(sc.DeepCopy())
		sc.AllowVolumeExpansion = &no
		start := time.Now()
		if err := e.Client.Patch(ctx, &sc, patch, client.FieldOwner("kubectl-edit")); err != nil {
			return "", err
		}
		var msg string
		err := poll(ctx, 90*time.Second, func() error {
			u := &unstructured.Unstructured{}
			u.SetGroupVersionKind(policyv1.GroupVersion.WithKind("Placement"))
			if err := e.Client.Get(ctx, client.ObjectKey{Name: QuickstartPlacement}, u); err != nil {
				return err
			}
			s, r, m := conditionOf(u, "Drifted")
			if s != "True" {
				return fmt.Errorf("Placement %s Drifted=%q", QuickstartPlacement, s)
			}
			msg = r + ": " + m
			return nil
		})
		sum.DriftShown = time.Since(start)
		if err != nil {
			return "", err
		}
		metric, err := scrape(e.ControllerMetrics, "plinth_drift_objects")
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("Placement %s Drifted=True after %.1fs (%s)\n%s", QuickstartPlacement, sum.DriftShown.Seconds(), msg, metric), nil
	})
}

// scrape returns the lines of metric name (non-zero samples) from a /metrics URL.
func scrape(url, name string) (string, error) {
	resp, err := http.Get(url) //nolint:gosec // loopback URL we built
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var lines []string
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, name+"{") || strings.HasPrefix(l, name+" ") {
			if !strings.HasSuffix(l, " 0") {
				lines = append(lines, l)
			}
		}
	}
	if len(lines) == 0 {
		return "", fmt.Errorf("%s: no non-zero %s sample", url, name)
	}
	return strings.Join(lines, "\n"), sc.Err()
}

// Release deletes the pod and the PVC (after the kubelet stand-in has
// unpublished) and waits until the PV, the VolumeState and the file are gone.
func (e *Env) Release(ctx context.Context, sum *Summary) error {
	return e.rep.run("delete pod and PVC → PV, VolumeState and file gone", func() (string, error) {
		zero := int64(0)
		pod := quickstartPod()
		if err := e.Client.Delete(ctx, pod, &client.DeleteOptions{GracePeriodSeconds: &zero}); err != nil && !apierrors.IsNotFound(err) {
			return "", err
		}
		pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: QuickstartNamespace, Name: QuickstartPVC}}
		if err := e.Client.Delete(ctx, pvc); err != nil && !apierrors.IsNotFound(err) {
			return "", err
		}
		err := poll(ctx, 3*time.Minute, func() error {
			var pvs corev1.PersistentVolumeList
			if err := e.Client.List(ctx, &pvs); err != nil {
				return err
			}
			if len(pvs.Items) > 0 {
				return fmt.Errorf("PV %s still there (%s)", pvs.Items[0].Name, pvs.Items[0].Status.Phase)
			}
			var vs storev1.VolumeState
			if err := e.Client.Get(ctx, client.ObjectKey{Name: sum.VolumeID}, &vs); !apierrors.IsNotFound(err) {
				return fmt.Errorf("VolumeState %s still there (%v)", sum.VolumeID, err)
			}
			if _, err := os.Stat(sum.VolumeFile); !os.IsNotExist(err) {
				return fmt.Errorf("file %s still there", sum.VolumeFile)
			}
			return nil
		})
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("PV, VolumeState %s and %s removed", sum.VolumeID, sum.VolumeFile), nil
	})
}

// Scenario runs the quickstart end to end on a running Env and returns the
// measured figures. Flux mode commits the policy to Git instead of applying it.
func (e *Env) Scenario(ctx context.Context) (*Summary, error) {
	sum := &Summary{}
	if e.Opts.Flux {
		if err := e.FluxPolicy(ctx, sum); err != nil {
			return sum, e.fail(err)
		}
	} else if err := e.ApplyPolicy(ctx, sum); err != nil {
		return sum, e.fail(err)
	}
	steps := []func(context.Context, *Summary) error{e.ShowRendered, e.Claim, e.Kubelet, e.HandDrift}
	if e.Opts.Flux {
		steps = append(steps, e.FluxEdit)
	}
	steps = append(steps, e.KubeletRelease, e.Release)
	for _, s := range steps {
		if err := s(ctx, sum); err != nil {
			return sum, e.fail(err)
		}
	}
	e.rep.printf("\nsummary: policy Ready %.1fs after %s, PVC Bound %.1fs after creation, drift shown %.1fs after the edit\n",
		sum.PolicyReady.Seconds(), map[bool]string{true: "the commit", false: "apply"}[e.Opts.Flux], sum.PVCBound.Seconds(), sum.DriftShown.Seconds())
	return sum, nil
}

func (e *Env) fail(err error) error {
	e.failureTails()
	return err
}
