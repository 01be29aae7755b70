package devenv

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/test/framework/monitoring"
)

// The quickstart's names (examples/quickstart).
const (
	QuickstartPool      = "dev"
	QuickstartPlacement = "dev"
	QuickstartProtocol  = "local"
	QuickstartClass     = "plinth-dev"
	// QuickstartSnapshotClass is the VolumeSnapshotClass the quickstart Placement renders
	// (spec.snapshotClass): a new user snapshots a PVC of plinth-dev with it.
	QuickstartSnapshotClass = "plinth-dev"
	QuickstartPVC           = "data"
	QuickstartNamespace     = "default"
	QuickstartPod           = "app"
	quickstartPolicyYAML    = "pool.yaml protocol.yaml placement.yaml"
)

// Walk is the quickstart scenario and the cases beyond it, driving a running
// Env as a user with kubectl and Git would. Its methods are the steps.
type Walk struct {
	*Env
	// delivered is the policy set last committed (or applied).
	delivered policySet
	// policyReady is the last deliver's commit (apply) → every policy object Ready.
	policyReady time.Duration
	// node is the node the quickstart pod runs on.
	node string
}

// NewWalk returns the scenario of env.
func NewWalk(env *Env) *Walk { return &Walk{Env: env} }

// Summary holds the measured figures of a scenario run.
type Summary struct {
	// PolicyReady is the first commit (apply without Flux) → all policy objects Ready.
	PolicyReady time.Duration
	// PVCBound is PVC (and pod) created → PVC Bound and the pod bound to its node.
	PVCBound time.Duration
	// DriftShown is the hand edit → Drifted=True on the Placement.
	DriftShown time.Duration
	// DriftCorrected is the commit of driftPolicy: Correct → the StorageClass restored.
	DriftCorrected time.Duration
	// ChangeReady is the commit growing the reserve and adding a placement → all Ready,
	// the new StorageClass there and the Store's allocatable capacity reduced.
	ChangeReady time.Duration
	// Rejected is the commit of an invalid policy → Stalled=True with the schema's message.
	Rejected time.Duration
	// Total is the whole scenario (Up not included).
	Total time.Duration
	// VolumeID is the CSI volume id (VolumeState name) of the quickstart PVC.
	VolumeID string
	// VolumeFile is the volume's file on disk.
	VolumeFile string
	// ObserveStart and ObserveEnd are the window over which Observe evaluated the dashboards
	// (the scenario's start → its panel step), for rendering them later.
	ObserveStart, ObserveEnd time.Time
	// Panels is what Observe's evaluation of every dashboard panel found.
	Panels monitoring.PanelReport
}

