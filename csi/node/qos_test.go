package node

import "testing"

func TestPodUIDOfKubeletPublishPaths(t *testing.T) {
	for target, want := range map[string]string{
		"/var/lib/kubelet/pods/0b3c5d6e-1111-2222-3333-444455556666/volumes/kubernetes.io~csi/pvc-1/mount":            "0b3c5d6e-1111-2222-3333-444455556666",
		"/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/publish/pvc-1/0b3c5d6e-1111-2222-3333-444455556666": "0b3c5d6e-1111-2222-3333-444455556666",
		"/srv/k/pods/u1/volumes/kubernetes.io~csi/pvc-1/mount/":                                                       "u1",
		"/tmp/target": "",
	} {
		if got := podUIDOfTarget(target); got != want {
			t.Errorf("%s: %q, want %q", target, got, want)
		}
	}
}
