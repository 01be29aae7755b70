package guestnode

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// The NVMe-oF/TCP class on the storage guest's thin pool: the relay's private network, where
// the storage node exports and the worker connects.
const (
	volumeClass = agentPool + "-nvme"
	nvmePort    = 4420
	netCIDR     = "192.168.77.0/24"
	volumeNS    = "default"
	// ctrlLossTmo / reconnectDelay: the worker's kernel keeps reconnecting a lost controller
	// for 12 s, every 2 s; a shorter cut pauses I/O, a longer one fails it.
	ctrlLossTmo    = 12
	reconnectDelay = 2
)

var sumLine = regexp.MustCompile(`(?m)([0-9a-f]{64})  /data/blob$`)

// testNVMeVolume: Expected: with the policy Flux applied (a Protocol nvme-tcp on the relay's
// network with bidirectional DH-HMAC-CHAP, a Placement with an Immediate ext4 class on the
// storage guest's pool: guestPolicy) rendered by the chart's controller, a StatefulSet's claim of that class is provisioned
// by the chart's CSI controller (csi-provisioner → CreateVolume → the agent's thin LV) and
// Bound; its pod, scheduled onto the worker guest (a nodeSelector, no nodeName), gets the
// volume through the worker's kubelet: the attach-detach controller's VolumeAttachment is
// attached by the chart's csi-attacher at the first try (ControllerPublish: the worker's host
// NQN allowed on the storage node's target, its DH-HMAC-CHAP key from the key server; no
// FailedAttachVolume event), the node plugin stages it (nvme connect from its container on the
// host network, authenticated both ways, mkfs, mount) and publishes it into the pod. The pod
// mounts an NVMe namespace at /data, writes 8 MiB and its sha256; the log read through the API
// server has the sum of the data read back after the write, equal to the sum at write time,
// and the worker guest's kernel holds one NVMe/TCP controller to the storage guest's address;
// with the worker guest's page cache dropped, the file read through kubelet's mount of the
// volume has the same sum.
func testNVMeVolume(t *testing.T, s *scene) {
	cs, c, nodes, storage, worker := s.cs, s.c, s.nodes, s.storage(), s.worker()
	t0 := time.Now()
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range nodes {
				t.Logf("%s:\n%s", n.name, n.try(time.Minute, "for f in /var/log/pods/plinth-system_*/*/0.log; do echo \"== $f\"; tail -n 25 $f; done; "+
					"ls /sys/class/nvme 2>&1; find /sys/kernel/config/nvmet -maxdepth 3 2>/dev/null | head -30; dmesg | tail -n 25"))
			}
		}
	})
	poll(t, 3*time.Minute, time.Second, "StorageClass "+volumeClass+" rendered and the Agent's NVMe-oF endpoint", func() error {
		if _, err := cs.StorageV1().StorageClasses().Get(t.Context(), volumeClass, metav1.GetOptions{}); err != nil {
			return err
		}
		var a storev1.Agent
		if err := c.Get(t.Context(), client.ObjectKey{Name: storage.name}, &a); err != nil {
			return err
		}
		if a.Spec.NVMeoF == nil || a.Spec.NVMeoF.Port != nvmePort || a.Spec.NVMeoF.BindCIDR != netCIDR {
			return fmt.Errorf("agent %s NVMe-oF endpoint %+v", a.Name, a.Spec.NVMeoF)
		}
		return nil
	})
	t.Logf("TIMING policy rendered %s", time.Since(t0).Round(time.Millisecond))

	pvcStart := time.Now()
	sts := writerSet(worker.name)
	if _, err := cs.AppsV1().StatefulSets(volumeNS).Create(t.Context(), sts, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var bound time.Duration
	poll(t, 5*time.Minute, time.Second, "PVC "+writerClaim+" Bound", func() error {
		p, err := cs.CoreV1().PersistentVolumeClaims(volumeNS).Get(t.Context(), writerClaim, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Status.Phase != corev1.ClaimBound {
			return fmt.Errorf("phase %s", p.Status.Phase)
		}
		bound = time.Since(pvcStart)
		return nil
	})
	t.Logf("TIMING StatefulSet created → PVC Bound %s", bound.Round(time.Millisecond))
	waitRunning(t, cs, writerPod)
	t.Logf("TIMING StatefulSet created → pod Running on %s %s", worker.name, time.Since(pvcStart).Round(time.Millisecond))
	p, err := cs.CoreV1().Pods(volumeNS).Get(t.Context(), writerPod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Spec.NodeName != worker.name {
		t.Errorf("pod %s scheduled on %s, want %s", writerPod, p.Spec.NodeName, worker.name)
	}
	// The first ControllerPublish with authentication attaches: no attach outlived
	// csi-attacher's timeout (an attach that failed at once because csi-attacher's informer had
	// not seen the new PV yet is retried at once and is not the data path's doing).
	evs, err := cs.CoreV1().Events(volumeNS).List(t.Context(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + writerPod + ",reason=FailedAttachVolume"})
	if err != nil {
		t.Fatal(err)
	}
	timedOut := 0
	for _, e := range evs.Items {
		t.Logf("FailedAttachVolume (x%d): %s", max(e.Count, 1), e.Message)
		if strings.Contains(e.Message, "DeadlineExceeded") || strings.Contains(e.Message, "deadline exceeded") || strings.Contains(e.Message, "timed out") {
			timedOut++
		}
	}
	if timedOut != 0 {
		t.Errorf("%d FailedAttachVolume events of %s for a timeout, want the first ControllerPublish to attach in time", timedOut, writerPod)
	}

	logs := writerLog(t, cs, writerPod)
	t.Logf("log of %s:\n%s", writerPod, logs)
	lines := strings.Split(strings.TrimSpace(logs), "\n")
	if !strings.HasPrefix(lines[0], "/dev/nvme") || !strings.Contains(lines[0], " /data ext4 ") {
		t.Errorf("mount of /data in the pod %q, want an NVMe namespace with ext4", lines[0])
	}
	sums := sumLine.FindAllStringSubmatch(logs, -1)
	if len(sums) != 2 || sums[0][1] != sums[1][1] {
		t.Fatalf("sha256 lines %v, want two equal: the written and the read-back sum", sums)
	}
	s.sum = sums[0][1]
	pvc, err := cs.CoreV1().PersistentVolumeClaims(volumeNS).Get(t.Context(), writerClaim, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The data from the storage node: the worker guest's page cache dropped, the file read
	// through kubelet's mount of the volume for the pod.
	blob := fmt.Sprintf("/var/lib/kubelet/pods/%s/volumes/kubernetes.io~csi/%s/mount/blob", p.UID, pvc.Spec.VolumeName)
	reread := strings.Fields(worker.sh(t, 2*time.Minute, "sync && echo 3 > /proc/sys/vm/drop_caches && sha256sum "+blob))
	if len(sums) == 0 || len(reread) == 0 || reread[0] != sums[0][1] {
		t.Errorf("sha256 of %s read in the worker guest after dropping its caches: %v, want the pod's %v", blob, reread, sums)
	}
	vas, err := cs.StorageV1().VolumeAttachments().List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var attached []string
	for _, va := range vas.Items {
		if pvName := va.Spec.Source.PersistentVolumeName; pvName != nil && *pvName == pvc.Spec.VolumeName && va.Status.Attached {
			attached = append(attached, va.Spec.NodeName)
		}
	}
	if len(attached) != 1 || attached[0] != worker.name {
		t.Errorf("VolumeAttachments of %s attached to %v, want [%s]", pvc.Spec.VolumeName, attached, worker.name)
	}
	out := worker.sh(t, time.Minute, "for c in /sys/class/nvme/nvme*; do echo \"$(cat $c/transport) $(cat $c/address)\"; done")
	if n := strings.Count(out, "tcp traddr="+storage.addr+","); n != 1 {
		t.Errorf("NVMe/TCP controllers to %s in the worker guest: %d, want 1\n%s", storage.addr, n, out)
	}
	// Authenticated both ways: the kernel keeps the host and controller secrets the node plugin
	// connected with (from the key server; sysfs shows them to root).
	secrets := strings.Fields(worker.sh(t, time.Minute, "for c in /sys/class/nvme/nvme*; do cat $c/dhchap_secret $c/dhchap_ctrl_secret; done"))
	if len(secrets) != 2 || !strings.HasPrefix(secrets[0], "DHHC-1:") || !strings.HasPrefix(secrets[1], "DHHC-1:") {
		t.Errorf("the worker's NVMe controller: %d DH-HMAC-CHAP secrets (want a host and a controller secret, DHHC-1)", len(secrets))
	}
}

// The writer StatefulSet, its pod and its claim (from the claim template "data").
const (
	writerSetName = "nvme-writer"
	writerPod     = writerSetName + "-0"
	writerClaim   = "data-" + writerPod
)

// writerScript writes 8 MiB and its sha256 on a fresh volume; on a volume that has them it only
// reads the data back. Either way it prints the mount of /data, the sum of the data now and
// "done"; then, every half second, it writes one 4 KiB block with O_DIRECT and fsync and prints
// "tick <start> <end> ok" or "tick <start> <end> err <message>" (the guest's uptime in
// seconds): how long each write took is the pod's view of the data path (parseTicks).
const writerScript = `set -e
grep ' /data ' /proc/mounts
if [ ! -f /data/blob.sha256 ]; then
  dd if=/dev/urandom of=/data/blob bs=1M count=8 2>/dev/null
  sha256sum /data/blob > /data/blob.sha256
  sync
  echo "written $(cat /data/blob.sha256)"
fi
sha256sum /data/blob
echo done
set +e
while :; do
  s=$(cut -d' ' -f1 /proc/uptime)
  if dd if=/dev/zero of=/data/tick bs=4k count=1 oflag=direct conv=notrunc,fsync 2>/tmp/e; then r=ok; else r="err $(tr '\n' ' ' </tmp/e)"; fi
  echo "tick $s $(cut -d' ' -f1 /proc/uptime) $r"
  sleep 0.5
done`

// writerSet is a StatefulSet of one busybox pod with a claim of volumeClass at /data, its pod
// scheduled onto the node named by a nodeSelector on the hostname label.
func writerSet(nodeName string) *appsv1.StatefulSet {
	labels := map[string]string{"app": writerSetName}
	class := volumeClass
	return &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: writerSetName, Namespace: volumeNS},
		Spec: appsv1.StatefulSetSpec{Replicas: ptr.To[int32](1), ServiceName: writerSetName,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{NodeSelector: map[string]string{corev1.LabelHostname: nodeName},
					Containers: []corev1.Container{{Name: "writer", Image: busyboxImage, ImagePullPolicy: corev1.PullNever,
						Command:      []string{"sh", "-c", writerScript},
						VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}}},
					TerminationGracePeriodSeconds: ptr.To[int64](1)}},
			VolumeClaimTemplates: []corev1.PersistentVolumeClaim{{ObjectMeta: metav1.ObjectMeta{Name: "data"},
				Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
					StorageClassName: &class,
					Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("256Mi")}}}}}}}
}

