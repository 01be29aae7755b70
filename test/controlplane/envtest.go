package controlplane

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// EnvtestAssets returns the KUBEBUILDER_ASSETS folder that test/tools/build.sh
// makes (<test bin>/assets: etcd, kube-apiserver, kubectl), or a
// *MissingBinaryError.
func EnvtestAssets() (string, error) {
	bin, err := TestBinDir()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(bin, "assets")
	for _, n := range []string{BinEtcd, BinKubeAPIServer, BinKubectl} {
		if _, err := BinaryPath(bin, n); err != nil {
			return "", err
		}
		// build.sh makes these links at its end; make them when a build
		// was interrupted after the binaries were in place.
		if _, err := os.Lstat(filepath.Join(dir, n)); err != nil {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return "", err
			}
			if err := os.Symlink(filepath.Join("..", n), filepath.Join(dir, n)); err != nil && !os.IsExist(err) {
				return "", err
			}
		}
	}
	return dir, nil
}

// NewEnvtest returns a controller-runtime envtest.Environment that runs this
// project's etcd and kube-apiserver builds (never downloads) and installs the
// CRDs found in crdDirs (e.g. <module root>/schema/crd/bases), with the
// admission plugins that need a kubelet or controllers turned off as in Start.
// Call Start on it; `Stop` ends both processes.
func NewEnvtest(crdDirs ...string) (*envtest.Environment, error) {
	assets, err := EnvtestAssets()
	if err != nil {
		return nil, fmt.Errorf("envtest: %w", err)
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     crdDirs,
		ErrorIfCRDPathMissing: len(crdDirs) > 0,
		DownloadBinaryAssets:  false,
		// envtest's 20 s default is too short on a loaded 2-core CI machine.
		ControlPlaneStartTimeout: 2 * time.Minute,
		ControlPlaneStopTimeout:  time.Minute,
	}
	env.ControlPlane.GetAPIServer().Configure().
		Set("disable-admission-plugins", "ServiceAccount,TaintNodesByCondition")
	return env, nil
}
