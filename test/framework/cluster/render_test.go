package cluster

import (
	"strings"
	"testing"
)

// Expected: the renderers fill the host nodes' templates with the given values and the
// documented defaults (sandbox image, CNI plugin folder), nothing left unformatted.
func TestRenderConfigs(t *testing.T) {
	cd := RenderContainerdConfig(ContainerdConfigFiles{Root: "/var/lib/containerd", State: "/run/containerd",
		Socket: "/run/containerd/containerd.sock", Opt: "/opt/containerd", CNIConfDir: "/etc/cni/net.d"})
	kl := RenderKubeletConfig(KubeletConfigValues{ClientCAFile: "/etc/kubernetes/pki/ca.crt", CgroupRoot: "/",
		RuntimeEndpoint: "unix:///run/containerd/containerd.sock", Address: "0.0.0.0", Port: 10250, HealthzPort: 10248})
	cni := RenderCNIConfig("plinth-n1", "cni0", "/var/lib/cni/networks", "10.244.1.0/24")
	for _, c := range []struct {
		name, text string
		want       []string
	}{
		{"containerd", cd, []string{`root = "/var/lib/containerd"`, `address = "/run/containerd/containerd.sock.ttrpc"`,
			`sandbox_image = "` + DefaultSandboxImage + `"`, `bin_dir = "` + DefaultCNIBinDir + `"`, `conf_dir = "/etc/cni/net.d"`, `snapshotter = "overlayfs"`}},
		{"kubelet", kl, []string{`clientCAFile: "/etc/kubernetes/pki/ca.crt"`, `cgroupRoot: "/"`,
			`containerRuntimeEndpoint: "unix:///run/containerd/containerd.sock"`, `address: "0.0.0.0"`, "port: 10250", "healthzPort: 10248"}},
		{"cni", cni, []string{`"name": "plinth-n1"`, `"bridge": "cni0"`, `"dataDir": "/var/lib/cni/networks"`, `"subnet": "10.244.1.0/24"`}},
	} {
		for _, w := range c.want {
			if !strings.Contains(c.text, w) {
				t.Errorf("%s config lacks %s:\n%s", c.name, w, c.text)
			}
		}
		if strings.Contains(c.text, "%!") {
			t.Errorf("%s config has a formatting error:\n%s", c.name, c.text)
		}
	}
}
