package agent

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// KernelNVMeSecurity reads the module holders the way a 6.12 kernel (host and target auth
// and TLS) and bookworm's 6.1 (no nvme_auth, no nvme_keyring) lay them out.
func TestKernelNVMeSecurity(t *testing.T) {
	mk := func(root string, paths ...string) {
		for _, p := range paths {
			if err := os.MkdirAll(filepath.Join(root, "module", p), 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	k612 := t.TempDir()
	// recorded in the 6.12.95+deb12 guest: ls /sys/module/nvme_auth/holders /sys/module/nvme_keyring/holders
	mk(k612, "nvme_auth/holders/nvme_core", "nvme_auth/holders/nvmet", "nvme_keyring/holders/nvme_fabrics",
		"nvme_keyring/holders/nvme_tcp", "nvme_keyring/holders/nvmet", "nvmet", "nvme_tcp")
	auth, tls := KernelNVMeSecurity(k612)
	if !slices.Equal(auth, []string{"host", "target"}) || !slices.Equal(tls, []string{"host", "target"}) {
		t.Errorf("6.12: auth %v tls %v, want host and target for both", auth, tls)
	}
	k61 := t.TempDir()
	mk(k61, "nvmet", "nvmet_tcp", "nvme_tcp", "nvme_core", "nvme_fabrics")
	if auth, tls := KernelNVMeSecurity(k61); auth != nil || tls != nil {
		t.Errorf("6.1: auth %v tls %v, want none", auth, tls)
	}
	// an initiator-only node (no nvmet loaded)
	host := t.TempDir()
	mk(host, "nvme_auth/holders/nvme_core", "nvme_keyring/holders/nvme_tcp")
	if auth, tls := KernelNVMeSecurity(host); !slices.Equal(auth, []string{"host"}) || !slices.Equal(tls, []string{"host"}) {
		t.Errorf("host only: auth %v tls %v", auth, tls)
	}
}
