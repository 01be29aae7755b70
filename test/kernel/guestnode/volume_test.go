package guestnode

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/controllers/policy"
	"github.com/plinth-storage/plinth/csi"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/test/framework/controlplane"
)

// The NVMe-oF/TCP class on the storage guest's thin pool: the relay's private network, where
// the storage node exports and the worker connects.
const (
	volumeClass = agentPool + "-nvme"
	nvmePort    = 4420
	netCIDR     = "192.168.77.0/24"
	volumeNS    = "default"
)

// startControlSide runs, as host processes against the same API server, what the shipped
// controller Deployments run (those Deployments are not installed here yet): the policy
// controller (with the DH-HMAC-CHAP key server on keyServerAddr, which the guests reach under
// its Service name) and the CSI controller service in this process, csi-provisioner and
// csi-attacher from the test bin folder on its socket.
func startControlSide(t *testing.T, cp *controlplane.ControlPlane, keyServerAddr string) {
	t.Helper()
	controlplane.RequireBinaries(t, controlplane.BinCSIProvisioner, controlplane.BinCSIAttacher)
	ctx, cancel := context.WithCancel(context.Background())
	mgr, _, err := policy.NewManager(ctx, policy.Options{Config: cp.Admin.Config, MetricsAddr: "0", HealthAddr: "0",
		Namespace: "plinth-system", KeyServerAddr: keyServerAddr, Logger: testr.NewWithOptions(t, testr.Options{Verbosity: 0}), SkipNameValidation: true})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	mgrDone := make(chan error, 1)
	go func() { mgrDone <- mgr.Start(ctx) }()
	sock := filepath.Join(t.TempDir(), "csi.sock")
	d, err := csi.New(csi.Options{Mode: csi.ModeController, Endpoint: "unix://" + sock, Config: cp.Admin.Config,
		WaitTimeout: 3 * time.Minute, Log: testr.NewWithOptions(t, testr.Options{Verbosity: 1})})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	csiDone := make(chan error, 1)
	go func() { csiDone <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-mgrDone; err != nil {
			t.Errorf("policy controller: %v", err)
		}
		if err := <-csiDone; err != nil {
			t.Errorf("csi controller: %v", err)
		}
	})
	select {
	case <-d.Serving():
	case err := <-csiDone:
		t.Fatalf("csi controller stopped at start: %v", err)
	}
	for _, sc := range []struct {
		bin  string
		args []string
	}{
		{controlplane.BinCSIProvisioner, []string{"--feature-gates=Topology=true", "--extra-create-metadata"}},
		{controlplane.BinCSIAttacher, nil},
	} {
		args := append([]string{"--kubeconfig=" + cp.Admin.Kubeconfig, "--leader-election=false", "--v=3",
			"--kube-api-qps=50", "--kube-api-burst=100", "--csi-address=" + sock, "--timeout=60s"}, sc.args...)
		p, err := cp.StartProcess(t.Context(), controlplane.ProcessSpec{Name: sc.bin + "-guestnode", Binary: sc.bin, Args: args})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("--- %s log, last lines:\n%s", p.Name, p.Tail(40))
			}
			p.Stop() //nolint:errcheck
		})
	}
}

var sumLine = regexp.MustCompile(`(?m)([0-9a-f]{64})  /data/blob$`)

