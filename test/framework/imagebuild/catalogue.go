package imagebuild

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// NodePackages are the Debian packages of the plinth image's node layer: the tools the agent
// and the CSI node plugin run (LVM and thin pools, make-bcache for the LVM cache, NVMe-oF,
// ext4/xfs, mount/losetup/blkid/wipefs/blockdev, modprobe for the agent's init container,
// cryptsetup for encrypted volumes). Their dependency closure comes along.
var NodePackages = []string{"bcache-tools", "cryptsetup-bin", "e2fsprogs", "kmod", "lvm2", "mount", "nvme-cli", "thin-provisioning-tools", "util-linux", "xfsprogs"}

// NodeExcluded are packages of the closure left out of the node layer, with why; the library
// check of the layer proves nothing kept needs them.
var NodeExcluded = map[string]string{
	"python3":  "only xfs_scrub_all, a Python script the image drops, needs it",
	"libicu72": "only xfs_scrub (online scrub, never run by Plinth) links it; the image drops xfs_scrub",
	// Maintainer-script and package-manager machinery: the image runs no package scripts.
	"dpkg":                "package manager",
	"debconf":             "package configuration, used by maintainer scripts only",
	"adduser":             "maintainer scripts only (uuid-runtime's uuidd user)",
	"init-system-helpers": "maintainer scripts only",
	"lsb-base":            "init scripts only",
	"sysvinit-utils":      "init scripts only",
	"usrmerge":            "the image is merged-/usr by construction",
	"usr-is-merged":       "the image is merged-/usr by construction",
	"perl-base":           "maintainer scripts only",
}

// dropped says which paths of Debian packages the images leave out: documentation, manual
// pages, translations, shell completions, and xfs_scrub (see NodeExcluded).
func dropped(p string) bool {
	for _, pre := range []string{"usr/share/doc/", "usr/share/man/", "usr/share/info/", "usr/share/locale/",
		"usr/share/lintian/", "usr/share/bug/", "usr/share/bash-completion/", "usr/share/zsh/", "usr/share/fish/"} {
		if p+"/" == pre || strings.HasPrefix(p, pre) {
			return true
		}
	}
	switch p {
	case "usr/sbin/xfs_scrub", "usr/sbin/xfs_scrub_all", "usr/lib/xfsprogs/xfs_scrub_all.cron":
		return true
	}
	return false
}

// Inputs are what Plinth's images are made of.
type Inputs struct {
	// Version is Plinth's version (the Makefile's VERSION), the tag of plinth and
	// plinth-scheduler.
	Version string
	// Revision is the Git commit the images are built from.
	Revision string
	// Source is the repository URL for org.opencontainers.image.source.
	Source string
	// Created is every timestamp in the images (SOURCE_DATE_EPOCH: the commit's time).
	Created time.Time
	// Plinth and Pause are the paths of the static plinth and pause binaries.
	Plinth, Pause string
	// BinDir holds plinth-scheduler, csi-provisioner, csi-attacher, csi-resizer,
	// csi-snapshotter and snapshot-controller, static (make testbin).
	BinDir string
	// Sidecars maps each sidecar binary name to its version (test/tools/versions.env).
	Sidecars map[string]string
	// DebCache is the folder of downloaded .deb files.
	DebCache string
	// Log receives progress lines.
	Log io.Writer
}

// Image is one image of the set: its short name (the archive is <Name>.tar) and how to make
// its Spec.
type Image struct {
	Name string
	Spec func(ctx context.Context, in Inputs) (Spec, error)
}

// Sidecar describes a CSI sidecar image: binary name, upstream image name and repository, and
// the versions file variable of its module when that is not derived from the name
// (csi-provisioner ← CSI_PROVISIONER_VERSION).
type Sidecar struct{ Name, Image, Source, VersionVar string }

// versionVar is the versions file variable that holds the sidecar's version.
func (s Sidecar) versionVar() string {
	if s.VersionVar != "" {
		return s.VersionVar
	}
	return strings.ToUpper(strings.ReplaceAll(s.Name, "-", "_")) + "_VERSION"
}

