package manifests

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/plinth-storage/plinth/test/framework/controlplane"
	"github.com/plinth-storage/plinth/test/framework/registry"
	"github.com/plinth-storage/plinth/test/prereq"
)

// binHelm is the helm CLI of test/tools/helm (make testbin).
const binHelm = "helm"

// helmCLI runs the helm binary with its own config, cache and data folders (nothing of the
// user's ~/.config/helm) against kubeconfig.
type helmCLI struct {
	path, home, kubeconfig string
}

// run runs helm with args and returns its standard output; a non-zero exit fails t with both
// outputs.
func (h helmCLI) run(t *testing.T, args ...string) string {
	t.Helper()
	out, err := h.try(t, args...)
	if err != nil {
		t.Fatalf("helm %s: %v", strings.Join(args, " "), err)
	}
	return out
}

// try runs helm with args; the error carries helm's standard error.
func (h helmCLI) try(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), h.path, args...)
	cmd.Env = append(os.Environ(),
		"HELM_CONFIG_HOME="+filepath.Join(h.home, "config"),
		"HELM_CACHE_HOME="+filepath.Join(h.home, "cache"),
		"HELM_DATA_HOME="+filepath.Join(h.home, "data"),
		"KUBECONFIG="+h.kubeconfig)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%w\n%s%s", err, stdout.String(), stderr.String())
	}
	return stdout.String(), nil
}

// decodeStream decodes a YAML stream (helm template's output) into its objects.
func decodeStream(data string) ([]*unstructured.Unstructured, error) {
	var out []*unstructured.Unstructured
	d := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(data), 4096)
	for {
		var m map[string]any
		if err := d.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return out, err
		}
		if len(m) > 0 {
			out = append(out, &unstructured.Unstructured{Object: m})
		}
	}
}

// registryValues are the chart's values with every image in reg: each default image of
// values.yaml under registry.Target (the path and tag make push gives it). It returns the
// values as YAML and the image references they name.
func registryValues(t *testing.T, reg string) (string, []name.Tag) {
	t.Helper()
	images := map[string]any{}
	var refs []name.Tag
	for n, im := range chartImages(t) {
		tag, err := registry.Target(im.Repository+":"+im.Tag, reg, false)
		if err != nil {
			t.Fatal(err)
		}
		images[n] = map[string]string{"repository": tag.Context().Name(), "tag": tag.TagStr()}
		refs = append(refs, tag)
	}
	if len(images) < 6 {
		t.Fatalf("values.yaml names %d images", len(images))
	}
	out, err := yaml.Marshal(map[string]any{"images": images})
	if err != nil {
		t.Fatal(err)
	}
	return string(out), refs
}

