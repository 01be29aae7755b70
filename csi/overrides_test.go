package csi_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/csi"
	cueschema "github.com/plinth-storage/plinth/schema/cue"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// PVC annotations override the parameters their Placement allows, each judged by the policy
// schema; the VolumeState freezes what was overridden, and the volume context carries the
// result to the node plugin. A disallowed or invalid override (outside the schema's
// allow-lists of mkfs and mount options, or longer than the bound) fails with INVALID_ARGUMENT
// naming the PVC, the annotation and the rule, and a Warning event OverrideRefused on the PVC
// says the same.
func TestCreateVolumeOverrides(t *testing.T) {
	e := controllerEnv(t, "ovr", map[string]int64{"ovr-small": 10 * gib, "ovr-large": 100 * gib})
	ctx := t.Context()
	var pl policyv1.Placement
	if err := e.c.Get(ctx, client.ObjectKey{Name: "ovr-local"}, &pl); err != nil {
		t.Fatal(err)
	}
	pl.Spec.Filesystem.MountOptions = []string{"noatime"}
	pl.Spec.Overrides = &policyv1.Overrides{Allowed: []policyv1.OverrideParameter{
		policyv1.OverrideMkfsOptions, policyv1.OverrideMountOptions, policyv1.OverrideStrategy}}
	if err := e.c.Update(ctx, &pl); err != nil {
		t.Fatal(err)
	}
	mkfs := policyv1.OverrideAnnotations[policyv1.OverrideMkfsOptions]
	mount := policyv1.OverrideAnnotations[policyv1.OverrideMountOptions]
	strategy := policyv1.OverrideAnnotations[policyv1.OverrideStrategy]
	pvc := func(name string, annotations map[string]string) map[string]string {
		create(t, e.c, &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, Annotations: annotations},
			Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}},
		})
		return map[string]string{csi.ParamPVCName: name, csi.ParamPVCNamespace: "default"}
	}
	createFor := func(name string, params, extra map[string]string) (*csipb.Volume, error) {
		p := maps.Clone(params)
		maps.Copy(p, extra)
		resp, err := e.ctrl.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: name, CapacityRange: &csipb.CapacityRange{RequiredBytes: gib},
			VolumeCapabilities: mountCap(rwo), Parameters: p})
		return resp.GetVolume(), err
	}
	frozen := func(v *csipb.Volume) *storev1.VolumeState {
		t.Helper()
		vs := &storev1.VolumeState{}
		if err := e.c.Get(ctx, client.ObjectKey{Name: v.GetVolumeId()}, vs); err != nil {
			t.Fatal(err)
		}
		return vs
	}

	// All three overrides: Spreadout picks the store with the most room, the options reach
	// the frozen policy and the volume context.
	ann := map[string]string{mkfs: "-m 0  -E lazy_itable_init=0", mount: "nodiscard, nosuid", strategy: "Spreadout", "unrelated": "x"}
	v, err := createFor("ovr-a", e.local, pvc("ovr-a", ann))
	if err != nil {
		t.Fatal(err)
	}
	vs := frozen(v)
	wantAnn := map[string]string{mkfs: ann[mkfs], mount: ann[mount], strategy: "Spreadout"}
	if !maps.Equal(vs.Spec.Policy.Overrides, wantAnn) {
		t.Errorf("frozen overrides %v, want %v", vs.Spec.Policy.Overrides, wantAnn)
	}
	if fs := vs.Spec.Policy.Filesystem; !slices.Equal(fs.MkfsOptions, []string{"-m", "0", "-E", "lazy_itable_init=0"}) ||
		!slices.Equal(fs.MountOptions, []string{"noatime", "nodiscard", "nosuid"}) {
		t.Errorf("frozen filesystem %+v", fs)
	}
	if vs.Spec.StoreName != e.storeFor["ovr-large"] {
		t.Errorf("Spreadout override placed the volume on %s, want %s", vs.Spec.StoreName, e.storeFor["ovr-large"])
	}
	var ctxMkfs []string
	if err := json.Unmarshal([]byte(v.GetVolumeContext()[csi.ContextMkfsOptions]), &ctxMkfs); err != nil || len(ctxMkfs) != 4 {
		t.Errorf("volume context mkfs options %q (%v)", v.GetVolumeContext()[csi.ContextMkfsOptions], err)
	}

	// No annotation: the placement's own Binpack and options, nothing frozen as overridden.
	v, err = createFor("ovr-b", e.local, pvc("ovr-b", nil))
	if err != nil {
		t.Fatal(err)
	}
	if vs := frozen(v); vs.Spec.Policy.Overrides != nil || vs.Spec.StoreName != e.storeFor["ovr-small"] ||
		!slices.Equal(vs.Spec.Policy.Filesystem.MountOptions, []string{"noatime"}) {
		t.Errorf("without overrides: store %s overrides %v filesystem %+v", vs.Spec.StoreName, vs.Spec.Policy.Overrides, vs.Spec.Policy.Filesystem)
	}

	for _, tc := range []struct {
		name   string
		params map[string]string
		ann    map[string]string
		want   []string
	}{
		{"ovr-c", e.nvme, map[string]string{strategy: "Spreadout"}, []string{"PVC default/ovr-c", strategy, `Placement "ovr-nvme" does not allow`}},
		{"ovr-d", e.local, map[string]string{strategy: "spreadout"}, []string{"PVC default/ovr-d", strategy, "conflicting values"}},
		{"ovr-e", e.local, map[string]string{mount: "noatime,,ro"}, []string{mount, "empty mount option"}},
		// The allow-lists of the schema, for the volume's ext4: shell syntax, a mount that
		// mounts something else, setuid files, a value over the length bound.
		{"ovr-g", e.local, map[string]string{mkfs: "-m 0; touch /tmp/x"}, []string{"PVC default/ovr-g", mkfs, `"0;" holds a shell metacharacter`}},
		{"ovr-h", e.local, map[string]string{mount: "bind"}, []string{"PVC default/ovr-h", mount, `mount option "bind" is refused`}},
		{"ovr-i", e.local, map[string]string{mount: "x-mount.mkdir=/root/x,suid"}, []string{mount, `"x-mount.mkdir=/root/x" is refused`, `"suid" is refused`}},
		{"ovr-j", e.local, map[string]string{mount: strings.Repeat("noatime,", 625)}, []string{mount, "5000 bytes, more than the 1024"}},
	} {
		_, err := createFor(tc.name, tc.params, pvc(tc.name, tc.ann))
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", tc.name, err)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(status.Convert(err).Message(), w) {
				t.Errorf("%s: %q lacks %q", tc.name, status.Convert(err).Message(), w)
			}
		}
		vs := &storev1.VolumeState{}
		if err := e.c.Get(ctx, client.ObjectKey{Name: storev1.VolumeID(tc.name)}, vs); err == nil {
			t.Errorf("%s: a refused override still created VolumeState %s", tc.name, vs.Name)
		}
		// The claim's author, who may not see the provisioner's log, reads why on the PVC.
		if msg := eventAbout(t, e.c, tc.name, csi.ReasonOverrideRefused); msg != status.Convert(err).Message() {
			t.Errorf("%s: event %s says %q, want the error %q", tc.name, csi.ReasonOverrideRefused, msg, status.Convert(err).Message())
		}
	}
	_, err = createFor("ovr-f", e.local, map[string]string{csi.ParamPVCName: "ovr-nosuch", csi.ParamPVCNamespace: "default"})
	wantCode(t, "PVC named by the request does not exist", err, codes.InvalidArgument)
}