// policyDocs returns the quickstart policy documents as they are: the pool's
// file directory /var/lib/plinth/dev is a per-node folder on these nodes
// (the agent DaemonSet's /var/lib/plinth hostPath).
func (e *Walk) policyDocs() (policySet, error) {
	out := policySet{}
	for _, f := range strings.Fields(quickstartPolicyYAML) {
		data, err := os.ReadFile(filepath.Join(e.Root, "examples", "quickstart", f))
		if err != nil {
			return nil, err
		}
		out[f] = data
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

// waitPolicyReady waits until the quickstart's pool, protocol and placement
// (and the extra placements named) are Ready=True for their generation.
func (e *Walk) waitPolicyReady(ctx context.Context, timeout time.Duration, extraPlacements ...string) (string, error) {
	type ref struct {
		gvk  schema.GroupVersionKind
		name string
	}
	refs := []ref{{policyKinds[0], QuickstartPool}, {policyKinds[1], QuickstartProtocol}, {policyKinds[2], QuickstartPlacement}}
	for _, n := range extraPlacements {
		refs = append(refs, ref{policyKinds[2], n})
	}
	var lines []string
	err := poll(ctx, timeout, func() error {
		lines = lines[:0]
		for _, r := range refs {
			u := &unstructured.Unstructured{}
			u.SetGroupVersionKind(r.gvk)
			if err := e.Client.Get(ctx, client.ObjectKey{Name: r.name}, u); err != nil {
				return err
			}
			s, rs, m := conditionOf(u, "Ready")
			if s != "True" {
				return fmt.Errorf("%s/%s Ready=%q %s: %s", r.gvk.Kind, u.GetName(), s, rs, m)
			}
			lines = append(lines, fmt.Sprintf("%s/%s Ready: %s", r.gvk.Kind, u.GetName(), m))
		}
		return nil
	})
	return strings.Join(lines, "\n"), err
}

// Policy delivers the quickstart policy — with Flux: committed to the local
// Git repository, synced by source-controller and kustomize-controller
// through the GitRepository + Kustomization of kustomize/flux — and waits
// for the Kustomization and every policy object to be Ready.
func (e *Walk) Policy(ctx context.Context, sum *Summary) error {
	title := "apply the quickstart policy (examples/quickstart); policies Ready"
	if e.Opts.Flux {
		title = "commit the quickstart policy to Git; Flux syncs it; Kustomization and policies Ready"
	}
	return e.step(title, []string{BinSourceController, BinKustomizeController, "plinth-controller"}, func() (string, error) {
		set, err := e.policyDocs()
		if err != nil {
			return "", err
		}
		shown, err := e.startDelivery(ctx, set)
		if err != nil {
			return "", err
		}
		sum.PolicyReady = e.policyReady
		s, err := e.waitPolicyReady(ctx, 2*time.Minute)
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("%s\n%s", shown, s), nil
	})
}

// verb names how policy reaches the cluster, for the step lines.
func (e *Walk) verb() string {
	if e.Opts.Flux {
		return "commit"
	}
	return "apply"
}

// ShowRendered waits for and prints what the controller rendered (every
// StorageClass of Plinth's driver, Agents, Stores) and the capacity the agent
// reported on the quickstart's Store.
func (e *Walk) ShowRendered(ctx context.Context, _ *Summary) error {
	return e.step("rendered StorageClasses, VolumeSnapshotClasses, Agents, Stores; Store capacity from each node's agent", []string{"controller", "agent"}, func() (string, error) {
		err := poll(ctx, 2*time.Minute, func() error {
			var sc storagev1.StorageClass
			if err := e.Client.Get(ctx, client.ObjectKey{Name: QuickstartClass}, &sc); err != nil {
				return err
			}
			vsc := &unstructured.Unstructured{}
			vsc.SetGroupVersionKind(volumeSnapshotClassGVK)
			if err := e.Client.Get(ctx, client.ObjectKey{Name: QuickstartSnapshotClass}, vsc); err != nil {
				return fmt.Errorf("VolumeSnapshotClass %s: %w", QuickstartSnapshotClass, err)
			}
			for _, n := range e.Nodes.Nodes {
				store := storev1.StoreName(QuickstartPool, n.Name)
				var st storev1.Store
				if err := e.Client.Get(ctx, client.ObjectKey{Name: store}, &st); err != nil {
					return err
				}
				if st.Status.Capacity == nil || st.Status.Capacity.Available <= 0 {
					return fmt.Errorf("store %s reports no capacity yet", store)
				}
			}
			return nil
		})
		if err != nil {
			return "", err
		}
		return e.rendered(ctx)
	})
}

// rendered lists Plinth's StorageClasses, the Agents and the Stores with their capacity.
func (e *Walk) rendered(ctx context.Context) (string, error) {
	var lines []string
	var classes storagev1.StorageClassList
	if err := e.Client.List(ctx, &classes); err != nil {
		return "", err
	}
	for _, sc := range classes.Items {
		if sc.Provisioner != policyv1.DriverName {
			continue
		}
		lines = append(lines, fmt.Sprintf("StorageClass %s: placement %s, fstype %s, binding %s, allowVolumeExpansion %v",
			sc.Name, sc.Parameters[policyv1.ParamPlacement], sc.Parameters[policyv1.ParamFSType], deref(sc.VolumeBindingMode), deref(sc.AllowVolumeExpansion)))
	}
	snapClasses := &unstructured.UnstructuredList{}
	snapClasses.SetGroupVersionKind(volumeSnapshotClassGVK.GroupVersion().WithKind("VolumeSnapshotClassList"))
	if err := e.Client.List(ctx, snapClasses); err != nil {
		return "", err
	}
	for _, vsc := range snapClasses.Items {
		driver, _, _ := unstructured.NestedString(vsc.Object, "driver")
		policy, _, _ := unstructured.NestedString(vsc.Object, "deletionPolicy")
		if driver == policyv1.DriverName {
			lines = append(lines, fmt.Sprintf("VolumeSnapshotClass %s: deletionPolicy %s", vsc.GetName(), policy))
		}
	}
	var agents storev1.AgentList
	if err := e.Client.List(ctx, &agents); err != nil {
		return "", err
	}
	for _, ag := range agents.Items {
		lines = append(lines, fmt.Sprintf("Agent %s: stores %v", ag.Name, ag.Spec.Stores))
	}
	var stores storev1.StoreList
	if err := e.Client.List(ctx, &stores); err != nil {
		return "", err
	}
	for _, st := range stores.Items {
		if c := st.Status.Capacity; c != nil {
			lines = append(lines, fmt.Sprintf("Store %s: total %s, allocatable %s, provisioned %s, available %s",
				st.Name, bytesStr(c.Total), bytesStr(c.Allocatable), bytesStr(c.Provisioned), bytesStr(c.Available)))
		} else {
			lines = append(lines, fmt.Sprintf("Store %s: no capacity reported yet", st.Name))
		}
	}
	return strings.Join(lines, "\n"), nil
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
func (e *Walk) Claim(ctx context.Context, sum *Summary) error {
	var pv corev1.PersistentVolume
	if err := e.step("PVC "+QuickstartNamespace+"/"+QuickstartPVC+" + pod "+QuickstartPod+" → PVC Bound, pod Running with the volume (real kubelet)", []string{"scheduler", "csi-controller", "csi-node", "agent"}, func() (string, error) {
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
			if pvc.Status.Phase != corev1.ClaimBound || pod.Status.Phase != corev1.PodRunning {
				return fmt.Errorf("PVC %s, pod %s on %q: %s", pvc.Status.Phase, pod.Status.Phase, pod.Spec.NodeName, podWhy(&pod))
			}
			return e.Client.Get(ctx, client.ObjectKey{Name: pvc.Spec.VolumeName}, &pv)
		})
		sum.PVCBound = time.Since(start)
		if err != nil {
			return "", err
		}
		e.node = pod.Spec.NodeName
		// The Scheduled event names the profile that placed the pod: PlinthCapacity's.
		if err := poll(ctx, 30*time.Second, func() error {
			var evs eventsv1.EventList
			if err := e.Client.List(ctx, &evs, client.InNamespace(QuickstartNamespace)); err != nil {
				return err
			}
			for _, ev := range evs.Items {
				if ev.Regarding.Kind == "Pod" && ev.Regarding.Name == pod.Name && ev.Reason == "Scheduled" {
					if ev.ReportingController != SchedulerProfile {
						return fmt.Errorf("pod scheduled by %q, want the %s profile", ev.ReportingController, SchedulerProfile)
					}
					return nil
				}
			}
			return fmt.Errorf("no Scheduled event for pod %s yet", pod.Name)
		}); err != nil {
			return "", err
		}
		size := pv.Spec.Capacity[corev1.ResourceStorage]
		return fmt.Sprintf("PVC Bound to %s (%s); pod %s Running on %s %.1fs after the PVC was created, placed by plinth-scheduler (PlinthCapacity)", pv.Name, size.String(), pod.Name, pod.Spec.NodeName, sum.PVCBound.Seconds()), nil
	}); err != nil {
		return err
	}
	return e.step("VolumeState Ready and the volume on disk of "+e.node, agentAndCSI, func() (string, error) {
		id := pv.Spec.CSI.VolumeHandle
		sum.VolumeID = id
		vs, err := e.waitVolumeReady(ctx, id)
		if err != nil {
			return "", err
		}
		// the image (its identity record, <id>.id, is beside it once the agent stamped it)
		files, _ := filepath.Glob(filepath.Join(e.VolumeDir(e.node), id+".img"))
		if len(files) != 1 {
			return "", fmt.Errorf("want one file for %s under %s, found %v", id, e.VolumeDir(e.node), files)
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

// SchedulerProfile is the schedulerName with which pods opt in to
// PlinthCapacity: the profile of kustomize/scheduler/config.yaml, served by
// the plinth-scheduler Deployment.
const SchedulerProfile = "plinth-scheduler"

// BusyboxImage is the general-purpose image `make images` builds and Up
// imports into every node (Debian's busybox-static with its applet links).
const BusyboxImage = "docker.io/library/busybox:plinth"

func ptr[T any](v T) *T { return &v }

// podWhy says why a pod is not Running yet: its PodScheduled condition's
// message, or its containers' waiting reasons.
func podWhy(p *corev1.Pod) string {
	var why []string
	for _, c := range p.Status.Conditions {
		if c.Status != corev1.ConditionTrue && c.Message != "" {
			why = append(why, string(c.Type)+": "+c.Message)
		}
	}
	for _, cs := range p.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil {
			why = append(why, cs.Name+": "+w.Reason+" "+w.Message)
		}
	}
	return strings.Join(why, "; ")
}

func quickstartPod() *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: QuickstartPod, Namespace: QuickstartNamespace},
		Spec: corev1.PodSpec{
			// Opted in as in production (kustomize/scheduler): the profile with PlinthCapacity.
			SchedulerName:                 SchedulerProfile,
			TerminationGracePeriodSeconds: ptr(int64(1)),
			Containers: []corev1.Container{{Name: "app", Image: BusyboxImage, Command: []string{"sleep", "86400"},
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: QuickstartPVC}}}},
		},
	}
}

