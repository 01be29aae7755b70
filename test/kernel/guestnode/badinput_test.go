package guestnode

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// hideModules moves the named modules' files (nvme-tcp, nvmet-tcp: the file names) out of
// node n's /lib/modules after unloading them, so that neither the node's modprobe nor a
// container's (the agent's init container mounts /lib/modules) can load them; restoreModules
// puts them back.
func hideModules(t *testing.T, n *node, files ...string) {
	t.Helper()
	n.sh(t, time.Minute, fmt.Sprintf(`set -e
mkdir -p /root/hidden-modules
for m in %[1]s; do
  modprobe -r $(echo $m | tr - _) 2>/dev/null || true
  test ! -d /sys/module/$(echo $m | tr - _) || { echo "$m still loaded"; exit 1; }
  f=$(find /lib/modules/$(uname -r) -name "$m.ko*" | head -1)
  [ -n "$f" ] || { echo "no file of $m"; exit 1; }
  echo "$f" >> /root/hidden-modules/list
  mv "$f" /root/hidden-modules/
done`, strings.Join(files, " ")))
}

func restoreModules(t *testing.T, n *node) {
	t.Helper()
	n.sh(t, time.Minute, `while read f; do mv /root/hidden-modules/$(basename $f) $f; done < /root/hidden-modules/list; rm /root/hidden-modules/list`)
}

// agentPod is the chart's agent pod on node n ("" when none).
func (s *scene) agentPod(t *testing.T, n *node) *corev1.Pod {
	t.Helper()
	pods, err := s.cs.CoreV1().Pods(plinthNS).List(t.Context(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=agent"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range pods.Items {
		if pods.Items[i].Spec.NodeName == n.name && pods.Items[i].DeletionTimestamp == nil {
			return &pods.Items[i]
		}
	}
	return nil
}

// testNodeLacksModules: Expected: the worker's kernel loses nvme_tcp and nvmet_tcp (unloaded,
// their files moved out of /lib/modules; no NVMe-oF connection is left there after the move).
// The worker's agent pod, made again, is not Ready: its modules init container fails, and its
// termination message in the pod's status names nvmet_tcp. A pod on the worker with a new
// NVMe-oF claim is attached, but kubelet's NodeStage fails FAILED_PRECONDITION naming
// nvme_tcp (a FailedMount event on the pod) and the pod does not run. With the modules back
// (nvme_tcp loaded), kubelet's own retry stages the volume and the pod runs; the agent pod
// made again is Ready (every DaemonSet rolled out).
func testNodeLacksModules(t *testing.T, s *scene) {
	w := s.worker()
	if out := w.sh(t, time.Minute, "ls /sys/class/nvme 2>/dev/null | wc -l"); strings.TrimSpace(out) != "0" {
		t.Fatalf("the worker has %s NVMe controllers; want none before its modules go", strings.TrimSpace(out))
	}
	hideModules(t, w, "nvme-tcp", "nvmet-tcp")
	restored := false
	defer func() {
		if !restored {
			restoreModules(t, w)
		}
	}()
	old := s.agentPod(t, w)
	if old == nil {
		t.Fatalf("no agent pod on %s", w.name)
	}
	if err := s.cs.CoreV1().Pods(plinthNS).Delete(t.Context(), old.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	var msg string
	poll(t, 5*time.Minute, time.Second, "the new agent pod on "+w.name+" failing its modules init container", func() error {
		p := s.agentPod(t, w)
		if p == nil || p.UID == old.UID {
			return fmt.Errorf("no new agent pod on %s yet", w.name)
		}
		for _, c := range p.Status.InitContainerStatuses {
			for _, term := range []*corev1.ContainerStateTerminated{c.State.Terminated, c.LastTerminationState.Terminated} {
				if c.Name == "modules" && term != nil && term.ExitCode != 0 {
					msg = term.Message
					for _, cond := range p.Status.Conditions {
						if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
							return fmt.Errorf("pod %s Ready although its init container failed", p.Name)
						}
					}
					return nil
				}
			}
		}
		return fmt.Errorf("pod %s: init containers %+v", p.Name, p.Status.InitContainerStatuses)
	})
	t.Logf("the agent pod's modules init container: %s", msg)
	if !strings.Contains(msg, "nvmet_tcp") && !strings.Contains(msg, "nvmet-tcp") {
		t.Errorf("the failed init container's message %q does not name nvmet_tcp", msg)
	}

	class := volumeClass
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "nomod-data", Namespace: volumeNS},
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, StorageClassName: &class,
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("64Mi")}}}}
	if _, err := s.cs.CoreV1().PersistentVolumeClaims(volumeNS).Create(t.Context(), pvc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "nomod-user", Namespace: volumeNS},
		Spec: corev1.PodSpec{NodeSelector: map[string]string{corev1.LabelHostname: w.name},
			Containers: []corev1.Container{{Name: "c", Image: busyboxImage, ImagePullPolicy: corev1.PullNever,
				Command:      []string{"sh", "-c", "grep ' /data ' /proc/mounts; echo done; exec sleep 3600"},
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: pvc.Name}}}},
			TerminationGracePeriodSeconds: ptr.To[int64](1)}}
	if _, err := s.cs.CoreV1().Pods(volumeNS).Create(t.Context(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var failed string
	poll(t, 5*time.Minute, 2*time.Second, "kubelet's FailedMount of "+pod.Name, func() error {
		evs, err := s.cs.CoreV1().Events(volumeNS).List(t.Context(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod.Name + ",reason=FailedMount"})
		if err != nil {
			return err
		}
		for _, e := range evs.Items {
			if strings.Contains(e.Message, "FailedPrecondition") {
				failed = e.Message
				return nil
			}
		}
		return fmt.Errorf("%d FailedMount events, none FailedPrecondition", len(evs.Items))
	})
	t.Logf("FailedMount: %s", failed)
	if !strings.Contains(failed, "nvme_tcp") {
		t.Errorf("the FailedMount event %q does not name nvme_tcp", failed)
	}
	if p, err := s.cs.CoreV1().Pods(volumeNS).Get(t.Context(), pod.Name, metav1.GetOptions{}); err != nil || p.Status.Phase == corev1.PodRunning {
		t.Errorf("pod %s without nvme_tcp on its node: %v, phase %s; want not Running", pod.Name, err, p.Status.Phase)
	}

	restoreModules(t, w)
	restored = true
	w.sh(t, time.Minute, "modprobe nvme_tcp")
	t0 := time.Now()
	waitRunning(t, s.cs, pod.Name)
	t.Logf("TIMING nvme_tcp back → pod Running by kubelet's retry %s", time.Since(t0).Round(time.Millisecond))
	if log := writerLog(t, s.cs, pod.Name); !strings.Contains(log, " /data ext4 ") {
		t.Errorf("the pod's /data: %q, want the NVMe-oF volume's ext4", log)
	}
	if p := s.agentPod(t, w); p != nil {
		if err := s.cs.CoreV1().Pods(plinthNS).Delete(t.Context(), p.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	poll(t, 5*time.Minute, 2*time.Second, "the agent pod on "+w.name+" Ready again", func() error {
		_, _, err := rolledOut(t.Context(), s.cs)
		return err
	})
}