// waitRunning waits for pod name (in volumeNS) to run; its end or a failure fails t.
func waitRunning(t *testing.T, cs *kubernetes.Clientset, name string) {
	t.Helper()
	poll(t, 8*time.Minute, time.Second, "pod "+name+" Running", func() error {
		p, err := cs.CoreV1().Pods(volumeNS).Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
			logs, _ := cs.CoreV1().Pods(volumeNS).GetLogs(name, &corev1.PodLogOptions{}).DoRaw(t.Context())
			t.Fatalf("pod %s ended %s: %+v\n%s", name, p.Status.Phase, p.Status.ContainerStatuses, logs)
		}
		if p.Status.Phase != corev1.PodRunning {
			evs, _ := cs.CoreV1().Events(volumeNS).List(t.Context(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
			var last string
			if evs != nil && len(evs.Items) > 0 {
				e := evs.Items[len(evs.Items)-1]
				last = e.Reason + ": " + e.Message
			}
			return fmt.Errorf("phase %s; last event %s", p.Status.Phase, last)
		}
		return nil
	})
}

// writerLog waits for the writer pod's log to reach "done" and returns it.
func writerLog(t *testing.T, cs *kubernetes.Clientset, name string) string {
	t.Helper()
	var logs string
	poll(t, 2*time.Minute, time.Second, "the log of "+name, func() error {
		b, err := cs.CoreV1().Pods(volumeNS).GetLogs(name, &corev1.PodLogOptions{}).DoRaw(t.Context())
		if err != nil {
			return err
		}
		if logs = string(b); !strings.Contains(logs, "\ndone") {
			return fmt.Errorf("log so far %q", logs)
		}
		return nil
	})
	return logs
}
