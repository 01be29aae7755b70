package guestnode

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	"github.com/plinth-storage/plinth/test/framework/controlplane"
	"github.com/plinth-storage/plinth/test/framework/devenv"
)

// The policy repository as Flux reads it: the folder the Kustomization applies.
const (
	fluxNS         = devenv.FluxNamespace
	policyRepoPath = "clusters/guest"
	// fluxPolicyName is the GitRepository's and the Kustomization's name in
	// kustomize/flux/policies.yaml, what a user applies.
	fluxPolicyName = "storage-policies"
)

// guestPolicy is the first policy commit of the walkthrough (docs/install.md, step 4): a thin
// pool on the storage node's disk, NVMe-oF/TCP on the relay's network with DH-HMAC-CHAP both
// ways and an Immediate class of it with two write-limit tiers (guestTiers), and a local class
// of the same pool (WaitForFirstConsumer, expansion allowed).
func guestPolicy(storage string) []client.Object {
	return []client.Object{
		&policyv1.StoragePool{TypeMeta: metav1.TypeMeta{Kind: "StoragePool"}, ObjectMeta: metav1.ObjectMeta{Name: agentPool}, Spec: policyv1.StoragePoolSpec{
			NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelHostname: storage}},
			Backend: policyv1.Backend{LVM: &policyv1.LVMBackend{VolumeGroup: agentVG, Devices: []string{"/dev/vda"},
				ThinPool: &policyv1.ThinPool{Name: "pool", SizePercent: 80}}},
			Reserve: "5%", OvercommitPercent: ptr.To[int32](400)}},
		&policyv1.Protocol{TypeMeta: metav1.TypeMeta{Kind: "Protocol"}, ObjectMeta: metav1.ObjectMeta{Name: volumeClass}, Spec: policyv1.ProtocolSpec{
			NVMeoFTCP: &policyv1.NVMeoFTCPProtocol{Port: nvmePort, BindCIDR: netCIDR, ACL: ptr.To(true),
				CtrlLossTmo: ptr.To[int32](ctrlLossTmo), ReconnectDelay: reconnectDelay,
				Auth: &policyv1.NVMeoFAuth{Mode: policyv1.AuthDHHMACCHAP, Hash: "sha256", DHGroup: "ffdhe2048", Bidirectional: true}}}},
		&policyv1.Placement{TypeMeta: metav1.TypeMeta{Kind: "Placement"}, ObjectMeta: metav1.ObjectMeta{Name: volumeClass}, Spec: policyv1.PlacementSpec{
			PoolRef: policyv1.LocalObjectReference{Name: agentPool}, ProtocolRef: policyv1.LocalObjectReference{Name: volumeClass},
			StorageClass:      policyv1.StorageClassTemplate{Name: volumeClass, VolumeBindingMode: "Immediate"},
			Filesystem:        policyv1.Filesystem{FSType: "ext4"},
			AttributesClasses: guestTiers()}},
		&policyv1.Protocol{TypeMeta: metav1.TypeMeta{Kind: "Protocol"}, ObjectMeta: metav1.ObjectMeta{Name: localClass},
			Spec: policyv1.ProtocolSpec{Local: &policyv1.LocalProtocol{}}},
		&policyv1.Placement{TypeMeta: metav1.TypeMeta{Kind: "Placement"}, ObjectMeta: metav1.ObjectMeta{Name: localClass}, Spec: policyv1.PlacementSpec{
			PoolRef: policyv1.LocalObjectReference{Name: agentPool}, ProtocolRef: policyv1.LocalObjectReference{Name: localClass},
			StorageClass: policyv1.StorageClassTemplate{Name: localClass, VolumeBindingMode: "WaitForFirstConsumer", AllowVolumeExpansion: true},
			Filesystem:   policyv1.Filesystem{FSType: "ext4"}}},
	}
}

// policyFiles renders objs as one multi-document YAML file, name, of the repository's folder.
func policyFiles(t *testing.T, objs []client.Object, name string) map[string][]byte {
	t.Helper()
	var b bytes.Buffer
	for _, o := range objs {
		gvk := policyv1.GroupVersion.WithKind(o.GetObjectKind().GroupVersionKind().Kind)
		o.GetObjectKind().SetGroupVersionKind(gvk)
		data, err := yaml.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		b.WriteString("---\n")
		b.Write(data)
	}
	return map[string][]byte{policyRepoPath + "/" + name: b.Bytes()}
}

