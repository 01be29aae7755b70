package guestnode

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/test/kernel/guest"
)

// shortCut is shorter than ctrlLossTmo: the kernel keeps the controller and reconnects.
const shortCut = 5 * time.Second

// testShortCut: Expected: the relay drops every frame between the guests for shortCut (less
// than ctrlLossTmo): the writer pod's O_DIRECT writes pause — one write spans the cut — and
// resume once the link is back; none of them fails.
func testShortCut(t *testing.T, s *scene) {
	w := s.worker()
	s.waitTicks(t, writerPod, w.uptimeF(t), 2*time.Minute)
	ctrlsBefore := controllers(t, w)
	before := s.relay.Counts()
	cutAt := w.uptimeF(t)
	s.relay.Cut()
	time.Sleep(shortCut) // the fault's length, not a wait for a condition
	s.relay.Restore()
	restoredAt := w.uptimeF(t)
	ticks := s.waitTicks(t, writerPod, restoredAt, 3*time.Minute)
	during := ticksBetween(ticks, cutAt, restoredAt)
	pause, failed := longest(during)
	t.Logf("MEASURE short cut of %.1f s (guest clock): longest write %.1f s over %d writes", restoredAt-cutAt, pause, len(during))
	if failed != 0 {
		t.Errorf("%d of %d writes across the short cut failed: %+v", failed, len(during), during)
	}
	if pause < (restoredAt-cutAt)/2 {
		t.Errorf("longest write across a %.1f s cut: %.1f s; the writes did not wait for the link (%+v)", restoredAt-cutAt, pause, during)
	}
	if c := s.relay.Counts(); c.DroppedAB+c.DroppedBA == before.DroppedAB+before.DroppedBA {
		t.Errorf("the relay dropped no frame during the cut: %+v", c)
	}
	if after := controllers(t, w); len(ctrlsBefore) != 1 || !slices.Equal(after, ctrlsBefore) {
		t.Errorf("the worker's NVMe controllers after the short cut: %v, were %v: want the same one, reconnected, not removed and made anew", after, ctrlsBefore)
	}
}

// controllers lists the NVMe controllers of node n's kernel (nvme0...), sorted.
func controllers(t *testing.T, n *node) []string {
	t.Helper()
	return strings.Fields(n.sh(t, time.Minute, "ls /sys/class/nvme 2>/dev/null | sort"))
}

// nodeMetric reads one sample (the exact series with labels, as /metrics prints it) of the CSI
// node plugin's /metrics on node n (the chart's --metrics-address :9473, host network); 0 when
// the series is absent. An unreachable endpoint or an unparsable sample fails t.
func nodeMetric(t *testing.T, n *node, series string) float64 {
	t.Helper()
	v, err := readNodeMetric(n, series)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// readNodeMetric is nodeMetric's reading as an error, for polls: a node plugin that is
// restarting (its endpoint refuses) is a reading to retry, not a verdict.
func readNodeMetric(n *node, series string) (float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := n.g.Run(ctx, "wget -q -O - http://127.0.0.1:9473/metrics", nil)
	if err == nil && res.ExitCode != 0 {
		err = fmt.Errorf("exit %d: %s", res.ExitCode, strings.TrimSpace(string(res.Output)))
	}
	if err != nil {
		return 0, fmt.Errorf("%s: the node plugin's /metrics: %w", n.name, err)
	}
	for _, line := range strings.Split(string(res.Output), "\n") {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			if err != nil {
				return 0, fmt.Errorf("%s: metric %s: %q: %w", n.name, series, line, err)
			}
			return f, nil
		}
	}
	return 0, nil
}

// The node plugin's series of a volume it found gone (csi's volume health monitor).
const (
	inaccessibleGone = `plinth_csi_node_volumes_inaccessible{reason="DeviceGone"}`
	failuresGone     = `plinth_csi_node_volume_failures_total{reason="DeviceGone"}`
)

