package nvmet_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/plinth-storage/plinth/agents/nvmet"
	"github.com/plinth-storage/plinth/internal/dhchap"
)

// Expected, on a kernel with NVMe target authentication (the backports kernel, 6.12): an export
// with a host's DH-HMAC-CHAP setting writes it into hosts/<hostnqn>/dhchap_* (read back equal,
// and by Inspect) and the kernel then refuses that host NQN without a secret and with a wrong
// one, and admits it with its secret, bidirectionally too. On a kernel without it (bookworm's
// 6.1): the export fails with ErrAuthUnsupported and the host is never allowed.
func TestKernelHostAuth(t *testing.T) {
	requireGuest(t)
	ctx := context.Background()
	uname, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		t.Fatal(err)
	}
	release := strings.TrimSpace(string(uname))
	supported, err := targetAuthExpected(release)
	if err != nil {
		t.Fatal(err)
	}
	// The kernel must take the branch its release promises: a backports kernel whose nvmet lost
	// authentication would otherwise pass through the "unsupported" branch unnoticed.
	_, statErr := os.Stat("/sys/module/nvme_auth/holders/nvmet")
	if has := statErr == nil; has != supported {
		t.Fatalf("kernel %s: nvmet holds nvme_auth = %v, want %v (the target authentication this release ships with)", release, has, supported)
	}
	t.Logf("kernel %s: target authentication %v", release, supported)

	dev := filepath.Join(t.TempDir(), "ns.img") // nvmet serves a regular file as a namespace too
	if err := os.WriteFile(dev, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(dev, 64<<20); err != nil {
		t.Fatal(err)
	}
	key, _ := dhchap.Generate("sha256")
	ctrlKey, _ := dhchap.Generate("sha256")
	wrong, _ := dhchap.Generate("sha256")
	const host = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-0000000000d4"
	const hostID = "00000000-0000-4000-8000-0000000000d4"
	nqn, err := nvmet.VolumeNQN(volumeID("auth-kernel"))
	if err != nil {
		t.Fatal(err)
	}
	tg := nvmet.New("")
	t.Cleanup(func() {
		_ = exec.Command("nvme", "disconnect", "-n", nqn).Run()
		if err := tg.Unexport(ctx, nqn); err != nil {
			t.Errorf("unexport: %v", err)
		}
		if _, err := os.Stat(filepath.Join(nvmet.DefaultRoot, "hosts", host)); err == nil {
			t.Errorf("host entry %s left behind", host)
		}
	})
	want := nvmet.HostAuth{Key: key, CtrlKey: ctrlKey, Hash: "hmac(sha256)", DHGroup: "ffdhe2048"}
	_, err = tg.Export(ctx, nvmet.ExportSpec{NQN: nqn, DevicePath: dev, ACL: true, Hosts: []string{host},
		HostAuth: map[string]nvmet.HostAuth{host: want}, Endpoint: nvmet.Endpoint{Address: "127.0.0.1", ServiceID: "4431"}})
	if !supported {
		if !errors.Is(err, nvmet.ErrAuthUnsupported) {
			t.Fatalf("export with authentication on a kernel without it: %v, want ErrAuthUnsupported", err)
		}
		if links, _ := os.ReadDir(filepath.Join(nvmet.DefaultRoot, "subsystems", nqn, "allowed_hosts")); len(links) != 0 {
			t.Fatalf("the host was allowed without authentication")
		}
		return
	}
	if err != nil {
		t.Fatalf("export: %v", err)
	}
	for attr, w := range map[string]string{"dhchap_key": key, "dhchap_ctrl_key": ctrlKey, "dhchap_hash": "hmac(sha256)", "dhchap_dhgroup": "ffdhe2048"} {
		if got := sysAttr(t, filepath.Join(nvmet.DefaultRoot, "hosts", host, attr)); got != w {
			t.Errorf("hosts/%s/%s read back differs (len %d, want %d)", host, attr, len(got), len(w))
		}
	}
	e, err := tg.Inspect(ctx, nqn)
	if err != nil || !nvmet.AuthMatches(want, e.HostAuth[host]) {
		t.Errorf("Inspect: host entry does not match what was written (%v)", err)
	}
	connect := func(secret, ctrlSecret string) (string, error, time.Duration) {
		args := []string{"connect", "-t", "tcp", "-a", "127.0.0.1", "-s", "4431", "-n", nqn, "--hostnqn=" + host, "--hostid=" + hostID}
		if secret != "" {
			args = append(args, "--dhchap-secret="+secret)
		}
		if ctrlSecret != "" {
			args = append(args, "--dhchap-ctrl-secret="+ctrlSecret)
		}
		start := time.Now()
		out, err := exec.Command("nvme", args...).CombinedOutput()
		return string(out), err, time.Since(start)
	}
	for name, secret := range map[string]string{"no secret": "", "a wrong secret": wrong} {
		if out, err, _ := connect(secret, ""); err == nil {
			t.Errorf("connect with %s admitted:\n%s", name, out)
			_ = exec.Command("nvme", "disconnect", "-n", nqn).Run()
		}
	}
	for name, ctrl := range map[string]string{"unidirectional": "", "bidirectional": ctrlKey} {
		out, err, d := connect(key, ctrl)
		if err != nil {
			t.Errorf("connect with the host's secret (%s): %v\n%s", name, err, out)
			continue
		}
		t.Logf("TIMING connect with DH-HMAC-CHAP %-15s %8.3fs", name, d.Seconds())
		run(t, "nvme", "disconnect", "-n", nqn)
	}
	// a wrong controller secret: the host refuses the target
	if out, err, _ := connect(key, wrong); err == nil {
		t.Errorf("connect that expects another controller secret admitted:\n%s", out)
		_ = exec.Command("nvme", "disconnect", "-n", nqn).Run()
	}
	if out, _ := exec.Command("sh", "-c", "dmesg | grep -E 'qid 0: (no key|authentication|authenticated)|response mismatch' | tail -n 8").CombinedOutput(); len(out) > 0 {
		t.Logf("kernel:\n%s", out)
	}
}

// targetAuthExpected says whether Debian's kernel of the given release (from
// /proc/sys/kernel/osrelease, e.g. "6.1.0-44-amd64" or "6.12.95+deb12-amd64") builds nvmet with
// in-band authentication (CONFIG_NVME_TARGET_AUTH): bookworm's 6.1 does not, bookworm-backports'
// kernels from 6.12 on do. A release in between has no expectation and is an error, so a guest
// kernel cannot silently take either branch.
func targetAuthExpected(release string) (bool, error) {
	var major, minor int
	if _, err := fmt.Sscanf(release, "%d.%d", &major, &minor); err != nil {
		return false, fmt.Errorf("kernel release %q: %v", release, err)
	}
	switch {
	case major == 6 && minor == 1:
		return false, nil
	case major > 6 || (major == 6 && minor >= 12):
		return true, nil
	}
	return false, fmt.Errorf("kernel %q: no expectation for NVMe target authentication; add its release to targetAuthExpected", release)
}

func TestTargetAuthExpected(t *testing.T) {
	for release, want := range map[string]bool{"6.1.0-44-amd64": false, "6.12.95+deb12-amd64": true} {
		if got, err := targetAuthExpected(release); err != nil || got != want {
			t.Errorf("targetAuthExpected(%q) = %v, %v; want %v", release, got, err, want)
		}
	}
	if _, err := targetAuthExpected("6.6.3-amd64"); err == nil {
		t.Errorf("a release without an expectation was accepted")
	}
}