// HandDrift edits the rendered StorageClass by hand (allowVolumeExpansion →
// false, a field Plinth owns) and waits for the Placement's Drifted=True and
// plinth_drift_objects on the controller's /metrics. Under the quickstart's
// driftPolicy Report the edit stays (CorrectDrift then has Plinth revert it).
func (e *Walk) HandDrift(ctx context.Context, sum *Summary) error {
	return e.step("edit StorageClass "+QuickstartClass+" by hand → Placement Drifted", []string{"plinth-controller"}, func() (string, error) {
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
		metric, err := e.scrape(ctx, "controller", "8080", "plinth_drift_objects")
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("Placement %s Drifted=True after %.1fs (%s)\n%s", QuickstartPlacement, sum.DriftShown.Seconds(), msg, metric), nil
	})
}

// scrape returns the lines of metric name (non-zero samples) of the /metrics
// of the Plinth pod of component (app.kubernetes.io/component) on port,
// through the API server's pod proxy.
func (e *Walk) scrape(ctx context.Context, component, port, name string) (string, error) {
	pods, err := e.CS.CoreV1().Pods(ControllerNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=" + component})
	if err != nil {
		return "", err
	}
	if len(pods.Items) == 0 {
		return "", fmt.Errorf("no %s pod", component)
	}
	url := pods.Items[0].Name + ":" + port
	data, err := e.CS.CoreV1().Pods(ControllerNamespace).ProxyGet("http", pods.Items[0].Name, port, "metrics", nil).DoRaw(ctx)
	if err != nil {
		return "", fmt.Errorf("metrics of pod %s: %w", url, err)
	}
	var lines []string
	sc := bufio.NewScanner(bytes.NewReader(data))
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

// Release deletes the PVC (after PodGone) and waits until the PV, the
// VolumeState, the file and its loop device are gone.
func (e *Walk) Release(ctx context.Context, sum *Summary) error {
	return e.step("delete the PVC → PV, VolumeState, file and loop device gone", agentAndCSI, func() (string, error) {
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
			if devs := loopDevicesOf(sum.VolumeID); len(devs) > 0 {
				return fmt.Errorf("loop devices %v still attached", devs)
			}
			return nil
		})
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("PV, VolumeState %s and %s removed", sum.VolumeID, sum.VolumeFile), nil
	})
}

// waitVolumeReady polls (up to a minute) until the VolumeState id reports phase Ready.
func (e *Walk) waitVolumeReady(ctx context.Context, id string) (*storev1.VolumeState, error) {
	var vs storev1.VolumeState
	err := poll(ctx, time.Minute, func() error {
		if err := e.Client.Get(ctx, client.ObjectKey{Name: id}, &vs); err != nil {
			return err
		}
		if vs.Status.Phase != storev1.VolumeReady {
			return fmt.Errorf("VolumeState %s phase %s", id, vs.Status.Phase)
		}
		return nil
	})
	return &vs, err
}
