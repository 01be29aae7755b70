package devenv

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/test/framework/cluster"
)

// The StatefulSet case: what an application on real nodes meets.
const (
	// XFSPlacement is the placement the workload case commits: an xfs,
	// expandable, WaitForFirstConsumer class spreading volumes over the nodes.
	// xfs because this host's root lacks CAP_SYS_RESOURCE, which ext4's online
	// resize needs (the guest suite proves ext4 growth).
	XFSPlacement = "xfs"
	// XFSClass is the StorageClass of XFSPlacement.
	XFSClass = "plinth-xfs"
	// WorkloadName names the StatefulSet, its headless Service and its pods' label.
	WorkloadName = "web"
	// WorkloadReplicas is the StatefulSet's size: one pod per dev node.
	WorkloadReplicas = 3

	xfsPlacementYAML = `# Application data: xfs (grows online), spread over the pool's nodes.
apiVersion: policy.plinth.dev/v1alpha1
kind: Placement
metadata:
  name: xfs
spec:
  poolRef: {name: dev}
  protocolRef: {name: local}
  storageClass:
    name: plinth-xfs
    reclaimPolicy: Delete
    volumeBindingMode: WaitForFirstConsumer
    allowVolumeExpansion: true
  filesystem:
    fsType: xfs
  strategy: Spreadout
  snapshotClass:
    name: plinth-xfs
    deletionPolicy: Delete
`
	// workloadScript writes 4 MiB of random data and its checksum once (the
	// first start on a fresh volume), then checks the checksum on every
	// start: a container whose volume lost data does not start. It is Ready
	// (workloadReady) only once this start is logged: without the probe a
	// container counted Ready the moment it started, and a check could read
	// starts.log before the first line was written.
	workloadScript = `cd /data || exit 1
if [ ! -f data.bin ]; then dd if=/dev/urandom of=data.bin bs=1M count=4 2>/dev/null && sha256sum data.bin > data.sha256 && sync; fi
sha256sum -c data.sha256 || exit 1
echo "$(hostname) started" >> starts.log
touch /tmp/started
exec sleep 86400`
	// workloadReady is the container's readiness: this container's start was
	// logged (/tmp is the container's own, gone with it).
	workloadReady = "test -f /tmp/started"
)

// WorkloadSummary holds the figures of the StatefulSet case.
type WorkloadSummary struct {
	// AllRunning is the StatefulSet created → every replica Running with its volume.
	AllRunning time.Duration
	// Restarted is a pod deleted → its replacement Running on the same node, data verified.
	Restarted time.Duration
	// PluginsBack is the agent and CSI node pods deleted → both replaced and Ready.
	PluginsBack time.Duration
	// Expanded is the PVC resized → the running container's df shows the new size.
	Expanded time.Duration
	// Restored is a PVC restored from a VolumeSnapshot created → its pod Running.
	Restored time.Duration
	// Uncordoned is uncordon → the drained pod Running again on its node.
	Uncordoned time.Duration
	// Released is scale to 0 and PVCs deleted → PVs, VolumeStates, files and loop devices gone.
	Released time.Duration
}

// workloadPod is the pod name of replica i.
func workloadPod(i int) string { return fmt.Sprintf("%s-%d", WorkloadName, i) }

// workloadPVC is the PVC name of replica i (volumeClaimTemplate "data").
func workloadPVC(i int) string { return "data-" + workloadPod(i) }