// testLongCut: Expected: a cut longer than ctrlLossTmo: the worker's kernel gives up the
// controller and fails the held write; the writer pod sees the error (EIO, or EROFS once ext4
// remounted read-only after it); the node plugin reports the volume inaccessible unasked: a
// Warning event DeviceGone on its VolumeState naming the worker, its gauge
// plinth_csi_node_volumes_inaccessible{reason="DeviceGone"} at 1 and its counter
// plinth_csi_node_volume_failures_total{reason="DeviceGone"} one higher. After the link
// returns, a restart of the pod (kubelet unstages and stages the volume again: a new NVMe-oF
// connection) reads the data back with the sum it had, from the same filesystem (UUID
// unchanged: not re-formatted), and the gauge is back at 0.
func testLongCut(t *testing.T, s *scene) {
	w := s.worker()
	pvc, err := s.cs.CoreV1().PersistentVolumeClaims(volumeNS).Get(t.Context(), writerClaim, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pv, err := s.cs.CoreV1().PersistentVolumes().Get(t.Context(), pvc.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	volumeID := pv.Spec.CSI.VolumeHandle
	uuid := s.fsUUID(t, w)
	failuresBefore := nodeMetric(t, w, failuresGone)
	cutAt := w.uptimeF(t)
	s.relay.Cut()
	restored := false
	defer func() {
		if !restored {
			s.relay.Restore()
		}
	}()
	var failedTick tick
	poll(t, 3*time.Minute, 2*time.Second, "a failed write in "+writerPod, func() error {
		for _, tk := range parseTicks(s.podLog(t, writerPod)) {
			if tk.start >= cutAt-1 && tk.err != "" {
				failedTick = tk
				return nil
			}
		}
		return fmt.Errorf("no failed write since the cut")
	})
	t.Logf("MEASURE the pod's write failed %.1f s after the cut: %s", failedTick.end-cutAt, failedTick.err)
	if !strings.Contains(failedTick.err, "Input/output error") && !strings.Contains(failedTick.err, "Read-only file system") {
		t.Errorf("the failed write says %q, want EIO or EROFS", failedTick.err)
	}
	var reported string
	poll(t, 3*time.Minute, 2*time.Second, "the node plugin's DeviceGone event", func() error {
		evs, err := s.cs.CoreV1().Events(metav1.NamespaceAll).List(t.Context(), metav1.ListOptions{FieldSelector: "reason=DeviceGone"})
		if err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.InvolvedObject.Name == volumeID && e.Type == corev1.EventTypeWarning {
				reported = e.Message
				return nil
			}
		}
		return fmt.Errorf("%d DeviceGone events, none of %s", len(evs.Items), volumeID)
	})
	t.Logf("reported: %s", reported)
	if !strings.Contains(reported, w.name) {
		t.Errorf("DeviceGone event %q does not name node %s", reported, w.name)
	}
	// the monitor counts at its first check after the kernel removed the controller, which may
	// come after the event read above
	poll(t, 2*time.Minute, time.Second, "the cut counted once by the node plugin's monitor", func() error {
		if g, err := readNodeMetric(w, inaccessibleGone); err != nil || g != 1 {
			return fmt.Errorf("%s = %v (%v), want 1", inaccessibleGone, g, err)
		}
		if c, err := readNodeMetric(w, failuresGone); err != nil || c != failuresBefore+1 {
			return fmt.Errorf("%s %v → %v (%v), want +1", failuresGone, failuresBefore, c, err)
		}
		return nil
	})
	s.relay.Restore()
	restored = true
	restart := time.Now()
	log := s.recreate(t)
	t.Logf("TIMING pod restart after the long cut → data read back %s", time.Since(restart).Round(time.Millisecond))
	if got := blobSum(t, log); got != s.sum {
		t.Errorf("after the long cut and a pod restart the data's sum is %s, was %s", got, s.sum)
	}
	if u := s.fsUUID(t, w); u != uuid {
		t.Errorf("filesystem UUID %s after the long cut and a restage, was %s: re-formatted", u, uuid)
	}
	poll(t, 2*time.Minute, time.Second, "no volume inaccessible after the restage", func() error {
		if g, err := readNodeMetric(w, inaccessibleGone); err != nil || g != 0 {
			return fmt.Errorf("%s = %v (%v)", inaccessibleGone, g, err)
		}
		return nil
	})
	s.waitTicks(t, writerPod, w.uptimeF(t), 2*time.Minute)
}

// fsUUID is the ext4 UUID of the writer's volume as the worker's kernel has it mounted.
func (s *scene) fsUUID(t *testing.T, n *node) string {
	t.Helper()
	p, err := s.cs.CoreV1().Pods(volumeNS).Get(t.Context(), writerPod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := n.sh(t, time.Minute, fmt.Sprintf(`d=$(awk '$2 ~ "/pods/%s/volumes/kubernetes.io~csi/" {print $1}' /proc/mounts | head -1); [ -n "$d" ] && blkid -p -s UUID -o value $d`, p.UID))
	return strings.TrimSpace(out)
}

// retag gives the image repo:from in the registry a second tag, as `make push` of a new
// release's archives would (same digest here: the release changes no byte of the image).
func (s *scene) retag(t *testing.T, repo, from, to string) {
	t.Helper()
	src, err := name.NewTag(s.reg+"/"+repo+":"+from, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	desc, err := remote.Get(src, remote.WithContext(t.Context()))
	if err != nil {
		t.Fatalf("get %s: %v", src, err)
	}
	if err := remote.Tag(src.Context().Tag(to), desc, remote.WithContext(t.Context())); err != nil {
		t.Fatalf("tag %s as %s: %v", src, to, err)
	}
}

// newChartVersion copies the chart to a folder of the test with version and appVersion set.
func (s *scene) newChartVersion(t *testing.T, version string) string {
	t.Helper()
	dst := filepath.Join(s.work, "chart-"+version)
	if err := os.CopyFS(dst, os.DirFS(s.chart)); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dst, "Chart.yaml")
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		switch {
		case strings.HasPrefix(l, "version: "):
			l = "version: " + strings.TrimPrefix(version, "v")
		case strings.HasPrefix(l, "appVersion: "):
			l = "appVersion: " + version
		}
		out = append(out, l)
	}
	if err := os.WriteFile(p, []byte(strings.Join(out, "\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	return dst
}

// nodePods returns the names of the agent and CSI node pods by node.
func (s *scene) nodePods(t *testing.T) map[string]string {
	t.Helper()
	pods, err := s.cs.CoreV1().Pods(plinthNS).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, p := range pods.Items {
		if c := p.Labels["app.kubernetes.io/component"]; c == "agent" || c == "csi-node" {
			out[c+"@"+p.Spec.NodeName] = string(p.UID)
		}
	}
	return out
}

// testHelmUpgrade: Expected: `helm upgrade` to a new chart version (0.1.1, its images tagged
// v0.1.1) before its images are in the registry: the rollout stops at a new pod whose
// container waits (ErrImagePull or ImagePullBackOff) with a message naming the missing image;
// once the images are pushed (tagged v0.1.1 in the registry) it goes on, while the writer's
// volume is mounted and written: every agent and
// CSI node pod is replaced (new pods on both nodes), the release is at revision 2 with the new
// chart; the writer's writes go on — none fails, the longest is the data path's pause,
// measured — and the volume's filesystem is the same (UUID unchanged: not re-formatted) with
// the data's sum unchanged.
func testHelmUpgrade(t *testing.T, s *scene) {
	w := s.worker()
	uuid := s.fsUUID(t, w)
	before := s.nodePods(t)
	if len(before) != 4 {
		t.Fatalf("agent and CSI node pods before the upgrade: %v, want 4", before)
	}
	chart := s.newChartVersion(t, "v0.1.1")
	from := w.uptimeF(t)
	t0 := time.Now()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the upgrade's rollout: %s", rolloutTimeline(context.Background(), s.cs, t0))
		}
	})
	// The release's images are pushed after the upgrade began: until then the rollout stops at
	// its first new pod, whose status names the image the registry lacks.
	s.helm.run(t, "upgrade", "plinth", chart, "--namespace", releaseNS, "-f", s.values,
		"--set", "images.plinth.tag=v0.1.1", "--set", "images.plinth-scheduler.tag=v0.1.1")
	var pullErr string
	poll(t, 5*time.Minute, time.Second, "a new pod that names the image missing from the registry", func() error {
		pods, err := s.cs.CoreV1().Pods(plinthNS).List(t.Context(), metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, p := range pods.Items {
			for _, c := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
				if wt := c.State.Waiting; wt != nil && (wt.Reason == "ErrImagePull" || wt.Reason == "ImagePullBackOff") {
					pullErr = fmt.Sprintf("pod %s container %s: %s: %s", p.Name, c.Name, wt.Reason, wt.Message)
					return nil
				}
			}
		}
		return fmt.Errorf("no container waiting on an image pull in %d pods", len(pods.Items))
	})
	t.Logf("before the push: %s", pullErr)
	if !strings.Contains(pullErr, guestRegistry+"/plinth-storage/plinth") || !strings.Contains(pullErr, ":v0.1.1") {
		t.Errorf("the stopped rollout says %q, want the image %s/plinth-storage/plinth...:v0.1.1 named", pullErr, guestRegistry)
	}
	for _, im := range []string{"plinth-storage/plinth", "plinth-storage/plinth-scheduler"} {
		s.retag(t, im, "v0.1.0", "v0.1.1")
	}
	pushed := time.Now()
	t.Logf("TIMING helm upgrade → the missing image named, then pushed %s", pushed.Sub(t0).Round(time.Millisecond))
	poll(t, 10*time.Minute, 2*time.Second, "the upgrade rolled out", func() error {
		_, _, err := rolledOut(t.Context(), s.cs)
		return err
	})
	to := w.uptimeF(t)
	t.Logf("TIMING helm upgrade → rolled out %s (push → rolled out %s)", time.Since(t0).Round(time.Millisecond), time.Since(pushed).Round(time.Millisecond))
	t.Logf("the upgrade's rollout: %s", rolloutTimeline(t.Context(), s.cs, t0))
	if n, by, err := livenessKills(t.Context(), s.cs, t0); err == nil {
		t.Logf("MEASURE containers restarted by a failed liveness probe during the upgrade: %d %v", n, by)
	}
	after := s.nodePods(t)
	for k, uid := range before {
		if after[k] == "" || after[k] == uid {
			t.Errorf("%s: pod %s after the upgrade, was %s: want a new pod", k, after[k], uid)
		}
	}
	if out := s.helm.run(t, "history", "plinth", "--namespace", releaseNS, "-o", "json"); !strings.Contains(out, `"chart":"plinth-0.1.1"`) || !strings.Contains(out, `"revision":2`) {
		t.Errorf("helm history after the upgrade: %s", out)
	}
	ticks := s.waitTicks(t, writerPod, to, 2*time.Minute)
	during := ticksBetween(ticks, from, to)
	pause, failed := longest(during)
	t.Logf("MEASURE helm upgrade (%.0f s on the guest clock): longest write %.2f s over %d writes", to-from, pause, len(during))
	if failed != 0 {
		t.Errorf("%d of %d writes during the upgrade failed", failed, len(during))
	}
	if len(during) < 10 {
		t.Errorf("only %d writes during the upgrade", len(during))
	}
	if u := s.fsUUID(t, w); u != uuid {
		t.Errorf("filesystem UUID %s after the upgrade, was %s: re-formatted", u, uuid)
	}
	sum := strings.Fields(w.sh(t, 2*time.Minute, fmt.Sprintf("sync; echo 3 > /proc/sys/vm/drop_caches; sha256sum $(awk '$2 ~ \"/volumes/kubernetes.io~csi/%s/mount$\" {print $2}' /proc/mounts | head -1)/blob", s.pvName(t))))
	if len(sum) == 0 || sum[0] != s.sum {
		t.Errorf("data's sum after the upgrade %v, want %s", sum, s.sum)
	}
}

func (s *scene) pvName(t *testing.T) string {
	t.Helper()
	pvc, err := s.cs.CoreV1().PersistentVolumeClaims(volumeNS).Get(t.Context(), writerClaim, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return pvc.Spec.VolumeName
}

// testReinstall: Expected: `helm uninstall` removes Plinth's pods from both nodes but touches
// no data: the writer keeps writing (its mount and NVMe-oF connection are the kernel's), every
// VolumeState and the Store stay, the thin LV stays. `helm install` again (the same values)
// rolls out, its controller and agents adopt every volume (each VolumeState Ready again, no
// new LV), and a restart of the writer pod (unstage, stage by the new node plugin) reads the
// data back with its sum.
func testReinstall(t *testing.T, s *scene) {
	w, st := s.worker(), s.storage()
	var vss storev1.VolumeStateList
	if err := s.c.List(t.Context(), &vss); err != nil {
		t.Fatal(err)
	}
	lvs := strings.TrimSpace(st.sh(t, time.Minute, "lvs --noheadings -o lv_name "+agentVG+" | sort"))
	from := w.uptimeF(t)
	s.helm.run(t, "uninstall", "plinth", "--namespace", releaseNS)
	poll(t, 5*time.Minute, 2*time.Second, "Plinth's pods gone", func() error {
		pods, err := s.cs.CoreV1().Pods(plinthNS).List(t.Context(), metav1.ListOptions{})
		if err != nil {
			return err
		}
		if n := len(pods.Items); n != 0 {
			return fmt.Errorf("%d pods left in %s", n, plinthNS)
		}
		return nil
	})
	var left storev1.VolumeStateList
	if err := s.c.List(t.Context(), &left); err != nil {
		t.Fatal(err)
	}
	if len(left.Items) != len(vss.Items) {
		t.Errorf("%d VolumeStates after helm uninstall, were %d", len(left.Items), len(vss.Items))
	}
	if got := strings.TrimSpace(st.sh(t, time.Minute, "lvs --noheadings -o lv_name "+agentVG+" | sort")); got != lvs {
		t.Errorf("LVs after helm uninstall:\n%s\nwere:\n%s", got, lvs)
	}
	ticks := s.waitTicks(t, writerPod, w.uptimeF(t), 2*time.Minute)
	if _, failed := longest(ticksBetween(ticks, from, w.uptimeF(t))); failed != 0 {
		t.Errorf("%d writes failed while Plinth was uninstalled", failed)
	}

	t0 := time.Now()
	s.helm.run(t, "install", "plinth", s.chart, "--namespace", releaseNS, "-f", s.values)
	startServiceForward(t, s.cs, s.nodes)
	poll(t, 10*time.Minute, 2*time.Second, "the second install rolled out", func() error {
		_, _, err := rolledOut(t.Context(), s.cs)
		return err
	})
	t.Logf("TIMING second helm install → rolled out %s", time.Since(t0).Round(time.Millisecond))
	poll(t, 3*time.Minute, 2*time.Second, "every VolumeState Ready", func() error {
		var now storev1.VolumeStateList
		if err := s.c.List(t.Context(), &now); err != nil {
			return err
		}
		if len(now.Items) != len(vss.Items) {
			return fmt.Errorf("%d VolumeStates, were %d", len(now.Items), len(vss.Items))
		}
		for _, v := range now.Items {
			if !apimeta.IsStatusConditionTrue(v.Status.Conditions, "Ready") {
				return fmt.Errorf("VolumeState %s not Ready: %+v", v.Name, v.Status.Conditions)
			}
		}
		return nil
	})
	log := s.recreate(t)
	if got := blobSum(t, log); got != s.sum {
		t.Errorf("after helm uninstall and install the data's sum is %s, was %s", got, s.sum)
	}
	if got := strings.TrimSpace(st.sh(t, time.Minute, "lvs --noheadings -o lv_name "+agentVG+" | sort")); got != lvs {
		t.Errorf("LVs after the second install:\n%s\nwere:\n%s", got, lvs)
	}
}

// testMove: Expected: the writer's pod is moved to the storage node (its StatefulSet's
// nodeSelector changed; the storage node consumes the export over NVMe/TCP like any other
// host): the target's allowed_hosts, sampled every 100 ms on the storage node, never lists the
// worker's and the storage node's host NQN at once, and the worker's leaves before the
// storage node's appears (ControllerUnpublish revokes before ControllerPublish allows); the
// moved pod reads the data back with its sum.
func testMove(t *testing.T, s *scene) {
	st, w := s.storage(), s.worker()
	subs := strings.Fields(st.sh(t, time.Minute, "ls /sys/kernel/config/nvmet/subsystems"))
	if len(subs) != 1 {
		t.Fatalf("nvmet subsystems on the storage node: %v, want the writer's one", subs)
	}
	nqnOf := func(n *node) string { return strings.TrimSpace(n.sh(t, time.Minute, "cat /etc/nvme/hostnqn")) }
	workerNQN, storageNQN := nqnOf(w), nqnOf(st)
	st.sh(t, time.Minute, fmt.Sprintf(`d=/sys/kernel/config/nvmet/subsystems/%s/allowed_hosts
(while :; do echo "$(cut -d' ' -f1 /proc/uptime) $(ls $d | tr '\n' ' ')"; sleep 0.1; done > /tmp/allowed.log 2>&1 & echo $! > /tmp/allowed.pid)`, subs[0]))
	t0 := time.Now()
	patch := fmt.Sprintf(`{"spec":{"template":{"spec":{"nodeSelector":{%q:%q}}}}}`, corev1.LabelHostname, st.name)
	if _, err := s.cs.AppsV1().StatefulSets(volumeNS).Patch(t.Context(), writerSetName, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	poll(t, 8*time.Minute, 2*time.Second, writerPod+" running on "+st.name, func() error {
		p, err := s.cs.CoreV1().Pods(volumeNS).Get(t.Context(), writerPod, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Spec.NodeName != st.name || p.Status.Phase != corev1.PodRunning {
			return fmt.Errorf("on %q, %s", p.Spec.NodeName, p.Status.Phase)
		}
		return nil
	})
	t.Logf("TIMING pod moved to %s and running %s", st.name, time.Since(t0).Round(time.Millisecond))
	log := writerLog(t, s.cs, writerPod)
	samples := strings.Split(strings.TrimSpace(st.sh(t, time.Minute, "kill $(cat /tmp/allowed.pid); cat /tmp/allowed.log")), "\n")
	lastWorker, firstStorage, both := -1, -1, 0
	for i, l := range samples {
		hasW, hasS := strings.Contains(l, workerNQN), strings.Contains(l, storageNQN)
		if hasW {
			lastWorker = i
		}
		if hasS && firstStorage < 0 {
			firstStorage = i
		}
		if hasW && hasS {
			both++
		}
	}
	t.Logf("allowed_hosts: %d samples; the worker's last in sample %d, the storage node's first in %d", len(samples), lastWorker, firstStorage)
	if lastWorker < 0 || firstStorage < 0 || both != 0 || lastWorker >= firstStorage {
		t.Errorf("allowed_hosts order: worker's last sample %d, storage node's first %d, %d samples with both; want the worker's gone before the storage node's came, never both",
			lastWorker, firstStorage, both)
	}
	if got := blobSum(t, log); got != s.sum {
		t.Errorf("on %s the data's sum is %s, was %s", st.name, got, s.sum)
	}
	if out := w.sh(t, time.Minute, "ls /sys/class/nvme 2>/dev/null | wc -l"); strings.TrimSpace(out) != "0" {
		t.Errorf("the worker keeps %s NVMe controllers after the move", strings.TrimSpace(out))
	}
}

// The local class: thin LVs on the storage node, used there.
const localClass = agentPool + "-local"

// testLocalGrow: Expected: the local class of the policy Flux applied (Protocol local,
// WaitForFirstConsumer, expansion allowed; guestPolicy) on the same pool: a pod scheduled by the chart's scheduler onto the storage node gets
// a thin LV of 64 MiB through its own kubelet; the claim grown to 128 MiB is expanded online
// (csi-resizer → ControllerExpandVolume → the agent's lvextend; kubelet → NodeExpandVolume →
// resize2fs) and the running pod's df shows the new size.
func testLocalGrow(t *testing.T, s *scene) {
	st := s.storage()
	poll(t, 3*time.Minute, time.Second, "StorageClass "+localClass, func() error {
		_, err := s.cs.StorageV1().StorageClasses().Get(t.Context(), localClass, metav1.GetOptions{})
		return err
	})
	class := localClass
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "local-data", Namespace: volumeNS},
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, StorageClassName: &class,
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("64Mi")}}}}
	if _, err := s.cs.CoreV1().PersistentVolumeClaims(volumeNS).Create(t.Context(), pvc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "local-user", Namespace: volumeNS},
		Spec: corev1.PodSpec{SchedulerName: "plinth-scheduler", NodeSelector: map[string]string{corev1.LabelHostname: st.name},
			Containers: []corev1.Container{{Name: "c", Image: busyboxImage, ImagePullPolicy: corev1.PullNever,
				Command:      []string{"sh", "-c", "grep ' /data ' /proc/mounts; echo done; exec sleep 3600"},
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "local-data"}}}},
			TerminationGracePeriodSeconds: ptr.To[int64](1)}}
	t0 := time.Now()
	if _, err := s.cs.CoreV1().Pods(volumeNS).Create(t.Context(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRunning(t, s.cs, pod.Name)
	t.Logf("TIMING local PVC and pod created → pod Running on %s %s", st.name, time.Since(t0).Round(time.Millisecond))
	log := writerLog(t, s.cs, pod.Name)
	if !strings.Contains(log, " /data ext4 ") || strings.Contains(strings.Split(log, "\n")[0], "/dev/nvme") {
		t.Errorf("the local pod's /data: %q, want ext4 on the node's own device", log)
	}
	p, err := s.cs.CoreV1().Pods(volumeNS).Get(t.Context(), pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	size := func() (int64, error) {
		// the pod's df, through its mount as the storage node's kernel has it
		out := st.sh(t, time.Minute, fmt.Sprintf(`m=$(awk '$2 ~ "/pods/%s/volumes/kubernetes.io~csi/" {print $2}' /proc/mounts | head -1); [ -n "$m" ] && df -kP $m | tail -1`, p.UID))
		// POSIX format, one line per filesystem however long its name (busybox and coreutils
		// alike): Filesystem 1024-blocks Used Available Capacity Mounted-on
		f := strings.Fields(out)
		if len(f) < 2 {
			return 0, fmt.Errorf("df: %q", out)
		}
		var kib int64
		_, err := fmt.Sscan(f[1], &kib)
		return kib << 10, err
	}
	before, err := size()
	if err != nil {
		t.Fatal(err)
	}
	patch := `{"spec":{"resources":{"requests":{"storage":"128Mi"}}}}`
	t1 := time.Now()
	if _, err := s.cs.CoreV1().PersistentVolumeClaims(volumeNS).Patch(t.Context(), "local-data", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	var after int64
	poll(t, 5*time.Minute, 2*time.Second, "the mounted filesystem grown past 100 MiB", func() error {
		c, err := s.cs.CoreV1().PersistentVolumeClaims(volumeNS).Get(t.Context(), "local-data", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if after, err = size(); err != nil {
			return err
		}
		if q := c.Status.Capacity[corev1.ResourceStorage]; q.Cmp(resource.MustParse("128Mi")) != 0 || after < 100<<20 {
			return fmt.Errorf("claim capacity %s, filesystem %d bytes (was %d); conditions %+v", q.String(), after, before, c.Status.Conditions)
		}
		return nil
	})
	t.Logf("TIMING local volume grown online %s: filesystem %d → %d bytes", time.Since(t1).Round(time.Millisecond), before, after)
	if p2, err := s.cs.CoreV1().Pods(volumeNS).Get(t.Context(), pod.Name, metav1.GetOptions{}); err != nil || p2.UID != p.UID || p2.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Errorf("the local pod was restarted or replaced during the growth: %v", err)
	}
}

// runningSince: every pod of plinth-system on node is Running with each container ready and
// started after since (none of them, or one not yet restarted, is an error naming it).
func runningSince(ctx context.Context, cs kubernetes.Interface, node string, since time.Time) error {
	pods, err := cs.CoreV1().Pods(plinthNS).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		return err
	}
	if len(pods.Items) == 0 {
		return fmt.Errorf("no pod of %s on %s", plinthNS, node)
	}
	for _, p := range pods.Items {
		if p.Status.Phase != corev1.PodRunning || len(p.Status.ContainerStatuses) == 0 {
			return fmt.Errorf("pod %s on %s: %s", p.Name, node, p.Status.Phase)
		}
		for _, c := range p.Status.ContainerStatuses {
			if r := c.State.Running; r == nil || !c.Ready || r.StartedAt.Time.Before(since) {
				return fmt.Errorf("pod %s on %s: container %s not ready since %s (ready %v, state %+v)", p.Name, node, c.Name, since.Format(time.TimeOnly), c.Ready, c.State)
			}
		}
	}
	return nil
}

// testStorageReboot: Expected: the storage guest powers off (qemu ends: no clean shutdown)
// while the writer pod on the worker writes to its NVMe-oF volume, and boots again on the same
// disks; it joins again as the same Node (containerd's and kubelet's state went with its tmpfs
// root; /var/lib/plinth is on its disk). The chart's pods on it run again (every DaemonSet and
// Deployment rolled out), and its agent, with nothing restored by hand, exports the volume
// again from its VolumeState: the one subsystem, whose allowed_hosts lists only the worker's
// host NQN, linked into one port on the storage node's private address. The worker's kernel
// gave the controller up meanwhile (ctrlLossTmo); a restart of the writer pod (a new,
// authenticated connection) reads the data back with its sum and writes again.
func testStorageReboot(t *testing.T, s *scene) {
	st, w := s.storage(), s.worker()
	workerNQN := strings.TrimSpace(w.sh(t, time.Minute, "cat /etc/nvme/hostnqn"))
	subs := strings.Fields(st.sh(t, time.Minute, "ls /sys/kernel/config/nvmet/subsystems"))
	if len(subs) != 1 {
		t.Fatalf("nvmet subsystems on the storage node: %v, want the writer's one", subs)
	}
	down := time.Now()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the rollout after the reboot: %s", rolloutTimeline(context.Background(), s.cs, down))
		}
	})
	if err := st.g.Stop(); err != nil {
		t.Logf("stop %s: %v", st.name, err)
	}
	g, err := guest.Boot(t.Context(), s.storageOpts)
	if err != nil {
		t.Fatalf("boot %s again: %v", st.name, err)
	}
	st.g = g
	t.Logf("TIMING %s booted again in %s", st.name, g.BootTime.Round(time.Millisecond))
	if err := s.join(t, 0); err != nil {
		t.Fatal(err)
	}
	startServiceForward(t, s.cs, []*node{st})
	// Right after the join the workloads' status is still the one from before the power-off
	// (every pod Ready), so rolled out alone proves nothing: each of the chart's pods on the
	// node must run containers started after it went down.
	poll(t, 10*time.Minute, 2*time.Second, "the chart's pods running again on "+st.name, func() error {
		if _, _, err := rolledOut(t.Context(), s.cs); err != nil {
			return err
		}
		return runningSince(t.Context(), s.cs, st.name, down)
	})
	t.Logf("TIMING %s down → joined and rolled out again %s", st.name, time.Since(down).Round(time.Millisecond))
	poll(t, 5*time.Minute, 2*time.Second, "the writer's export restored", func() error {
		hosts := strings.Fields(st.try(time.Minute, fmt.Sprintf("ls /sys/kernel/config/nvmet/subsystems/%s/allowed_hosts", subs[0])))
		if len(hosts) != 1 || hosts[0] != workerNQN {
			return fmt.Errorf("allowed_hosts of %s: %v, want only %s", subs[0], hosts, workerNQN)
		}
		ports := strings.TrimSpace(st.try(time.Minute, fmt.Sprintf(`for p in /sys/kernel/config/nvmet/ports/*; do [ -e $p/subsystems/%s ] && echo "$(cat $p/addr_traddr) $(cat $p/addr_trsvcid)"; done; true`, subs[0])))
		if want := fmt.Sprintf("%s %d", st.addr, nvmePort); ports != want {
			return fmt.Errorf("ports linking %s: %q, want one: %s", subs[0], ports, want)
		}
		return nil
	})
	t.Logf("TIMING %s down → export restored %s", st.name, time.Since(down).Round(time.Millisecond))
	log := s.recreate(t)
	if got := blobSum(t, log); got != s.sum {
		t.Errorf("after the storage node's reboot and a pod restart the data's sum is %s, was %s", got, s.sum)
	}
	s.waitTicks(t, writerPod, w.uptimeF(t), 2*time.Minute)
}
