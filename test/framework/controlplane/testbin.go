package controlplane

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
)

// EnvTestBin names the folder holding the test binaries (default <module root>/bin).
const EnvTestBin = "PLINTH_TESTBIN"

// EnvIntegration, when "1", turns missing test binaries from a skip into a
// failure (test/prereq.Strict reads the same variable).
const EnvIntegration = "PLINTH_INTEGRATION"

const modulePath = "github.com/plinth-storage/plinth"

// Binary names as test/tools/build.sh writes them into the test bin folder.
const (
	BinEtcd                  = "etcd"
	BinKubeAPIServer         = "kube-apiserver"
	BinKubeControllerManager = "kube-controller-manager"
	BinKubectl               = "kubectl"
	BinKubelet               = "kubelet"
	BinKubeProxy             = "kube-proxy"
	BinPlinthScheduler       = "plinth-scheduler"
	BinCSIProvisioner        = "csi-provisioner"
	BinCSIAttacher           = "csi-attacher"
	BinCSIResizer            = "csi-resizer"
	BinCSISanity             = "csi-sanity"
	BinCSISnapshotter        = "csi-snapshotter"
	BinSnapshotController    = "snapshot-controller"
)

// MissingBinaryError says that a test binary is not where it should be; the
// remedy is `make testbin`.
type MissingBinaryError struct {
	Name, Path string
}

func (e *MissingBinaryError) Error() string {
	return fmt.Sprintf("%s: binary not found at %s (run `make testbin`, or set %s)", e.Name, e.Path, EnvTestBin)
}

// IsMissingBinary reports whether err (or an error it wraps) is a MissingBinaryError.
func IsMissingBinary(err error) bool {
	var m *MissingBinaryError
	return errors.As(err, &m)
}

// ModuleRoot returns the root of the github.com/plinth-storage/plinth checkout,
// found by walking up from the working directory (go test runs in the package
// folder).
func ModuleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && modulePathOf(data) == modulePath {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod of module %s above the working directory", modulePath)
		}
		dir = parent
	}
}

func modulePathOf(gomod []byte) string {
	s := bufio.NewScanner(bytes.NewReader(gomod))
	for s.Scan() {
		if f := strings.Fields(s.Text()); len(f) == 2 && f[0] == "module" {
			return strings.Trim(f[1], `"`)
		}
	}
	return ""
}

// TestBinDir returns $PLINTH_TESTBIN, or <module root>/bin.
func TestBinDir() (string, error) {
	if d := os.Getenv(EnvTestBin); d != "" {
		return filepath.Abs(d)
	}
	root, err := ModuleRoot()
	if err != nil {
		return "", fmt.Errorf("locate test binaries: set %s: %w", EnvTestBin, err)
	}
	return filepath.Join(root, "bin"), nil
}

// BinaryPath returns the path of the named test binary in dir (TestBinDir when
// dir is empty), or a *MissingBinaryError.
func BinaryPath(dir, name string) (string, error) {
	if filepath.IsAbs(name) {
		dir, name = filepath.Split(name)
	}
	if dir == "" {
		var err error
		if dir, err = TestBinDir(); err != nil {
			return "", err
		}
	}
	p := filepath.Join(dir, name)
	st, err := os.Stat(p)
	if err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
		return "", &MissingBinaryError{Name: filepath.Base(name), Path: p}
	}
	return p, nil
}

// PinnedVersions returns the KEY=value lines of test/tools/versions.env, or
// nil when the file is not found (binaries used outside a checkout).
func PinnedVersions() map[string]string {
	root, err := ModuleRoot()
	if err != nil {
		return nil
	}
	data, err := os.ReadFile(filepath.Join(root, "test", "tools", "versions.env"))
	if err != nil {
		return nil
	}
	out := map[string]string{}
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if k, v, ok := strings.Cut(line, "="); ok {
			out[k] = strings.Trim(v, `"'`)
		}
	}
	return out
}

var versionChecks sync.Map // path+want → error

// checkVersion runs `path --version` and requires want in its output, so a
// stale binary from another pin fails clearly instead of misbehaving.
func checkVersion(name, path, want string) error {
	if want == "" {
		return nil
	}
	key := path + "\x00" + want
	if v, ok := versionChecks.Load(key); ok {
		err, _ := v.(error)
		return err
	}
	out, err := exec.Command(path, "--version").CombinedOutput()
	if err == nil && !bytes.Contains(out, []byte(want)) {
		err = fmt.Errorf("%s: %s is not the pinned version %s (it says %q): run `make testbin`",
			name, path, want, strings.TrimSpace(string(out)))
	} else if err != nil {
		err = fmt.Errorf("%s: %s --version: %w: %s", name, path, err, tail(out, 5))
	}
	versionChecks.Store(key, err)
	return err
}