// commitPolicy delivers objs the way users do (docs/install.md, step 4): committed to a Git
// repository (served on the host's loopback, devenv.ServeGit) that Flux's source-controller
// and kustomize-controller (testbin's pinned builds, processes on the host against the API
// server, as test/framework/devenv runs them) apply with the GitRepository and Kustomization
// of kustomize/flux/policies.yaml, pointed at it with short intervals and without its
// dependency on a Kustomization of Plinth itself (helm installed Plinth). It returns once the
// Kustomization is Ready: applied, and every policy object Ready by its health checks.
func commitPolicy(t *testing.T, s *scene, objs []client.Object) {
	t.Helper()
	t0 := time.Now()
	bin, err := controlplane.TestBinDir()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := envtest.InstallCRDs(s.cp.Admin.Config, envtest.CRDInstallOptions{
		Paths: []string{filepath.Join(bin, "crds", "flux")}, ErrorIfPathMissing: true}); err != nil {
		t.Fatalf("Flux CRDs (make testbin): %v", err)
	}
	if err := s.c.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fluxNS}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	s.policyRepo = filepath.Join(s.work, "policy-repo")
	url, stop, err := devenv.ServeGit(s.policyRepo, policyFiles(t, objs, "policy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	s.policyURL = url
	// SpreadAcrossZones commits to it long after this step ended
	s.cleanup(stop)
	var ports [5]int
	for i := range ports {
		if ports[i], err = controlplane.FreePort(); err != nil {
			t.Fatal(err)
		}
	}
	storage := fmt.Sprintf("127.0.0.1:%d", ports[0])
	// source-controller refuses a storage path that does not exist
	if err := os.MkdirAll(filepath.Join(s.work, "flux-storage"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, spec := range []controlplane.ProcessSpec{
		{Name: devenv.BinSourceController, Binary: devenv.BinSourceController,
			Args: []string{fmt.Sprintf("--metrics-addr=127.0.0.1:%d", ports[1]), fmt.Sprintf("--health-addr=127.0.0.1:%d", ports[2]),
				"--storage-path=" + filepath.Join(s.work, "flux-storage"), "--storage-addr=" + storage, "--storage-adv-addr=" + storage,
				"--enable-leader-election=false", "--log-level=info"},
			Ready: controlplane.HTTPReady(fmt.Sprintf("http://127.0.0.1:%d/readyz", ports[2]), nil)},
		{Name: devenv.BinKustomizeController, Binary: devenv.BinKustomizeController,
			Args: []string{fmt.Sprintf("--metrics-addr=127.0.0.1:%d", ports[3]), fmt.Sprintf("--health-addr=127.0.0.1:%d", ports[4]),
				"--enable-leader-election=false", "--log-level=info"},
			Ready: controlplane.HTTPReady(fmt.Sprintf("http://127.0.0.1:%d/readyz", ports[4]), nil)},
	} {
		// Flux's controllers take no --kubeconfig flag: controller-runtime reads KUBECONFIG.
		spec.Env = []string{"KUBECONFIG=" + s.cp.Admin.Kubeconfig}
		spec.ReadyTimeout = 3 * time.Minute
		if _, err := s.cp.StartProcess(t.Context(), spec); err != nil {
			t.Fatalf("start %s: %v", spec.Name, err)
		}
	}
	data, err := os.ReadFile(filepath.Join(s.root, "kustomize", "flux", "policies.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	kinds := 0
	for {
		o := &unstructured.Unstructured{}
		if err := dec.Decode(&o.Object); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			t.Fatal(err)
		}
		if len(o.Object) == 0 {
			continue
		}
		switch o.GetKind() {
		case "GitRepository":
			_ = unstructured.SetNestedField(o.Object, url, "spec", "url")
			_ = unstructured.SetNestedField(o.Object, "5s", "spec", "interval")
		case "Kustomization":
			unstructured.RemoveNestedField(o.Object, "spec", "dependsOn")
			_ = unstructured.SetNestedField(o.Object, "./"+policyRepoPath, "spec", "path")
			_ = unstructured.SetNestedField(o.Object, "5s", "spec", "retryInterval")
			_ = unstructured.SetNestedField(o.Object, "1m", "spec", "interval")
		}
		if err := s.c.Create(t.Context(), o); err != nil {
			t.Fatalf("create %s %s: %v", o.GetKind(), o.GetName(), err)
		}
		kinds++
	}
	if kinds != 2 {
		t.Fatalf("kustomize/flux/policies.yaml: %d objects, want a GitRepository and a Kustomization", kinds)
	}
	poll(t, 8*time.Minute, 2*time.Second, "the Kustomization "+fluxPolicyName+" Ready", func() error {
		k := &unstructured.Unstructured{}
		k.SetAPIVersion("kustomize.toolkit.fluxcd.io/v1")
		k.SetKind("Kustomization")
		if err := s.c.Get(t.Context(), client.ObjectKey{Namespace: fluxNS, Name: fluxPolicyName}, k); err != nil {
			return err
		}
		conds, _, _ := unstructured.NestedSlice(k.Object, "status", "conditions")
		for _, c := range conds {
			m, _ := c.(map[string]any)
			if m["type"] == "Ready" {
				if m["status"] != "True" {
					return fmt.Errorf("Ready=%v: %v", m["status"], m["message"])
				}
				rev, _, _ := unstructured.NestedString(k.Object, "status", "lastAppliedRevision")
				t.Logf("Kustomization %s Ready at %s: %v", fluxPolicyName, rev, m["message"])
				return nil
			}
		}
		return fmt.Errorf("no Ready condition yet")
	})
	// applied by kustomize-controller: its labels on every object of the commit
	for _, o := range objs {
		got := o.DeepCopyObject().(client.Object)
		if err := s.c.Get(t.Context(), client.ObjectKeyFromObject(o), got); err != nil {
			t.Fatal(err)
		}
		if got.GetLabels()["kustomize.toolkit.fluxcd.io/name"] != fluxPolicyName {
			t.Errorf("%s %s labels %v: not applied by the Kustomization %s", o.GetObjectKind().GroupVersionKind().Kind, o.GetName(), got.GetLabels(), fluxPolicyName)
		}
	}
	t.Logf("TIMING policy committed → applied by Flux, every policy object Ready %s", time.Since(t0).Round(time.Millisecond))
}