func workloadObjects() (*corev1.Service, *appsv1.StatefulSet) {
	labels := map[string]string{"app": WorkloadName}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: WorkloadName, Namespace: QuickstartNamespace, Labels: labels},
		Spec:       corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, Selector: labels},
	}
	class := XFSClass
	sts := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: WorkloadName, Namespace: QuickstartNamespace, Labels: labels},
		Spec: appsv1.StatefulSetSpec{
			Replicas:            ptr(int32(WorkloadReplicas)),
			ServiceName:         WorkloadName,
			PodManagementPolicy: appsv1.ParallelPodManagement,
			Selector:            &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					SchedulerName:                 SchedulerProfile,
					TerminationGracePeriodSeconds: ptr(int64(1)),
					Containers: []corev1.Container{{Name: "app", Image: BusyboxImage, Command: []string{"sh", "-c", workloadScript},
						VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}},
						ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"sh", "-c", workloadReady}}},
							PeriodSeconds: 1}}},
				},
			},
			VolumeClaimTemplates: []corev1.PersistentVolumeClaim{{
				ObjectMeta: metav1.ObjectMeta{Name: "data"},
				Spec: corev1.PersistentVolumeClaimSpec{
					StorageClassName: &class,
					AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
					Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
				},
			}},
		},
	}
	return svc, sts
}

// Workload runs the StatefulSet case on the real nodes, step by step: the
// xfs placement committed; a StatefulSet of three replicas Running, each
// volume staged and published by its node's kubelet; a pod deleted and back
// on its node with its data; the agent and CSI node pods deleted under
// mounted volumes; a PVC grown online; kubelet's volume stats; a snapshot
// restored into a larger PVC (workloadSnapshot); a drain; and the teardown.
// Each step is reported; the first failure ends the case.
func (e *Walk) Workload(ctx context.Context) (*WorkloadSummary, error) {
	ws := &WorkloadSummary{}
	for _, s := range []func(context.Context, *WorkloadSummary) error{e.workloadClass, e.workloadUp, e.workloadPodRestart,
		e.workloadPluginRestart, e.workloadExpand, e.workloadVolumeStats, e.workloadSnapshot, e.workloadDrain, e.workloadRelease} {
		if err := s(ctx, ws); err != nil {
			return ws, e.fail(err)
		}
	}
	e.rep.printf("\nStatefulSet %s on real nodes:\n", WorkloadName)
	e.rep.printf("  %-34s %5.1fs\n", fmt.Sprintf("%d replicas Running", WorkloadReplicas), ws.AllRunning.Seconds())
	e.rep.printf("  %-34s %5.1fs\n", "pod deleted → back, data verified", ws.Restarted.Seconds())
	e.rep.printf("  %-34s %5.1fs\n", "agent + CSI node pods replaced", ws.PluginsBack.Seconds())
	e.rep.printf("  %-34s %5.1fs\n", "PVC 1Gi → 2Gi seen by df (online)", ws.Expanded.Seconds())
	e.rep.printf("  %-34s %5.1fs\n", "restore of a snapshot → Running", ws.Restored.Seconds())
	e.rep.printf("  %-34s %5.1fs\n", "uncordon → drained pod Running", ws.Uncordoned.Seconds())
	e.rep.printf("  %-34s %5.1fs\n", "scale 0 + PVCs deleted → all gone", ws.Released.Seconds())
	return ws, nil
}

func (e *Walk) workloadClass(ctx context.Context, _ *WorkloadSummary) error {
	return e.step(e.verb()+": placement "+XFSPlacement+" (xfs, expandable, Spreadout) → StorageClass "+XFSClass, []string{BinKustomizeController, "controller"}, func() (string, error) {
		set := e.delivered.clone()
		set["placement-"+XFSPlacement+".yaml"] = []byte(xfsPlacementYAML)
		shown, err := e.deliver(ctx, "add placement xfs", set, true)
		if err != nil {
			return "", err
		}
		ready, err := e.waitPolicyReady(ctx, 2*time.Minute, XFSPlacement)
		if err != nil {
			return "", err
		}
		if err := poll(ctx, time.Minute, func() error {
			return e.Client.Get(ctx, client.ObjectKey{Name: XFSClass}, &storagev1.StorageClass{})
		}); err != nil {
			return "", err
		}
		return shown + "\n" + ready, nil
	})
}

