package devenv

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/test/framework/cluster"
)

// Kubectl runs kubectl with the admin kubeconfig (bounded to a minute) and
// returns its standard output; the error carries its standard error.
func (e *Env) KubectlRun(ctx context.Context, args ...string) (string, error) {
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var out, stderr bytes.Buffer
	cmd := exec.CommandContext(cctx, e.Kubectl, append([]string{"--kubeconfig", e.Kubeconfig}, args...)...)
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out.String(), nil
}

// probeText is what PodIO writes through the volume.
const probeText = "written through the volume kubelet mounted"

// PodIO writes a file on the quickstart volume from inside the pod (kubectl
// exec), reads it back with its checksum and df, and checks on the host that
// the volume is mounted where kubelet publishes CSI volumes on that node.
func (e *Walk) PodIO(ctx context.Context, _ *Summary) error {
	return e.step("kubectl exec into the pod: write, read, sha256sum, df on the volume kubelet mounted", []string{"csi-node"}, func() (string, error) {
		out, err := e.KubectlRun(ctx, "exec", "-n", QuickstartNamespace, QuickstartPod, "--", "sh", "-c",
			"echo '"+probeText+"' > /data/hello.txt && sync && cat /data/hello.txt && sha256sum /data/hello.txt && df -k /data | tail -1")
		if err != nil {
			return "", err
		}
		if !strings.Contains(out, probeText) {
			return "", fmt.Errorf("read back %q", out)
		}
		var pod corev1.Pod
		if err := e.Client.Get(ctx, client.ObjectKey{Namespace: QuickstartNamespace, Name: QuickstartPod}, &pod); err != nil {
			return "", err
		}
		mounts, err := e.podVolumeMounts(&pod)
		if err != nil {
			return "", err
		}
		if len(mounts) != 1 {
			return "", fmt.Errorf("mounts of pod %s's CSI volumes on %s: %v, want one", pod.Name, pod.Spec.NodeName, mounts)
		}
		return fmt.Sprintf("%s\npublished by kubelet at %s (host path of node %s)", strings.TrimSpace(out), mounts[0], pod.Spec.NodeName), nil
	})
}

// podVolumeMounts lists the host mounts of pod's CSI volumes on its node.
func (e *Env) podVolumeMounts(pod *corev1.Pod) ([]string, error) {
	n := e.Nodes.Node(pod.Spec.NodeName)
	if n == nil {
		return nil, fmt.Errorf("pod %s on unknown node %q", pod.Name, pod.Spec.NodeName)
	}
	return cluster.MountsUnder(filepath.Join(n.RootDir, "pods", string(pod.UID), "volumes", "kubernetes.io~csi"))
}

// PodGone deletes the quickstart pod and waits until it is gone, kubelet has
// unpublished and unstaged its volume (no mount of it left on the node) and
// the VolumeAttachment is detached and deleted.
func (e *Walk) PodGone(ctx context.Context, sum *Summary) error {
	return e.step("delete the pod → kubelet unpublishes and unstages, VolumeAttachment gone", []string{"csi-node", "csi-controller"}, func() (string, error) {
		var pod corev1.Pod
		if err := e.Client.Get(ctx, client.ObjectKey{Namespace: QuickstartNamespace, Name: QuickstartPod}, &pod); err != nil {
			return "", err
		}
		n := e.Nodes.Node(pod.Spec.NodeName)
		if err := e.Client.Delete(ctx, &pod); err != nil && !apierrors.IsNotFound(err) {
			return "", err
		}
		start := time.Now()
		err := poll(ctx, 2*time.Minute, func() error {
			if err := e.Client.Get(ctx, client.ObjectKey{Namespace: QuickstartNamespace, Name: QuickstartPod}, &corev1.Pod{}); !apierrors.IsNotFound(err) {
				return fmt.Errorf("pod %s still there (%v)", QuickstartPod, err)
			}
			// The quickstart volume is the only CSI volume of the walk: nothing of
			// the pod and nothing staged may stay mounted on its node.
			for _, d := range []string{filepath.Join(n.RootDir, "pods", string(pod.UID)), filepath.Join(n.RootDir, "plugins", "kubernetes.io", "csi")} {
				if m, err := cluster.MountsUnder(d); err != nil || len(m) > 0 {
					return fmt.Errorf("mounts under %s: %v %v", d, m, err)
				}
			}
			var vas storagev1.VolumeAttachmentList
			if err := e.Client.List(ctx, &vas); err != nil {
				return err
			}
			if len(vas.Items) > 0 {
				return fmt.Errorf("VolumeAttachment %s still there (attached %v)", vas.Items[0].Name, vas.Items[0].Status.Attached)
			}
			return nil
		})
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("pod gone, volume unmounted from %s and detached %.1fs after the delete", n.Name, time.Since(start).Seconds()), nil
	})
}

// loopDevicesOf lists the loop devices whose backing file names volume id.
func loopDevicesOf(id string) []string {
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	var out []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err == nil && strings.Contains(string(b), id) {
			out = append(out, "/dev/"+filepath.Base(filepath.Dir(filepath.Dir(f))))
		}
	}
	return out
}