// sidecarOverrides runs in TestSidecars, through the real csi-provisioner
// (--extra-create-metadata): a PVC's allowed override reaches the VolumeState, and one its
// Placement refuses leaves the PVC Pending with a ProvisioningFailed event that names the
// annotation.
func sidecarOverrides(t *testing.T, s *sidecars, placement string) {
	ctx := t.Context()
	c := kubeClient(t, shared.cp.Admin.Config)
	var pl policyv1.Placement
	if err := c.Get(ctx, client.ObjectKey{Name: placement}, &pl); err != nil {
		t.Fatal(err)
	}
	pl.Spec.Overrides = &policyv1.Overrides{Allowed: []policyv1.OverrideParameter{policyv1.OverrideMkfsOptions}}
	if err := c.Update(ctx, &pl); err != nil {
		t.Fatal(err)
	}
	mkfs := policyv1.OverrideAnnotations[policyv1.OverrideMkfsOptions]
	strategy := policyv1.OverrideAnnotations[policyv1.OverrideStrategy]
	ok, refused := s.pvc("ok", "1Gi"), s.pvc("refused", "1Gi")
	ok.Annotations = map[string]string{mkfs: "-i size=512"} // the placement is xfs
	refused.Annotations = map[string]string{strategy: "Spreadout"}
	for _, p := range []*corev1.PersistentVolumeClaim{ok, refused} {
		if _, err := s.cs.CoreV1().PersistentVolumeClaims(s.ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	until(t, 2*time.Minute, "PVC ok Bound with the override frozen", func() error {
		pvc, err := s.cs.CoreV1().PersistentVolumeClaims(s.ns).Get(ctx, "ok", metav1.GetOptions{})
		if err != nil || pvc.Status.Phase != corev1.ClaimBound {
			return fmt.Errorf("phase %s (%v)", pvc.Status.Phase, err)
		}
		vs := &storev1.VolumeState{}
		if err := c.Get(ctx, client.ObjectKey{Name: storev1.VolumeID(pvc.Spec.VolumeName)}, vs); err != nil {
			return err
		}
		if vs.Spec.Policy.Overrides[mkfs] != "-i size=512" || !slices.Equal(vs.Spec.Policy.Filesystem.MkfsOptions, []string{"-i", "size=512"}) {
			return fmt.Errorf("frozen policy %+v", vs.Spec.Policy)
		}
		return nil
	})
	until(t, 2*time.Minute, "ProvisioningFailed on PVC refused naming the annotation", func() error {
		evs, err := s.cs.CoreV1().Events(s.ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=refused"})
		if err != nil {
			return err
		}
		for _, ev := range evs.Items {
			if ev.Reason == "ProvisioningFailed" && strings.Contains(ev.Message, strategy) && strings.Contains(ev.Message, "InvalidArgument") {
				return nil
			}
		}
		return fmt.Errorf("%d events, none ProvisioningFailed naming %s", len(evs.Items), strategy)
	})
	pvc, err := s.cs.CoreV1().PersistentVolumeClaims(s.ns).Get(ctx, "refused", metav1.GetOptions{})
	if err != nil || pvc.Status.Phase != corev1.ClaimPending || pvc.Spec.VolumeName != "" {
		t.Errorf("refused PVC: phase %s volume %q (%v), want Pending without a volume", pvc.Status.Phase, pvc.Spec.VolumeName, err)
	}
	for _, name := range []string{"ok", "refused"} {
		if err := s.cs.CoreV1().PersistentVolumeClaims(s.ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// The Placement CRD's CEL rules refuse at the real API server what the policy schema refuses in
// filesystem options (the allow-lists of #Filesystem), and accept what it accepts: every option
// list of the corpus gets the same verdict from a dry-run create and from the schema, the
// verdict the corpus states.
func TestPlacementOptionsAPIServerAgreesWithSchema(t *testing.T) {
	c := kubeClient(t, sharedControlPlane(t).Admin.Config)
	ctx := t.Context()
	long := "-L" + strings.Repeat("a", 255)
	many := slices.Repeat([]string{"noatime"}, 33)
	for i, tc := range []struct {
		fsType      string
		mkfs, mount []string
		ok          bool
	}{
		{"ext4", []string{"-m", "1", "-j", "-b4096"}, []string{"noatime", "nosuid", "nodev", "noexec"}, true},
		{"ext4", []string{"-E", "lazy_itable_init=0,stride=16", "-O", "^has_journal,metadata_csum", "-L", "data"}, []string{"errors=remount-ro", "commit=30", "data=ordered"}, true},
		{"xfs", []string{"-m", "crc=1,reflink=1", "-i", "size=512", "-K"}, []string{"logbsize=256k", "nouuid", "inode64", "exec"}, true},
		{"ext4", nil, nil, true},
		{"ext4", []string{"-m 1"}, nil, false},
		{"ext4", []string{"-m", "0;reboot"}, nil, false},
		{"ext4", []string{"$(id)"}, nil, false},
		{"ext4", []string{"-m", "0", "/dev/sdb"}, nil, false},
		{"ext4", []string{"-d", "/etc"}, nil, false},
		{"ext4", []string{"-e", "panic"}, nil, false},
		{"ext4", []string{"-b"}, nil, false},
		{"ext4", []string{"-F"}, nil, false},
		{"ext4", []string{""}, nil, false},
		{"ext4", []string{long}, nil, false},
		{"xfs", []string{"-m", "0"}, nil, false},
		{"xfs", []string{"-p", "/etc/proto"}, nil, false},
		{"xfs", []string{"-E", "lazy_itable_init=0"}, nil, false},
		{"ext4", []string{"-L", "-q"}, nil, false},
		{"ext4", []string{"-m1", "1"}, nil, false},
		{"ext4", []string{"-m", "51"}, nil, false},
		{"ext4", []string{"-O", "journal_dev"}, nil, false},
		{"ext4", []string{"-q", "-D", "-m", "1.5", "-N", "100", "-T", "small,news", "-J", "size=64"}, nil, true},
		{"ext4", nil, []string{"noload"}, false},
		{"xfs", nil, []string{"logbufs=9"}, false},
		{"ext4", nil, []string{"ro", "dax=inode", "journal_ioprio=3"}, true},
		{"ext4", nil, []string{"suid"}, false},
		{"ext4", nil, []string{"dev"}, false},
		{"ext4", nil, []string{"bind"}, false},
		{"ext4", nil, []string{"remount"}, false},
		{"ext4", nil, []string{"x-mount.mkdir=/root/x"}, false},
		{"ext4", nil, []string{"helper=evil"}, false},
		{"ext4", nil, []string{"errors=panic"}, false},
		{"ext4", nil, []string{"noexec", "exec"}, false},
		{"xfs", nil, []string{"rw", "ro"}, false},
		{"ext4", nil, []string{"nosuid,nodev"}, false},
		{"ext4", nil, []string{""}, false},
		{"ext4", nil, []string{"logbsize=64k"}, false},
		{"xfs", nil, []string{"data=ordered"}, false},
		{"xfs", nil, []string{"rtdev=/dev/sdc"}, false},
		{"ext4", nil, many, false},
	} {
		pl := &policyv1.Placement{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("options-%d", i)}, Spec: policyv1.PlacementSpec{
			PoolRef: policyv1.LocalObjectReference{Name: "p"}, ProtocolRef: policyv1.LocalObjectReference{Name: "p"},
			StorageClass: policyv1.StorageClassTemplate{Name: "options"},
			Filesystem:   policyv1.Filesystem{FSType: tc.fsType, MkfsOptions: tc.mkfs, MountOptions: tc.mount}}}
		server := c.Create(ctx, pl, client.DryRunAll)
		if server != nil && !apierrors.IsInvalid(server) {
			t.Fatalf("case %d: %v", i, server)
		}
		fs := map[string]any{"fsType": tc.fsType}
		if tc.mkfs != nil {
			fs["mkfsOptions"] = tc.mkfs
		}
		if tc.mount != nil {
			fs["mountOptions"] = tc.mount
		}
		schema := cueschema.CheckPlacementField([]string{"filesystem"}, fs)
		if (server == nil) != tc.ok || (schema == nil) != tc.ok {
			t.Errorf("case %d %s mkfs %.60q mount %.60q: API server %v, schema %v; want accepted %v", i, tc.fsType, tc.mkfs, tc.mount, server, schema, tc.ok)
		}
	}
}