// volumeOf returns the PV name and the CSI volume handle (the VolumeState's
// name) of the bound PVC name.
func (e *Walk) volumeOf(ctx context.Context, name string) (pv, id string, err error) {
	var pvc corev1.PersistentVolumeClaim
	if err := e.Client.Get(ctx, client.ObjectKey{Namespace: QuickstartNamespace, Name: name}, &pvc); err != nil {
		return "", "", err
	}
	if pvc.Status.Phase != corev1.ClaimBound {
		return "", "", fmt.Errorf("PVC %s is %s", name, pvc.Status.Phase)
	}
	var v corev1.PersistentVolume
	if err := e.Client.Get(ctx, client.ObjectKey{Name: pvc.Spec.VolumeName}, &v); err != nil {
		return "", "", err
	}
	if v.Spec.CSI == nil {
		return "", "", fmt.Errorf("PV %s of PVC %s is not a CSI volume", v.Name, name)
	}
	return v.Name, v.Spec.CSI.VolumeHandle, nil
}

// workloadPods returns the StatefulSet's pods by name.
func (e *Walk) workloadPods(ctx context.Context) (map[string]corev1.Pod, error) {
	var pods corev1.PodList
	if err := e.Client.List(ctx, &pods, client.InNamespace(QuickstartNamespace), client.MatchingLabels{"app": WorkloadName}); err != nil {
		return nil, err
	}
	out := map[string]corev1.Pod{}
	for _, p := range pods.Items {
		out[p.Name] = p
	}
	return out, nil
}

// waitPod waits until pod name is Running (and, when notUID is set, is a
// new pod, not the one with that UID) and returns it.
func (e *Walk) waitPod(ctx context.Context, name string, notUID types.UID, timeout time.Duration) (*corev1.Pod, error) {
	var pod corev1.Pod
	err := poll(ctx, timeout, func() error {
		if err := e.Client.Get(ctx, client.ObjectKey{Namespace: QuickstartNamespace, Name: name}, &pod); err != nil {
			return err
		}
		if notUID != "" && pod.UID == notUID {
			return fmt.Errorf("pod %s is still the old one", name)
		}
		if pod.Status.Phase != corev1.PodRunning || pod.DeletionTimestamp != nil {
			return fmt.Errorf("pod %s %s on %q: %s", name, pod.Status.Phase, pod.Spec.NodeName, podWhy(&pod))
		}
		for _, cs := range pod.Status.ContainerStatuses {
			if !cs.Ready {
				return fmt.Errorf("pod %s: container %s not ready", name, cs.Name)
			}
		}
		return nil
	})
	return &pod, err
}

// verifyData runs the checksum check inside pod name.
func (e *Walk) verifyData(ctx context.Context, name string) (string, error) {
	out, err := e.KubectlRun(ctx, "exec", "-n", QuickstartNamespace, name, "--", "sh", "-c", "cd /data && sha256sum -c data.sha256 && wc -l < starts.log")
	if err != nil {
		return "", err
	}
	if !strings.Contains(out, "data.bin: OK") {
		return "", fmt.Errorf("pod %s: checksum of its data: %q", name, out)
	}
	return strings.Join(strings.Fields(out), " "), nil
}

func (e *Walk) workloadUp(ctx context.Context, ws *WorkloadSummary) error {
	title := fmt.Sprintf("StatefulSet %s: %d replicas with volumeClaimTemplates on %s, scheduled by plinth-scheduler → Running, volumes published by kubelet",
		WorkloadName, WorkloadReplicas, XFSClass)
	return e.step(title, []string{"scheduler", "csi-controller", "csi-node", "agent"}, func() (string, error) {
		svc, sts := workloadObjects()
		start := time.Now()
		for _, o := range []client.Object{svc, sts} {
			if err := e.Client.Create(ctx, o); err != nil {
				return "", err
			}
		}
		var lines []string
		for i := range WorkloadReplicas {
			pod, err := e.waitPod(ctx, workloadPod(i), "", 4*time.Minute)
			if err != nil {
				return "", err
			}
			pv, id, err := e.volumeOf(ctx, workloadPVC(i))
			if err != nil {
				return "", err
			}
			mounts, err := e.podVolumeMounts(pod)
			if err != nil {
				return "", err
			}
			if len(mounts) != 1 {
				return "", fmt.Errorf("pod %s: mounts of its CSI volumes on %s: %v, want one", pod.Name, pod.Spec.NodeName, mounts)
			}
			if _, err := e.waitVolumeReady(ctx, id); err != nil {
				return "", err
			}
			lines = append(lines, fmt.Sprintf("%s Running on %s, PVC %s Bound to %s (VolumeState %s Ready), published at %s", pod.Name, pod.Spec.NodeName, workloadPVC(i), pv, id, mounts[0]))
		}
		ws.AllRunning = time.Since(start)
		for i := range WorkloadReplicas {
			out, err := e.verifyData(ctx, workloadPod(i))
			if err != nil {
				return "", err
			}
			lines = append(lines, workloadPod(i)+": "+out)
		}
		return fmt.Sprintf("%s\nall Running %.1fs after the StatefulSet was created", strings.Join(lines, "\n"), ws.AllRunning.Seconds()), nil
	})
}