// testNVMeVolume: Expected: with the policy (a StoragePool on the storage guest's thin pool, a
// Protocol nvme-tcp on the relay's network with bidirectional DH-HMAC-CHAP, a Placement with an
// Immediate class) rendered by the policy controller, a PVC of that class is provisioned
// (csi-provisioner → CreateVolume → the agent's thin LV) and Bound; a pod on the worker guest
// gets it through its own kubelet: the attach-detach controller's VolumeAttachment is
// attached by csi-attacher (ControllerPublish: the worker's host NQN allowed on the storage
// node's target), the shipped node plugin stages it (nvme connect from its container on the
// host network, mkfs, mount) and publishes it into the pod. The pod mounts an NVMe namespace
// at /data, writes 8 MiB and its sha256; the log read through the API server has the sum of the
// data read back after the write, equal to the sum at write time, and the worker guest's kernel
// holds one NVMe/TCP controller to the storage guest's address; with the worker guest's page
// cache dropped, the file read through kubelet's mount of the volume has the same sum.
func testNVMeVolume(t *testing.T, cs *kubernetes.Clientset, cp *controlplane.ControlPlane, nodes []*node, keyServerAddr string) {
	storage, worker := nodes[0], nodes[1]
	c, err := client.New(cp.Admin.Config, client.Options{Scheme: csi.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	// The same backend as the Store of the DaemonSet scenario: the controller takes it over
	// (server-side apply, forced) and adds the NVMe-oF endpoint to the storage node's Agent.
	backend := policyv1.Backend{LVM: &policyv1.LVMBackend{VolumeGroup: agentVG, Devices: []string{"/dev/vda"},
		ThinPool: &policyv1.ThinPool{Name: "pool", SizePercent: 80}}}
	for _, o := range []client.Object{
		&policyv1.StoragePool{ObjectMeta: metav1.ObjectMeta{Name: agentPool}, Spec: policyv1.StoragePoolSpec{
			NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelHostname: storage.name}},
			Backend:      backend, Reserve: "5%", OvercommitPercent: ptr.To[int32](400)}},
		&policyv1.Protocol{ObjectMeta: metav1.ObjectMeta{Name: volumeClass}, Spec: policyv1.ProtocolSpec{
			NVMeoFTCP: &policyv1.NVMeoFTCPProtocol{Port: nvmePort, BindCIDR: netCIDR, ACL: ptr.To(true),
				Auth: &policyv1.NVMeoFAuth{Mode: policyv1.AuthDHHMACCHAP, Hash: "sha256", DHGroup: "ffdhe2048", Bidirectional: true}}}},
		&policyv1.Placement{ObjectMeta: metav1.ObjectMeta{Name: volumeClass}, Spec: policyv1.PlacementSpec{
			PoolRef: policyv1.LocalObjectReference{Name: agentPool}, ProtocolRef: policyv1.LocalObjectReference{Name: volumeClass},
			StorageClass: policyv1.StorageClassTemplate{Name: volumeClass, VolumeBindingMode: "Immediate"},
			Filesystem:   policyv1.Filesystem{FSType: "ext4"}}},
	} {
		if err := c.Create(t.Context(), o); err != nil {
			t.Fatalf("create %T %s: %v", o, o.GetName(), err)
		}
	}
	startControlSide(t, cp, keyServerAddr)
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range nodes {
				t.Logf("%s:\n%s", n.name, n.try(time.Minute, "for f in /var/log/pods/plinth-system_*/*/0.log; do echo \"== $f\"; tail -n 25 $f; done; "+
					"ls /sys/class/nvme 2>&1; find /sys/kernel/config/nvmet -maxdepth 3 2>/dev/null | head -30; dmesg | tail -n 25"))
			}
		}
	})
	controlplane.Eventually(t, 3*time.Minute, time.Second, "StorageClass "+volumeClass+" rendered and the Agent's NVMe-oF endpoint", func() error {
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
	class := volumeClass
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "data", Namespace: volumeNS},
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: &class,
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("256Mi")}}}}
	if _, err := cs.CoreV1().PersistentVolumeClaims(volumeNS).Create(t.Context(), pvc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	const script = `set -e
grep ' /data ' /proc/mounts
dd if=/dev/urandom of=/data/blob bs=1M count=8 2>/dev/null
sha256sum /data/blob > /data/blob.sha256
sync
echo "written $(cat /data/blob.sha256)"
sha256sum /data/blob
echo done
exec sleep 3600`
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "nvme-writer", Namespace: volumeNS},
		Spec: corev1.PodSpec{NodeName: worker.name, RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "writer", Image: busyboxImage, ImagePullPolicy: corev1.PullNever,
				Command:      []string{"sh", "-c", script},
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data"}}}},
			TerminationGracePeriodSeconds: ptr.To[int64](1)}}
	if _, err := cs.CoreV1().Pods(volumeNS).Create(t.Context(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var bound time.Duration
	controlplane.Eventually(t, 5*time.Minute, time.Second, "PVC data Bound", func() error {
		p, err := cs.CoreV1().PersistentVolumeClaims(volumeNS).Get(t.Context(), "data", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Status.Phase != corev1.ClaimBound {
			return fmt.Errorf("phase %s", p.Status.Phase)
		}
		bound = time.Since(pvcStart)
		return nil
	})
	t.Logf("TIMING PVC created → Bound %s", bound.Round(time.Millisecond))
	controlplane.Eventually(t, 8*time.Minute, time.Second, "pod nvme-writer Running", func() error {
		p, err := cs.CoreV1().Pods(volumeNS).Get(t.Context(), pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
			logs, _ := cs.CoreV1().Pods(volumeNS).GetLogs(pod.Name, &corev1.PodLogOptions{}).DoRaw(t.Context())
			t.Fatalf("pod %s ended %s: %+v\n%s", pod.Name, p.Status.Phase, p.Status.ContainerStatuses, logs)
		}
		if p.Status.Phase != corev1.PodRunning {
			evs, _ := cs.CoreV1().Events(volumeNS).List(t.Context(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod.Name})
			var last string
			if evs != nil && len(evs.Items) > 0 {
				e := evs.Items[len(evs.Items)-1]
				last = e.Reason + ": " + e.Message
			}
			return fmt.Errorf("phase %s; last event %s", p.Status.Phase, last)
		}
		return nil
	})
	t.Logf("TIMING PVC created → pod Running on %s %s", worker.name, time.Since(pvcStart).Round(time.Millisecond))

	var logs string
	controlplane.Eventually(t, 2*time.Minute, time.Second, "the writer's log", func() error {
		b, err := cs.CoreV1().Pods(volumeNS).GetLogs(pod.Name, &corev1.PodLogOptions{}).DoRaw(t.Context())
		if err != nil {
			return err
		}
		if logs = string(b); !strings.Contains(logs, "\ndone") {
			return fmt.Errorf("log so far %q", logs)
		}
		return nil
	})
	t.Logf("log of %s:\n%s", pod.Name, logs)
	lines := strings.Split(strings.TrimSpace(logs), "\n")
	if !strings.HasPrefix(lines[0], "/dev/nvme") || !strings.Contains(lines[0], " /data ext4 ") {
		t.Errorf("mount of /data in the pod %q, want an NVMe namespace with ext4", lines[0])
	}
	sums := sumLine.FindAllStringSubmatch(logs, -1)
	if len(sums) != 2 || sums[0][1] != sums[1][1] {
		t.Errorf("sha256 lines %v, want two equal: the written and the read-back sum", sums)
	}
	pv, err := cs.CoreV1().PersistentVolumeClaims(volumeNS).Get(t.Context(), "data", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The data from the storage node: the worker guest's page cache dropped, the file read
	// through kubelet's mount of the volume for the pod.
	p, err := cs.CoreV1().Pods(volumeNS).Get(t.Context(), pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	blob := fmt.Sprintf("/var/lib/kubelet/pods/%s/volumes/kubernetes.io~csi/%s/mount/blob", p.UID, pv.Spec.VolumeName)
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
		if pvName := va.Spec.Source.PersistentVolumeName; pvName != nil && *pvName == pv.Spec.VolumeName && va.Status.Attached {
			attached = append(attached, va.Spec.NodeName)
		}
	}
	if len(attached) != 1 || attached[0] != worker.name {
		t.Errorf("VolumeAttachments of %s attached to %v, want [%s]", pv.Spec.VolumeName, attached, worker.name)
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