// TestHelmCLI installs charts/plinth the way users do, with the helm CLI (helm.sh/helm/v4,
// test/tools/helm) and its images in a real docker-registry: helm lint and helm template
// agree with Helm's library; helm install --dry-run=server creates nothing; helm install
// creates every object (CRDs from crds/ first), helm upgrade changes what the new values say,
// helm uninstall removes the release's objects but keeps the CRDs (Helm never deletes crds/)
// and the plinth-system Namespace with the data in it (helm.sh/resource-policy: keep), and a
// second helm install adopts the kept Namespace.
func TestHelmCLI(t *testing.T) {
	controlplane.RequireBinaries(t, binHelm)
	path, err := controlplane.BinaryPath("", binHelm)
	if err != nil {
		t.Fatal(err)
	}
	reg := registry.ForTest(t)
	valuesText, refs := registryValues(t, reg.Addr)
	values := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(values, []byte(valuesText), 0o644); err != nil {
		t.Fatal(err)
	}
	h := helmCLI{path: path, home: t.TempDir()}
	// A helm left from another pin fails here instead of misbehaving below.
	if v, want := strings.TrimSpace(h.run(t, "version", "--short")), controlplane.PinnedVersions()["HELM_VERSION"]; want == "" || !strings.HasPrefix(v, want) {
		t.Fatalf("%s version %q, test/tools/versions.env pins HELM_VERSION=%q (make testbin)", path, v, want)
	}
	if !t.Run("lint", func(t *testing.T) {
		out := h.run(t, "lint", "--strict", chartDir, "-f", values)
		if !strings.Contains(out, "1 chart(s) linted, 0 chart(s) failed") {
			t.Errorf("helm lint:\n%s", out)
		}
	}) {
		return
	}
	if !t.Run("template equals the library's rendering", func(t *testing.T) {
		out := h.run(t, "template", "plinth", chartDir, "--namespace", namespace, "--include-crds", "-f", values)
		got, err := decodeStream(out)
		if err != nil {
			t.Fatalf("helm template output: %v", err)
		}
		objs, crds := renderChart(t, valuesText)
		want, have := canonicalSet(t, objs, crds), canonicalSet(t, got)
		for id, w := range want {
			if have[id] != w {
				t.Errorf("helm template: %s differs from Helm's engine or is missing", id)
			}
		}
		if len(have) != len(want) {
			t.Errorf("helm template: %d objects, the engine %d", len(have), len(want))
		}
		t.Logf("helm template: %d objects (%d CRDs), equal to the engine's", len(have), len(crds))
	}) {
		return
	}

	cp := controlplane.ForTest(t, controlplane.Options{})
	h.kubeconfig = cp.Admin.Kubeconfig
	c := clientsOf(t, cp)
	kube := c.kube
	objs, crds := renderChart(t, valuesText)
	// The release's record lives in default; every object names plinth-system itself.
	release := []string{"--namespace", "default", "-f", values}
	ctx := t.Context()

	if !t.Run("install --dry-run=server creates nothing", func(t *testing.T) {
		out := h.run(t, append([]string{"install", "plinth", chartDir, "--dry-run=server"}, release...)...)
		if !strings.Contains(out, "STATUS: pending-install") && !strings.Contains(out, "Dry run complete") {
			t.Errorf("helm install --dry-run=server:\n%s", out)
		}
		list, err := c.dyn.Resource(crdGVR).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if n := len(list.Items); n != 0 {
			t.Errorf("dry run installed %d CRDs", n)
		}
		if _, err := kube.CoreV1().Namespaces().Get(ctx, namespace, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("dry run: namespace %s: %v, want NotFound", namespace, err)
		}
	}) {
		return
	}

	// live returns which of the release's rendered objects exist on the server; one being
	// deleted counts as absent (without kube-controller-manager a deleted Namespace stays
	// Terminating).
	live := func(t *testing.T, list []*unstructured.Unstructured) (present, absent []string) {
		t.Helper()
		for _, o := range list {
			ri, _ := c.resource(t, o)
			if got, err := ri.Get(ctx, o.GetName(), metav1.GetOptions{}); err == nil && got.GetDeletionTimestamp() == nil {
				present = append(present, ID(o))
			} else if err == nil || apierrors.IsNotFound(err) {
				absent = append(absent, ID(o))
			} else {
				t.Fatalf("get %s: %v", ID(o), err)
			}
		}
		return present, absent
	}
	// A Secret standing for the data Plinth keeps in plinth-system (the DH-HMAC-CHAP keys).
	data := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "plinth-test-host-key", Namespace: namespace},
		StringData: map[string]string{"key": "DHHC-1:00:test"}}
	pool := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(`{apiVersion: policy.plinth.dev/v1alpha1, kind: StoragePool, metadata: {name: helm-test},
spec: {nodeSelector: {matchLabels: {plinth.dev/storage: dev}}, backend: {file: {directory: /var/lib/plinth/dev}}}}`), &pool.Object); err != nil {
		t.Fatal(err)
	}

	if !t.Run("install, upgrade, uninstall", func(t *testing.T) {
		h.run(t, append([]string{"install", "plinth", chartDir}, release...)...)
		present, absent := live(t, append(append([]*unstructured.Unstructured{}, crds...), objs...))
		if len(absent) > 0 {
			t.Fatalf("after helm install, missing: %v", absent)
		}
		t.Logf("helm install: %d objects and %d CRDs created", len(objs), len(crds))
		if len(present) < 50 {
			t.Errorf("only %d objects installed", len(present))
		}
		if _, err := kube.CoreV1().Secrets(namespace).Create(ctx, data, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		pools, _ := c.resource(t, pool)
		if _, err := pools.Create(ctx, pool, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create StoragePool: %v", err)
		}

		h.run(t, append([]string{"upgrade", "plinth", chartDir, "--set-json", `agent.nodeSelector={"example.com/storage":"true"}`}, release...)...)
		ds, err := kube.AppsV1().DaemonSets(namespace).Get(ctx, "plinth-agent", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if ds.Spec.Template.Spec.NodeSelector["example.com/storage"] != "true" {
			t.Errorf("after helm upgrade the agent's nodeSelector is %v", ds.Spec.Template.Spec.NodeSelector)
		}
		if hist := h.run(t, "history", "plinth", "--namespace", "default", "-o", "json"); strings.Count(hist, `"revision"`) != 2 {
			t.Errorf("helm history after one upgrade:\n%s", hist)
		}

		h.run(t, "uninstall", "plinth", "--namespace", "default")
		present, absent = live(t, objs)
		kept := []string{"Namespace//" + keys, "Namespace//" + namespace}
		if slices.Sort(present); !slices.Equal(present, kept) {
			t.Errorf("after helm uninstall, left: %v; want only %v (helm.sh/resource-policy: keep)", present, kept)
		}
		if len(absent) != len(objs)-len(kept) {
			t.Errorf("helm uninstall removed %d of %d objects", len(absent), len(objs)-len(kept))
		}
		if present, _ := live(t, crds); len(present) != len(crds) {
			t.Errorf("after helm uninstall %d of %d CRDs are left; Helm never deletes crds/", len(present), len(crds))
		}
		if _, err := kube.CoreV1().Secrets(namespace).Get(ctx, data.Name, metav1.GetOptions{}); err != nil {
			t.Errorf("the Secret in %s after helm uninstall: %v", namespace, err)
		}
		if _, err := pools.Get(ctx, pool.GetName(), metav1.GetOptions{}); err != nil {
			t.Errorf("the StoragePool after helm uninstall: %v", err)
		}

		// Installed again: the kept Namespace (it still carries the release's ownership
		// annotations) is adopted, the CRDs that exist are left as they are.
		h.run(t, append([]string{"install", "plinth", chartDir}, release...)...)
		if _, absent := live(t, objs); len(absent) > 0 {
			t.Errorf("after the second helm install, missing: %v", absent)
		}
		h.run(t, "uninstall", "plinth", "--namespace", "default")
	}) {
		return
	}

	t.Run("every image of the release is in the registry", func(t *testing.T) {
		var names []string
		for _, r := range refs {
			names = append(names, r.RepositoryStr()[strings.LastIndex(r.RepositoryStr(), "/")+1:])
		}
		if !prereq.Strict() {
			if _, err := os.Stat(filepath.Join(imagesDir(t), names[0]+".tar")); err != nil {
				prereq.Missing(t, "the image archives of make images: %v", err)
			}
		}
		pushed, err := registry.Push(ctx, reg.Addr, false, controlplane.ImageArchives(t, names...)...)
		if err != nil {
			t.Fatal(err)
		}
		digests := map[string]string{}
		for _, p := range pushed {
			digests[p.Target.String()] = p.Digest.String()
		}
		n, used := 0, map[string]bool{}
		for _, o := range objs {
			for _, c := range containers(o) {
				img, _ := c["image"].(string)
				if !strings.HasPrefix(img, reg.Addr+"/") {
					t.Errorf("%s container %s: image %s is not in the registry %s", ID(o), c["name"], img, reg.Addr)
					continue
				}
				tag, err := name.NewTag(img, name.StrictValidation)
				if err != nil {
					t.Fatal(err)
				}
				desc, err := remote.Head(tag, remote.WithContext(ctx))
				if err != nil {
					t.Errorf("%s container %s: %s: %v", ID(o), c["name"], img, err)
					continue
				}
				if want := digests[img]; desc.Digest.String() != want {
					t.Errorf("%s: %s has %s in the registry, its archive %s", ID(o), img, desc.Digest, want)
				}
				n++
				used[img] = true
			}
		}
		if len(used) != len(pushed) {
			t.Errorf("the release uses %d of the %d images the values name: %v", len(used), len(pushed), used)
		}
		t.Logf("%d containers' images (%d images) found in %s with their archives' digests", n, len(used), reg.Addr)
	})
}

// imagesDir is the folder of the archives of make images (controlplane.ImageArchives' rule).
func imagesDir(t *testing.T) string {
	t.Helper()
	if d := os.Getenv(controlplane.EnvImages); d != "" {
		return d
	}
	bin, err := controlplane.TestBinDir()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(bin, "images")
}