// Sidecars are the CSI sidecars built from their Go modules, under their upstream names.
// snapshot-controller is not a sidecar but a cluster add-on; it is built from the same
// external-snapshotter module as csi-snapshotter, at the same version, and packaged the same way.
var Sidecars = []Sidecar{
	{"csi-provisioner", "registry.k8s.io/sig-storage/csi-provisioner", "https://github.com/kubernetes-csi/external-provisioner", ""},
	{"csi-attacher", "registry.k8s.io/sig-storage/csi-attacher", "https://github.com/kubernetes-csi/external-attacher", ""},
	{"csi-resizer", "registry.k8s.io/sig-storage/csi-resizer", "https://github.com/kubernetes-csi/external-resizer", ""},
	{"csi-snapshotter", "registry.k8s.io/sig-storage/csi-snapshotter", "https://github.com/kubernetes-csi/external-snapshotter", ""},
	{"snapshot-controller", "registry.k8s.io/sig-storage/snapshot-controller", "https://github.com/kubernetes-csi/external-snapshotter", "CSI_SNAPSHOTTER_VERSION"},
}

// Image names (without tag) of the images Plinth itself publishes, and of the two images for
// test clusters without a registry.
const (
	PlinthImage    = "ghcr.io/plinth-storage/plinth"
	SchedulerImage = "ghcr.io/plinth-storage/plinth-scheduler"
	PauseRef       = "registry.k8s.io/pause:3.10"
	BusyboxRef     = "docker.io/library/busybox:plinth"
)

const defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Catalogue returns every image `make images` builds, in build order.
func Catalogue() []Image {
	imgs := []Image{
		{Name: "plinth", Spec: plinthSpec},
		{Name: "plinth-scheduler", Spec: schedulerSpec},
	}
	for _, sc := range Sidecars {
		imgs = append(imgs, Image{Name: sc.Name, Spec: sidecarSpec(sc)})
	}
	return append(imgs, Image{Name: "pause", Spec: pauseSpec}, Image{Name: "busybox", Spec: busyboxSpec})
}

func labels(in Inputs, version, source string) map[string]string {
	return map[string]string{
		"org.opencontainers.image.source":   source,
		"org.opencontainers.image.version":  version,
		"org.opencontainers.image.revision": in.Revision,
	}
}