// restartPod deletes pod name and waits for its replacement Running on the
// same node with its data verified; it returns the replacement.
func (e *Walk) restartPod(ctx context.Context, name string) (*corev1.Pod, string, error) {
	var old corev1.Pod
	if err := e.Client.Get(ctx, client.ObjectKey{Namespace: QuickstartNamespace, Name: name}, &old); err != nil {
		return nil, "", err
	}
	oldNode := e.Nodes.Node(old.Spec.NodeName)
	if oldNode == nil {
		return nil, "", fmt.Errorf("pod %s on unknown node %q", name, old.Spec.NodeName)
	}
	if err := e.Client.Delete(ctx, &old); err != nil {
		return nil, "", err
	}
	pod, err := e.waitPod(ctx, name, old.UID, 3*time.Minute)
	if err != nil {
		return nil, "", err
	}
	if pod.Spec.NodeName != old.Spec.NodeName {
		return nil, "", fmt.Errorf("pod %s came back on %s, its local volume is on %s", name, pod.Spec.NodeName, old.Spec.NodeName)
	}
	// The old pod's publish is undone: nothing of it stays mounted.
	if m, err := cluster.MountsUnder(podCSIDir(oldNode, old.UID)); err != nil || len(m) > 0 {
		return nil, "", fmt.Errorf("mounts of the deleted pod %s (%s) left on %s: %v %v", name, old.UID, oldNode.Name, m, err)
	}
	out, err := e.verifyData(ctx, name)
	if err != nil {
		return nil, "", err
	}
	return pod, out, nil
}

// podCSIDir is where kubelet publishes pod uid's CSI volumes on node n.
func podCSIDir(n *cluster.Node, uid types.UID) string {
	return filepath.Join(n.RootDir, "pods", string(uid), "volumes", "kubernetes.io~csi")
}

// csiMounts lists the CSI volume mounts of every pod on node n (the pods'
// other volumes — service account tokens, emptyDirs — are not counted).
func csiMounts(n *cluster.Node) ([]string, error) {
	dirs, err := filepath.Glob(filepath.Join(n.RootDir, "pods", "*", "volumes", "kubernetes.io~csi"))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, d := range dirs {
		m, err := cluster.MountsUnder(d)
		if err != nil {
			return nil, err
		}
		out = append(out, m...)
	}
	return out, nil
}

func (e *Walk) workloadPodRestart(ctx context.Context, ws *WorkloadSummary) error {
	name := workloadPod(0)
	return e.step("delete pod "+name+" → back on the same node, old publish undone, checksum verified", []string{"csi-node"}, func() (string, error) {
		start := time.Now()
		pod, out, err := e.restartPod(ctx, name)
		if err != nil {
			return "", err
		}
		ws.Restarted = time.Since(start)
		return fmt.Sprintf("%s Running again on %s after %.1fs: %s (starts on this volume)", name, pod.Spec.NodeName, ws.Restarted.Seconds(), out), nil
	})
}

