package csi_test

import (
	"os"
	"testing"

	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

// What the in-guest tests (TestInGuest*, run inside the qemu guest of
// TestGuestCSISanityLVMNVMeoF by csiGuest.inGuest) share: the driver's socket, the class
// parameters and the kubeconfig the host test hands them through PLINTH_CSI_GUEST_* variables.

// inGuestSocket is the driver's CSI socket in the guest (PLINTH_CSI_GUEST_SOCKET); t skips
// without it: on the host these tests have no guest (make test's skip list names each).
func inGuestSocket(t *testing.T) string {
	t.Helper()
	sock := os.Getenv("PLINTH_CSI_GUEST_SOCKET")
	if sock == "" {
		t.Skip("runs in the qemu guest of TestGuestCSISanityLVMNVMeoF (PLINTH_GUEST_CSI=1), which sets PLINTH_CSI_GUEST_SOCKET")
	}
	return sock
}

// guestKube is a client of the host's API server as the guest reaches it
// (PLINTH_CSI_GUEST_KUBECONFIG).
func guestKube(t *testing.T) client.WithWatch {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", os.Getenv("PLINTH_CSI_GUEST_KUBECONFIG"))
	if err != nil {
		t.Fatal(err)
	}
	return kubeClient(t, cfg)
}

func readParams(t *testing.T, env string) map[string]string {
	t.Helper()
	var params map[string]string
	data, err := os.ReadFile(os.Getenv(env))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, &params); err != nil {
		t.Fatal(err)
	}
	return params
}
