package guest

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func TestQemuArgs(t *testing.T) {
	o := Options{Kernel: "k", Initrd: "i", MemoryMiB: 512, CPUs: 1,
		HostForwards:  []Forward{{HostPort: 15051, GuestPort: 50051}},
		GuestForwards: []Forward{{HostPort: 34567, GuestPort: 6443}}}
	args := strings.Join(QemuArgs(o, "/s", []string{"/d0", "/d1"}), " ")
	for _, want := range []string{
		"-accel tcg,thread=multi", "-smp 1", "-m 512", "-no-reboot",
		"hostfwd=tcp:127.0.0.1:15051-:50051", "guestfwd=tcp:10.0.2.100:6443-tcp:127.0.0.1:34567",
		"restrict=on", "path=/s,mount_tag=plinth", "file=/d0,if=virtio", "file=/d1,if=virtio",
	} {
		if !strings.Contains(args, want) {
			t.Errorf("qemu args lack %q: %s", want, args)
		}
	}
}

// TestBootForwardsStop boots a real guest on the host (about 15 s under
// software emulation): a command's exit code and output, a host → guest
// hostfwd, a guest → host guestfwd, and Stop leaving no qemu process.
func TestBootForwardsStop(t *testing.T) {
	if os.Getenv("PLINTH_GUEST_BOOT") != "1" {
		t.Skip("boots a qemu guest: set PLINTH_GUEST_BOOT=1 (after make kernel-assets)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	host := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello from the host")
	}))
	defer host.Close()
	hostPort := host.Listener.Addr().(*net.TCPAddr).Port
	fwdPort := freePort(t)

	g, err := Boot(ctx, Options{
		DiskBytes:     []int64{64 << 20},
		HostForwards:  []Forward{{HostPort: fwdPort, GuestPort: 8080}},
		GuestForwards: []Forward{{HostPort: hostPort, GuestPort: 7000}},
		Timeout:       5 * time.Minute,
		Console:       testWriter{t},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Stop()
	t.Logf("booted in %v, pid %d", g.BootTime, g.PID())

	res, err := g.Run(ctx, "echo out; echo err >&2; test -b /dev/vda && test -e /etc/nvme/hostnqn && test -d /sys/kernel/config/nvmet; exit 3", nil)
	if err != nil || res.ExitCode != 3 || !strings.Contains(string(res.Output), "out\nerr\n") {
		t.Fatalf("run: %+v %q %v", res, res.Output, err)
	}

	// guest → host through guestfwd at 10.0.2.100
	res, err = g.Run(ctx, fmt.Sprintf("wget -q -O - http://%s:7000/", GuestForwardAddr), nil)
	if err != nil || res.ExitCode != 0 || !strings.Contains(string(res.Output), "hello from the host") {
		t.Errorf("guestfwd: %+v %q %v", res, res.Output, err)
	}

	// host → guest through hostfwd: a server started in the background
	os.WriteFile(filepath.Join(g.ShareDir(), "index.html"), []byte("hello from the guest"), 0o644)
	if res, err := g.Run(ctx, "httpd -p 8080 -h "+SharePath, nil); err != nil || res.ExitCode != 0 {
		t.Fatalf("httpd: %+v %v", res, err)
	}
	var body []byte
	for i := 0; i < 50; i++ {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/index.html", fwdPort))
		if err == nil {
			body, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	if string(body) != "hello from the guest" {
		t.Errorf("hostfwd: got %q", body)
	}

	pid := g.PID()
	g.Stop()
	select {
	case <-g.Done():
	default:
		t.Fatal("qemu still running after Stop")
	}
	if err := syscall.Kill(-pid, 0); err == nil {
		t.Errorf("process group %d still alive after Stop", pid)
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Logf("console: %s", strings.TrimRight(string(b), "\r\n"))
	return len(b), nil
}