// baseTree is the minimal root of every image: merged-/usr links, /tmp, /etc/passwd and
// /etc/group with root and the non-root user 65532 the manifests run as.
func baseTree() (*Tree, error) {
	t := NewTree()
	if err := t.UsrMergeLinks(); err != nil {
		return nil, err
	}
	for _, d := range []struct {
		p    string
		mode int64
	}{{"tmp", 0o1777}, {"etc", 0o755}, {"root", 0o700}, {"usr/bin", 0o755}, {"usr/sbin", 0o755}, {"usr/lib", 0o755}, {"usr/lib64", 0o755}, {"var", 0o755}, {"run", 0o755}, {"proc", 0o755}, {"sys", 0o755}, {"dev", 0o755}} {
		if err := t.Dir(d.p, d.mode); err != nil {
			return nil, err
		}
	}
	files := map[string]string{
		"etc/passwd": "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n",
		"etc/group":  "root:x:0:\nnonroot:x:65532:\n",
	}
	for p, s := range files {
		if err := t.File(p, 0o644, []byte(s), "base"); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// staticBinary reads a binary and refuses one that is dynamically linked: these images have
// no libc.
func staticBinary(file string) ([]byte, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("%w (make testbin builds it)", err)
	}
	interp, ok := Interpreter(data)
	if !ok {
		return nil, fmt.Errorf("%s is not an ELF executable", file)
	}
	if interp != "" {
		return nil, fmt.Errorf("%s is dynamically linked (loader %s); the image has no libc: build it with CGO_ENABLED=0", file, interp)
	}
	return data, nil
}

func binaryTree(file, dest, origin string) (*Tree, error) {
	data, err := staticBinary(file)
	if err != nil {
		return nil, err
	}
	t := NewTree()
	return t, t.File(dest, 0o755, data, origin)
}

func plinthSpec(ctx context.Context, in Inputs) (Spec, error) {
	node, pkgs, err := debianTree(ctx, in, NodePackages, NodeExcluded)
	if err != nil {
		return Spec{}, err
	}
	if problems := node.CheckLibraries(); len(problems) > 0 {
		return Spec{}, fmt.Errorf("node layer: programs without their libraries:\n  %s", strings.Join(problems, "\n  "))
	}
	var list, label []string
	for _, p := range pkgs {
		list = append(list, fmt.Sprintf("%s %s %s\n", p.Name, p.Version, p.Architecture))
		label = append(label, p.Name+"="+p.Version)
	}
	if err := node.File("usr/share/plinth/packages.txt", 0o644, []byte(strings.Join(list, "")), "plinth"); err != nil {
		return Spec{}, err
	}
	for _, d := range []struct {
		p    string
		mode int64
	}{{"run/lock", 0o1777}, {"etc/lvm", 0o755}} {
		if err := node.Dir(d.p, d.mode); err != nil {
			return Spec{}, err
		}
	}
	bin, err := binaryTree(in.Plinth, "usr/bin/plinth", "plinth")
	if err != nil {
		return Spec{}, err
	}
	l := labels(in, in.Version, in.Source)
	l["dev.plinth.debian-packages"] = strings.Join(label, " ")
	return Spec{
		Ref: PlinthImage + ":" + in.Version,
		Layers: []Layer{
			{Tree: node, CreatedBy: "plinth imagebuild: Debian bookworm packages " + strings.Join(NodePackages, " ") + " and their libraries"},
			{Tree: bin, CreatedBy: "plinth imagebuild: /usr/bin/plinth"},
		},
		Entrypoint: []string{"/usr/bin/plinth"},
		Env:        []string{defaultPath},
		WorkingDir: "/",
		Labels:     l,
	}, nil
}

// debianTree makes a base tree with the dependency closure of roots (less excluded) unpacked
// into it, and returns the packages it holds.
func debianTree(ctx context.Context, in Inputs, roots []string, excluded map[string]string) (*Tree, []Package, error) {
	pkgs, err := Resolve(ctx, roots, excluded)
	if err != nil {
		return nil, nil, err
	}
	files, err := Fetch(ctx, in.DebCache, pkgs, in.Log)
	if err != nil {
		return nil, nil, err
	}
	t, err := baseTree()
	if err != nil {
		return nil, nil, err
	}
	keep := func(p string) bool { return !dropped(p) }
	for i, p := range pkgs {
		if err := AddDeb(ctx, t, files[i], p.Name, keep); err != nil {
			return nil, nil, err
		}
	}
	return t, pkgs, nil
}

func schedulerSpec(_ context.Context, in Inputs) (Spec, error) {
	base, err := baseTree()
	if err != nil {
		return Spec{}, err
	}
	bin, err := binaryTree(filepath.Join(in.BinDir, "plinth-scheduler"), "usr/bin/plinth-scheduler", "plinth-scheduler")
	if err != nil {
		return Spec{}, err
	}
	return Spec{
		Ref: SchedulerImage + ":" + in.Version,
		Layers: []Layer{
			{Tree: base, CreatedBy: "plinth imagebuild: minimal root (/etc/passwd, /tmp)"},
			{Tree: bin, CreatedBy: "plinth imagebuild: /usr/bin/plinth-scheduler"},
		},
		Entrypoint: []string{"/usr/bin/plinth-scheduler"},
		Env:        []string{defaultPath},
		User:       "65532:65532",
		WorkingDir: "/",
		Labels:     labels(in, in.Version, in.Source),
	}, nil
}

func sidecarSpec(sc Sidecar) func(context.Context, Inputs) (Spec, error) {
	return func(_ context.Context, in Inputs) (Spec, error) {
		version := in.Sidecars[sc.Name]
		if version == "" {
			return Spec{}, fmt.Errorf("no version for %s in the versions file", sc.Name)
		}
		base, err := baseTree()
		if err != nil {
			return Spec{}, err
		}
		bin, err := binaryTree(filepath.Join(in.BinDir, sc.Name), sc.Name, sc.Name)
		if err != nil {
			return Spec{}, err
		}
		l := labels(in, version, sc.Source)
		// The revision is the sidecar's tag; the Plinth commit that built it is its own label.
		l["org.opencontainers.image.revision"] = version
		l["dev.plinth.built-from"] = in.Revision
		return Spec{
			Ref: sc.Image + ":" + version,
			Layers: []Layer{
				{Tree: base, CreatedBy: "plinth imagebuild: minimal root (/etc/passwd, /tmp)"},
				{Tree: bin, CreatedBy: "plinth imagebuild: /" + sc.Name + " built from its Go module at " + version},
			},
			// As upstream's images: the binary at the root is the entrypoint.
			Entrypoint: []string{"/" + sc.Name},
			Env:        []string{defaultPath},
			WorkingDir: "/",
			Labels:     l,
		}, nil
	}
}

func pauseSpec(_ context.Context, in Inputs) (Spec, error) {
	bin, err := binaryTree(in.Pause, "pause", "pause")
	if err != nil {
		return Spec{}, err
	}
	return Spec{
		Ref:        PauseRef,
		Layers:     []Layer{{Tree: bin, CreatedBy: "plinth imagebuild: /pause (hack/images/pause)"}},
		Entrypoint: []string{"/pause"},
		User:       "65535:65535",
		WorkingDir: "/",
		Labels:     labels(in, in.Version, in.Source),
	}, nil
}

// busyboxSpec is a general workload image for test clusters: Debian's busybox-static with a
// symlink for each applet busybox --list-full names.
func busyboxSpec(ctx context.Context, in Inputs) (Spec, error) {
	t, pkgs, err := debianTree(ctx, in, []string{"busybox-static"}, nil)
	if err != nil {
		return Spec{}, err
	}
	if len(pkgs) != 1 {
		return Spec{}, fmt.Errorf("busybox-static is expected to have no dependencies, got %d packages", len(pkgs))
	}
	bb := t.resolve("usr/bin/busybox")
	if bb == "" {
		return Spec{}, fmt.Errorf("busybox-static %s ships no /bin/busybox", pkgs[0].Version)
	}
	applets, err := busyboxApplets(ctx, t.entries[bb].data)
	if err != nil {
		return Spec{}, err
	}
	for _, a := range applets {
		p := mergeUsr(a)
		if p == bb || t.Has(p) {
			continue
		}
		if err := t.Symlink(p, "/usr/bin/busybox", "busybox --list-full"); err != nil {
			return Spec{}, err
		}
	}
	if err := t.Dir("home/nonroot", 0o755); err != nil {
		return Spec{}, err
	}
	return Spec{
		Ref:        BusyboxRef,
		Layers:     []Layer{{Tree: t, CreatedBy: "plinth imagebuild: Debian busybox-static " + pkgs[0].Version + " and its applet links"}},
		Cmd:        []string{"sh"},
		Env:        []string{defaultPath},
		WorkingDir: "/",
		Labels:     labels(in, pkgs[0].Version, in.Source),
	}, nil
}

// busyboxApplets runs the (static) busybox binary with --list-full and returns the applet
// paths, sorted.
func busyboxApplets(ctx context.Context, binary []byte) ([]string, error) {
	if interp, ok := Interpreter(binary); !ok || interp != "" {
		return nil, fmt.Errorf("busybox from busybox-static is not a static executable")
	}
	dir, err := os.MkdirTemp("", "busybox-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "busybox")
	if err := os.WriteFile(bin, binary, 0o755); err != nil {
		return nil, err
	}
	out, err := exec.CommandContext(ctx, bin, "--list-full").Output()
	if err != nil {
		return nil, fmt.Errorf("busybox --list-full: %w", err)
	}
	applets := strings.Fields(string(out))
	sort.Strings(applets)
	if len(applets) < 100 {
		return nil, fmt.Errorf("busybox --list-full named only %d applets", len(applets))
	}
	return applets, nil
}