// nodePluginPod returns the Plinth pod of component on node.
func (e *Walk) nodePluginPod(ctx context.Context, component, node string) (*corev1.Pod, error) {
	var pods corev1.PodList
	if err := e.Client.List(ctx, &pods, client.InNamespace(ControllerNamespace), client.MatchingLabels{"app.kubernetes.io/component": component}); err != nil {
		return nil, err
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Spec.NodeName == node && p.DeletionTimestamp == nil {
			return p, nil
		}
	}
	return nil, fmt.Errorf("no %s pod on node %s", component, node)
}

func (e *Walk) workloadPluginRestart(ctx context.Context, ws *WorkloadSummary) error {
	name := workloadPod(1)
	return e.step("delete the agent and CSI node pods under "+name+"'s mounted volume → mounts survive, writes go on; then the pod is deleted → unpublished and unstaged by the new plugin",
		[]string{"agent", "csi-node"}, func() (string, error) {
			var pod corev1.Pod
			if err := e.Client.Get(ctx, client.ObjectKey{Namespace: QuickstartNamespace, Name: name}, &pod); err != nil {
				return "", err
			}
			node := pod.Spec.NodeName
			before, err := e.podVolumeMounts(&pod)
			if err != nil || len(before) != 1 {
				return "", fmt.Errorf("pod %s volume mounts before: %v %v", name, before, err)
			}
			start := time.Now()
			olds := map[string]types.UID{}
			for _, comp := range []string{"agent", "csi-node"} {
				p, err := e.nodePluginPod(ctx, comp, node)
				if err != nil {
					return "", err
				}
				olds[comp] = p.UID
				if err := e.Client.Delete(ctx, p); err != nil {
					return "", err
				}
			}
			var lines []string
			for comp, uid := range olds {
				err := poll(ctx, 3*time.Minute, func() error {
					p, err := e.nodePluginPod(ctx, comp, node)
					if err != nil {
						return err
					}
					if p.UID == uid {
						return fmt.Errorf("%s pod on %s is still the old one", comp, node)
					}
					for _, c := range p.Status.Conditions {
						if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
							return nil
						}
					}
					return fmt.Errorf("%s pod %s on %s not Ready: %s", comp, p.Name, node, podWhy(p))
				})
				if err != nil {
					return "", err
				}
			}
			ws.PluginsBack = time.Since(start)
			lines = append(lines, fmt.Sprintf("agent and CSI node pods on %s replaced and Ready after %.1fs", node, ws.PluginsBack.Seconds()))
			after, err := e.podVolumeMounts(&pod)
			if err != nil || len(after) != 1 || after[0] != before[0] {
				return "", fmt.Errorf("pod %s volume mounts after the plugins restarted: %v %v (before %v)", name, after, err, before)
			}
			out, err := e.KubectlRun(ctx, "exec", "-n", QuickstartNamespace, name, "--", "sh", "-c",
				"cd /data && dd if=/dev/urandom of=after-restart.bin bs=1M count=1 2>/dev/null && sync && sha256sum -c data.sha256")
			if err != nil {
				return "", err
			}
			if !strings.Contains(out, "data.bin: OK") {
				return "", fmt.Errorf("pod %s after the plugin restart: %q", name, out)
			}
			lines = append(lines, fmt.Sprintf("mount %s survived; the pod wrote 1 MiB more and its data verifies", before[0]))
			back, verified, err := e.restartPod(ctx, name)
			if err != nil {
				return "", err
			}
			lines = append(lines, fmt.Sprintf("%s deleted → unpublished and unstaged by the restarted plugin, back on %s: %s", name, back.Spec.NodeName, verified))
			return strings.Join(lines, "\n"), nil
		})
}

// dfKiB is the size in KiB of /data in pod name (df -k).
func (e *Walk) dfKiB(ctx context.Context, name string) (int64, error) {
	out, err := e.KubectlRun(ctx, "exec", "-n", QuickstartNamespace, name, "--", "df", "-k", "/data")
	if err != nil {
		return 0, err
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	f := strings.Fields(lines[len(lines)-1])
	if len(f) < 2 {
		return 0, fmt.Errorf("df in %s: %q", name, out)
	}
	return strconv.ParseInt(f[1], 10, 64)
}

func (e *Walk) workloadExpand(ctx context.Context, ws *WorkloadSummary) error {
	name := workloadPod(2)
	return e.step("PVC "+workloadPVC(2)+" 1Gi → 2Gi while "+name+" runs → df in the container shows it, no restart", []string{"csi-controller", "csi-node", "agent"}, func() (string, error) {
		var pod corev1.Pod
		if err := e.Client.Get(ctx, client.ObjectKey{Namespace: QuickstartNamespace, Name: name}, &pod); err != nil {
			return "", err
		}
		before, err := e.dfKiB(ctx, name)
		if err != nil {
			return "", err
		}
		var pvc corev1.PersistentVolumeClaim
		if err := e.Client.Get(ctx, client.ObjectKey{Namespace: QuickstartNamespace, Name: workloadPVC(2)}, &pvc); err != nil {
			return "", err
		}
		patch := client.MergeFrom(pvc.DeepCopy())
		pvc.Spec.Resources.Requests[corev1.ResourceStorage] = resource.MustParse("2Gi")
		start := time.Now()
		if err := e.Client.Patch(ctx, &pvc, patch); err != nil {
			return "", err
		}
		var after int64
		err = poll(ctx, 3*time.Minute, func() error {
			var err error
			if after, err = e.dfKiB(ctx, name); err != nil {
				return err
			}
			// 2Gi less xfs's own metadata: well above the 1Gi it had.
			if after < 3*(1<<20)/2 {
				return fmt.Errorf("df in %s shows %d KiB", name, after)
			}
			return nil
		})
		if err != nil {
			return "", err
		}
		ws.Expanded = time.Since(start)
		var now corev1.Pod
		if err := e.Client.Get(ctx, client.ObjectKey{Namespace: QuickstartNamespace, Name: name}, &now); err != nil {
			return "", err
		}
		if now.UID != pod.UID || restarts(&now) != restarts(&pod) {
			return "", fmt.Errorf("pod %s was restarted during the expansion", name)
		}
		if err := poll(ctx, 2*time.Minute, func() error {
			if err := e.Client.Get(ctx, client.ObjectKey{Namespace: QuickstartNamespace, Name: pvc.Name}, &pvc); err != nil {
				return err
			}
			if got := pvc.Status.Capacity[corev1.ResourceStorage]; got.Cmp(resource.MustParse("2Gi")) < 0 {
				return fmt.Errorf("PVC %s status capacity %s", pvc.Name, got.String())
			}
			return nil
		}); err != nil {
			return "", err
		}
		return fmt.Sprintf("df /data in %s: %d KiB → %d KiB after %.1fs, same pod, no container restart; PVC status capacity 2Gi", name, before, after, ws.Expanded.Seconds()), nil
	})
}

func restarts(p *corev1.Pod) int32 {
	var n int32
	for _, cs := range p.Status.ContainerStatuses {
		n += cs.RestartCount
	}
	return n
}

// volumeStatsRE matches kubelet's volume stats series of a workload PVC.
var volumeStatsRE = regexp.MustCompile(`^kubelet_volume_stats_(capacity|used)_bytes\{[^}]*persistentvolumeclaim="(data-` + WorkloadName + `-\d+)"[^}]*\} (\S+)`)

func (e *Walk) workloadVolumeStats(ctx context.Context, _ *WorkloadSummary) error {
	return e.step("kubelet /metrics (through the API server's node proxy): kubelet_volume_stats_* of every workload PVC, from NodeGetVolumeStats", []string{"csi-node"}, func() (string, error) {
		pods, err := e.workloadPods(ctx)
		if err != nil {
			return "", err
		}
		var lines []string
		err = poll(ctx, 3*time.Minute, func() error {
			lines = lines[:0]
			seen := map[string]map[string]float64{}
			for _, pod := range pods {
				data, err := e.CS.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes", pod.Spec.NodeName, "proxy", "metrics").DoRaw(ctx)
				if err != nil {
					return fmt.Errorf("kubelet metrics of %s: %w", pod.Spec.NodeName, err)
				}
				for _, l := range strings.Split(string(data), "\n") {
					m := volumeStatsRE.FindStringSubmatch(l)
					if m == nil {
						continue
					}
					v, err := strconv.ParseFloat(m[3], 64)
					if err != nil {
						return fmt.Errorf("%s: %w", l, err)
					}
					if seen[m[2]] == nil {
						seen[m[2]] = map[string]float64{}
					}
					seen[m[2]][m[1]] = v
				}
			}
			for i := range WorkloadReplicas {
				s := seen[workloadPVC(i)]
				// Every replica wrote 4 MiB of data; capacity is the filesystem's.
				if s["capacity"] < 512<<20 || s["used"] < 4<<20 {
					return fmt.Errorf("kubelet_volume_stats of %s: %v (kubelet gathers them once a minute)", workloadPVC(i), s)
				}
				lines = append(lines, fmt.Sprintf("%s: capacity %s, used %s", workloadPVC(i), bytesStr(int64(s["capacity"])), bytesStr(int64(s["used"]))))
			}
			return nil
		})
		if err != nil {
			return "", err
		}
		sort.Strings(lines)
		return strings.Join(lines, "\n"), nil
	})
}

func (e *Walk) workloadDrain(ctx context.Context, ws *WorkloadSummary) error {
	name := workloadPod(0)
	return e.step("kubectl drain the node of "+name+" → the pod stays Pending with the reason (its local volume cannot move), nothing deleted; uncordon → Running with its data",
		[]string{"scheduler"}, func() (string, error) {
			var pod corev1.Pod
			if err := e.Client.Get(ctx, client.ObjectKey{Namespace: QuickstartNamespace, Name: name}, &pod); err != nil {
				return "", err
			}
			node := pod.Spec.NodeName
			pvName, id, err := e.volumeOf(ctx, workloadPVC(0))
			if err != nil {
				return "", err
			}
			// Only the workload's pods are evicted: Plinth's own Deployments stay where they run.
			if _, err := e.KubectlRun(ctx, "drain", node, "--pod-selector", "app="+WorkloadName, "--ignore-daemonsets", "--timeout", "50s"); err != nil {
				return "", err
			}
			var reason string
			err = poll(ctx, 2*time.Minute, func() error {
				var p corev1.Pod
				if err := e.Client.Get(ctx, client.ObjectKey{Namespace: QuickstartNamespace, Name: name}, &p); err != nil {
					return err
				}
				if p.UID == pod.UID {
					return fmt.Errorf("pod %s not evicted yet", name)
				}
				if p.Status.Phase != corev1.PodPending || p.Spec.NodeName != "" {
					return fmt.Errorf("pod %s %s on %q, want Pending and unscheduled", name, p.Status.Phase, p.Spec.NodeName)
				}
				for _, c := range p.Status.Conditions {
					if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && volumeCannotMove(c.Message) {
						reason = c.Reason + ": " + c.Message
						return nil
					}
				}
				return fmt.Errorf("pod %s Pending without the volume's reason yet: %s", name, podWhy(&p))
			})
			if err != nil {
				return "", err
			}
			// Nothing of the volume went away.
			if err := e.Client.Get(ctx, client.ObjectKey{Name: pvName}, &corev1.PersistentVolume{}); err != nil {
				return "", fmt.Errorf("PV %s during the drain: %w", pvName, err)
			}
			if _, err := e.waitVolumeReady(ctx, id); err != nil {
				return "", err
			}
			if f := e.volumeFiles(id); len(f) != 1 {
				return "", fmt.Errorf("files of volume %s during the drain: %v", id, f)
			}
			start := time.Now()
			if _, err := e.KubectlRun(ctx, "uncordon", node); err != nil {
				return "", err
			}
			back, err := e.waitPod(ctx, name, "", 3*time.Minute)
			if err != nil {
				return "", err
			}
			ws.Uncordoned = time.Since(start)
			if back.Spec.NodeName != node {
				return "", fmt.Errorf("pod %s came back on %s, its volume is on %s", name, back.Spec.NodeName, node)
			}
			out, err := e.verifyData(ctx, name)
			if err != nil {
				return "", err
			}
			return fmt.Sprintf("%s drained: %s Pending — %s\nPV %s, VolumeState %s and its file kept\nuncordon → %s Running on %s after %.1fs: %s",
				node, name, reason, pvName, id, name, node, ws.Uncordoned.Seconds(), out), nil
		})
}

// volumeCannotMove reports whether a PodScheduled message says the pod's
// volume pins it to a node it cannot go to (the VolumeBinding plugin's words).
func volumeCannotMove(msg string) bool {
	return strings.Contains(msg, "didn't match PersistentVolume's node affinity") || strings.Contains(msg, "volume node affinity conflict")
}

func (e *Walk) workloadRelease(ctx context.Context, ws *WorkloadSummary) error {
	return e.step("scale "+WorkloadName+" to 0 and delete its PVCs → PVs, VolumeStates, files and loop devices gone on every node", agentAndCSI, func() (string, error) {
		var pvs, ids []string
		for i := range WorkloadReplicas {
			pv, id, err := e.volumeOf(ctx, workloadPVC(i))
			if err != nil {
				return "", err
			}
			pvs, ids = append(pvs, pv), append(ids, id)
		}
		start := time.Now()
		var sts appsv1.StatefulSet
		if err := e.Client.Get(ctx, client.ObjectKey{Namespace: QuickstartNamespace, Name: WorkloadName}, &sts); err != nil {
			return "", err
		}
		patch := client.MergeFrom(sts.DeepCopy())
		sts.Spec.Replicas = ptr(int32(0))
		if err := e.Client.Patch(ctx, &sts, patch); err != nil {
			return "", err
		}
		if err := poll(ctx, 2*time.Minute, func() error {
			pods, err := e.workloadPods(ctx)
			if err != nil {
				return err
			}
			if len(pods) > 0 {
				return fmt.Errorf("%d pods of %s left", len(pods), WorkloadName)
			}
			return nil
		}); err != nil {
			return "", err
		}
		for i := range WorkloadReplicas {
			pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: QuickstartNamespace, Name: workloadPVC(i)}}
			if err := e.Client.Delete(ctx, pvc); err != nil && !apierrors.IsNotFound(err) {
				return "", err
			}
		}
		err := poll(ctx, 3*time.Minute, func() error {
			for i, id := range ids {
				if err := e.Client.Get(ctx, client.ObjectKey{Name: pvs[i]}, &corev1.PersistentVolume{}); !apierrors.IsNotFound(err) {
					return fmt.Errorf("PV %s still there (%v)", pvs[i], err)
				}
				if err := e.Client.Get(ctx, client.ObjectKey{Name: id}, &storev1.VolumeState{}); !apierrors.IsNotFound(err) {
					return fmt.Errorf("VolumeState %s still there (%v)", id, err)
				}
				if f := e.volumeFiles(id); len(f) > 0 {
					return fmt.Errorf("files %v still there", f)
				}
				if devs := loopDevicesOf(id); len(devs) > 0 {
					return fmt.Errorf("loop devices %v of %s still attached", devs, id)
				}
			}
			return nil
		})
		if err != nil {
			return "", err
		}
		ws.Released = time.Since(start)
		for _, o := range []client.Object{&sts, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: QuickstartNamespace, Name: WorkloadName}}} {
			if err := e.Client.Delete(ctx, o); err != nil && !apierrors.IsNotFound(err) {
				return "", err
			}
		}
		// No CSI volume of any pod left mounted on any node.
		for _, n := range e.Nodes.Nodes {
			if m, err := csiMounts(n); err != nil || len(m) > 0 {
				return "", fmt.Errorf("CSI volume mounts left on %s: %v %v", n.Name, m, err)
			}
		}
		return fmt.Sprintf("%d PVs, VolumeStates, files and loop devices gone %.1fs after scale to 0", len(ids), ws.Released.Seconds()), nil
	})
}
