package agent_test

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/plinth-storage/plinth/agents/zfs"
	"github.com/plinth-storage/plinth/controllers/adopt"
	"github.com/plinth-storage/plinth/controllers/render"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/schema/vet"
	"github.com/plinth-storage/plinth/test/framework/controlplane"
)

// recoveryPolicy is the Git checkout of the guest's recovery step: the thin pool of the
// suite and the zpool of its crash points, as StoragePools, with a Placement each.
const recoveryPolicy = `apiVersion: policy.plinth.dev/v1alpha1
kind: StoragePool
metadata: {name: thin}
spec:
  nodeSelector: {matchLabels: {kubernetes.io/hostname: guest-node}}
  backend: {lvm: {volumeGroup: plinth-agent, devices: [/dev/vda], thinPool: {name: pool, sizePercent: 80}}}
---
apiVersion: policy.plinth.dev/v1alpha1
kind: StoragePool
metadata: {name: zfs}
spec:
  nodeSelector: {matchLabels: {kubernetes.io/hostname: guest-node}}
  backend: {zfs: {pool: plinthz, parentDataset: vols}}
---
apiVersion: policy.plinth.dev/v1alpha1
kind: Protocol
metadata: {name: local}
spec: {local: {}}
---
apiVersion: policy.plinth.dev/v1alpha1
kind: Placement
metadata: {name: thin}
spec:
  poolRef: {name: thin}
  protocolRef: {name: local}
  storageClass: {name: plinth-thin, volumeBindingMode: WaitForFirstConsumer}
  filesystem: {fsType: ext4}
---
apiVersion: policy.plinth.dev/v1alpha1
kind: Placement
metadata: {name: zfs}
spec:
  poolRef: {name: zfs}
  protocolRef: {name: local}
  storageClass: {name: plinth-zfs, volumeBindingMode: WaitForFirstConsumer}
  filesystem: {fsType: ext4}
`

const recoveryNamespace = "shop"

func recoveryClaim(name, class string) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "PersistentVolumeClaim"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: recoveryNamespace},
		Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &class, AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("32Mi")}}}}
}

var stampWritesRe = regexp.MustCompile(`(?m)^plinth_agent_identity_stamp_writes_total (\d+)`)

// guestStampWrites reads plinth_agent_identity_stamp_writes_total of the guest agent.
func (g guestT) stampWrites() int {
	g.t.Helper()
	m := stampWritesRe.FindStringSubmatch(g.sh("wget -q -O - http://127.0.0.1:18080/metrics"))
	if m == nil {
		g.t.Fatal("no plinth_agent_identity_stamp_writes_total in /metrics")
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// guestControlPlaneLost: a volume with data on the suite's thin pool and one on its zpool,
// each bound to a claim and stamped by the agent in the guest; then the host's control plane
// is stopped and its etcd data deleted, a fresh one is started on the same address, the
// agent (restarted with the new credentials) lists the volumes as unclaimed; `plinth adopt`'s
// code plans (adopt both, nothing written to the guest: LVM and ZFS metadata, the data and
// the agent's stamp-write counter unchanged) and confirms; the agent admits the adopted
// VolumeStates Ready, the claims bind to their old PVs, the data's checksums are equal and
// the fencing marks retire the old lifecycles. Stand-ins, as in test/recovery: the test
// creates the policy objects as Flux would, the VolumeStates as CreateVolume would, the PVs
// as csi-provisioner would; no kubelet. It replaces the suite's control plane: it runs last.
func guestControlPlaneLost(t *testing.T, cp *controlplane.ControlPlane, g guestT, a *storev1.Agent, refresh time.Duration) {
	ctx := t.Context()
	start := time.Now()
	gitDir := t.TempDir()
	for _, d := range []string{"policy", "apps"} {
		if err := os.MkdirAll(filepath.Join(gitDir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(gitDir, "policy", "policy.yaml"), []byte(recoveryPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	set, err := vet.Load(filepath.Join(gitDir, "policy"))
	if err != nil {
		t.Fatal(err)
	}
	v, err := vet.NewVetter()
	if err != nil {
		t.Fatal(err)
	}
	pol, problems := v.Vet(set)
	if len(problems) > 0 {
		t.Fatalf("policy: %v", problems)
	}
	// stand-in for Plinth's controller: the StorageClasses it renders (the PV binder needs
	// them for WaitForFirstConsumer claims)
	rendered, err := render.Render(render.Input{Pools: pol.Pools, Protocols: pol.Protocols, Placements: pol.Placements,
		Nodes: []corev1.Node{{ObjectMeta: metav1.ObjectMeta{Name: guestNode, Labels: map[string]string{"kubernetes.io/hostname": guestNode}}}}})
	if err != nil {
		t.Fatal(err)
	}
	// stand-in for Flux: the vetted policy objects
	applyPolicy := func(c client.Client) {
		t.Helper()
		var objs []client.Object
		for i := range rendered.StorageClasses {
			objs = append(objs, rendered.StorageClasses[i].DeepCopy())
		}
		for i := range pol.Pools {
			objs = append(objs, pol.Pools[i].DeepCopy())
		}
		for i := range pol.Protocols {
			objs = append(objs, pol.Protocols[i].DeepCopy())
		}
		for i := range pol.Placements {
			objs = append(objs, pol.Placements[i].DeepCopy())
		}
		objs = append(objs, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: recoveryNamespace}})
		for _, o := range objs {
			o.SetResourceVersion("")
			if err := c.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
				t.Fatalf("create %T %s: %v", o, o.GetName(), err)
			}
		}
	}
	// a client with the kinds this step writes (StorageClasses, PVs, PVCs besides Plinth's)
	clientOf := func(cp *controlplane.ControlPlane) client.Client {
		t.Helper()
		sc, err := adopt.Scheme()
		if err == nil {
			err = storagev1.AddToScheme(sc)
		}
		if err != nil {
			t.Fatal(err)
		}
		c, err := client.New(cp.Admin.Config, client.Options{Scheme: sc})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	c1 := clientOf(cp)
	applyPolicy(c1)
	// the zpool and its Store, made by the crash points step before this one (or here, when
	// this step runs alone)
	zfsStore := storev1.StoreName("zfs", guestNode)
	var zs storev1.Store
	if err := c1.Get(ctx, client.ObjectKey{Name: zfsStore}, &zs); apierrors.IsNotFound(err) {
		g.sh("zpool list plinthz >/dev/null 2>&1 || zpool create -f -o ashift=12 plinthz /dev/vdd")
		zs = storev1.Store{ObjectMeta: metav1.ObjectMeta{Name: zfsStore, Labels: nodeLabels(guestNode, "zfs")},
			Spec: storev1.StoreSpec{Pool: "zfs", NodeName: guestNode, Backend: pol.Pools[poolIndex(pol.Pools, "zfs")].Spec.Backend, Reserve: "5%", DriftPolicy: policyv1.DriftPolicyReport}}
		if err := c1.Create(ctx, &zs); err != nil {
			t.Fatal(err)
		}
		if err := c1.Get(ctx, client.ObjectKeyFromObject(a), a); err != nil {
			t.Fatal(err)
		}
		a.Spec.Stores = append(a.Spec.Stores, zfsStore)
		if err := c1.Update(ctx, a); err != nil {
			t.Fatal(err)
		}
	} else if err != nil {
		t.Fatal(err)
	}
	frozen := func(c client.Client, placement string) storev1.FrozenPolicy {
		t.Helper()
		var pl policyv1.Placement
		var pool policyv1.StoragePool
		var proto policyv1.Protocol
		if err := c.Get(ctx, client.ObjectKey{Name: placement}, &pl); err != nil {
			t.Fatal(err)
		}
		if err := c.Get(ctx, client.ObjectKey{Name: pl.Spec.PoolRef.Name}, &pool); err != nil {
			t.Fatal(err)
		}
		if err := c.Get(ctx, client.ObjectKey{Name: pl.Spec.ProtocolRef.Name}, &proto); err != nil {
			t.Fatal(err)
		}
		return adopt.Frozen(&pl, &pool, &proto, "ext4")
	}

	type vol struct {
		claim, class, placement, pool, store string
		// id, PV, device in the guest, the command listing its metadata (lvs or zfs get), the
		// data's checksum and the lost VolumeState's UID
		id, pv, device, meta, sum, oldUID string
	}
	vols := []*vol{
		{claim: "thin-0", class: "plinth-thin", placement: "thin", pool: "thin"},
		{claim: "zfs-0", class: "plinth-zfs", placement: "zfs", pool: "zfs"},
	}
	var apps []string
	for _, x := range vols {
		x.store = storev1.StoreName(x.pool, guestNode)
		pvc := recoveryClaim(x.claim, x.class)
		if err := c1.Create(ctx, pvc); err != nil {
			t.Fatal(err)
		}
		x.pv = "pvc-" + string(pvc.UID)
		// stand-in for CreateVolume: its VolumeState
		vs := &storev1.VolumeState{ObjectMeta: metav1.ObjectMeta{Name: storev1.VolumeID(x.pv), Finalizers: []string{storev1.FinalizerVolume},
			Labels: nodeLabels(guestNode, x.pool)},
			Spec: storev1.VolumeStateSpec{CSIName: x.pv, StoreName: x.store, CapacityBytes: 32 << 20, VolumeMode: "Filesystem", Policy: frozen(c1, x.placement)}}
		if err := c1.Create(ctx, vs); err != nil {
			t.Fatal(err)
		}
		x.id = vs.Name
		got := vs
		eventually(t, 3*time.Minute, "VolumeState "+x.claim+" Ready", func() (err error) { got, err = readyVS(ctx, c1, vs.Name); return err })
		x.device, x.oldUID = got.Status.DevicePath, string(got.UID)
		// stand-in for csi-provisioner: the PV, bound to the claim
		mode := corev1.PersistentVolumeFilesystem
		pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: x.pv, Annotations: map[string]string{adopt.AnnotationProvisionedBy: policyv1.DriverName}},
			Spec: corev1.PersistentVolumeSpec{Capacity: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("32Mi")},
				AccessModes: pvc.Spec.AccessModes, StorageClassName: x.class, VolumeMode: &mode, PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
				ClaimRef:               &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: recoveryNamespace, Name: x.claim, UID: pvc.UID},
				PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: policyv1.DriverName, VolumeHandle: vs.Name, FSType: "ext4"}}}}
		if err := c1.Create(ctx, pv); err != nil {
			t.Fatal(err)
		}
		// the app's data, through the volume's device in the guest
		g.sh(fmt.Sprintf("dd if=/dev/urandom of=%s bs=1M count=32 conv=fsync status=none", x.device))
		x.sum = g.sh("sha256sum < " + x.device)
		if x.pool == "thin" {
			x.meta = "lvs --noheadings -o lv_name,lv_size,lv_tags plinth-agent/" + x.id
		} else {
			// the properties Plinth sets or reads (space accounting moves with ZFS's own
			// transaction groups; the data's checksum covers the bytes)
			x.meta = "zfs get -Hp -o property,value,source volsize,volblocksize,refreservation," + zfs.PropManaged + "," + zfs.PropIdentity + " plinthz/vols/" + x.id
		}
		b, err := yaml.Marshal(recoveryClaim(x.claim, x.class))
		if err != nil {
			t.Fatal(err)
		}
		apps = append(apps, string(b))
	}
	for _, x := range vols {
		eventually(t, 2*time.Minute, "volume "+x.claim+" stamped with its claim", func() error {
			if out := g.sh(x.meta); !strings.Contains(out, "pvc="+x.claim) && !strings.Contains(out, "pvc."+x.claim) {
				return fmt.Errorf("no claim in the stamp yet: %s", out)
			}
			return nil
		})
	}
	t.Logf("TIMING guest recovery setup (2 volumes stamped) %s", time.Since(start).Round(time.Millisecond))

	// --- the loss: the host's whole control plane and its etcd data; the guest keeps its disks
	u, err := url.Parse(cp.URL)
	if err != nil {
		t.Fatal(err)
	}
	port, _ := strconv.Atoi(u.Port())
	if err := cp.Stop(); err != nil {
		t.Fatalf("stop the control plane: %v", err)
	}
	if _, err := os.Stat(cp.Dir); !os.IsNotExist(err) {
		t.Fatalf("the control plane's etcd data is still there (%s): %v", cp.Dir, err)
	}
	lossStart := time.Now()
	cp2, err := controlplane.Start(ctx, controlplane.Options{APIServerPort: port, ControllerManager: true})
	if err != nil {
		t.Fatalf("a fresh control plane on port %d: %v", port, err)
	}
	t.Cleanup(func() { cp2.Stop() }) //nolint:errcheck
	newEnvFor(t, cp2)                // Plinth's CRDs
	c2 := clientOf(cp2)
	kc, err := cp2.KubeconfigFor("admin", "https://127.0.0.1:6443")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(g.g.ShareDir(), "kubeconfig"), kc, 0o600); err != nil {
		t.Fatal(err)
	}
	// the agent restarts with the new credentials (its loop starts it again); no crash point armed
	g.sh(": > /tmp/agent-failpoints && kill $(cat /tmp/agent.pid)")
	// the same Agent and Stores again (stand-in for Plinth's controller rendering them)
	a2 := &storev1.Agent{ObjectMeta: metav1.ObjectMeta{Name: a.Name}, Spec: *a.Spec.DeepCopy()}
	if err := c2.Create(ctx, a2); err != nil {
		t.Fatal(err)
	}
	stores := map[string]policyv1.Backend{}
	for i := range pol.Pools {
		stores[pol.Pools[i].Name] = pol.Pools[i].Spec.Backend
	}
	for _, name := range []string{"thin", "zfs"} {
		s := &storev1.Store{ObjectMeta: metav1.ObjectMeta{Name: storev1.StoreName(name, guestNode), Labels: nodeLabels(guestNode, name)},
			Spec: storev1.StoreSpec{Pool: name, NodeName: guestNode, Backend: stores[name], Reserve: "5%", DriftPolicy: policyv1.DriftPolicyCorrect}}
		if err := c2.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	applyPolicy(c2)
	for _, x := range vols {
		eventually(t, 3*time.Minute, "the agent lists "+x.claim+"'s volume as unclaimed", func() error {
			var s storev1.Store
			if err := c2.Get(ctx, client.ObjectKey{Name: x.store}, &s); err != nil {
				return err
			}
			for _, u := range s.Status.Unclaimed {
				if u.VolumeID == x.id && strings.Contains(u.Stamp, "pvc="+x.claim) {
					return nil
				}
			}
			return fmt.Errorf("unclaimed %+v", s.Status.Unclaimed)
		})
	}
	t.Logf("TIMING guest recovery fresh control plane → volumes listed %s", time.Since(lossStart).Round(time.Millisecond))
	if err := os.WriteFile(filepath.Join(gitDir, "apps", "claims.yaml"), []byte(strings.Join(apps, "---\n")), 0o644); err != nil {
		t.Fatal(err)
	}

	// --- plan: adopt both; nothing written to the guest
	metaBefore := map[string]string{}
	for _, x := range vols {
		metaBefore[x.id] = g.sh(x.meta)
	}
	writesBefore := g.stampWrites()
	git, err := adopt.LoadGit([]string{gitDir})
	if err != nil {
		t.Fatal(err)
	}
	in, err := adopt.LoadInput(ctx, c2, git)
	if err != nil {
		t.Fatal(err)
	}
	p := adopt.Build(in)
	var text strings.Builder
	adopt.Write(&text, &adopt.Report{Plan: p}, adopt.FormatText)
	t.Logf("plan:\n%s", text.String())
	adopted := map[string]bool{}
	for _, a := range p.Adopt {
		adopted[a.VolumeID] = true
	}
	for _, x := range vols {
		if !adopted[x.id] {
			t.Fatalf("the plan does not adopt %s (%s)", x.id, x.claim)
		}
	}
	if len(p.Adopt) != len(vols) || len(p.Missing) != 0 {
		t.Fatalf("plan adopts %d, %d missing; want %d, 0", len(p.Adopt), len(p.Missing), len(vols))
	}
	// every Store is refreshed twice before the guest is read again
	_, r0 := g.lvmCounts()
	eventually(t, 6*refresh, "two refreshes of each Store after the plan", func() error {
		if _, r := g.lvmCounts(); r-r0 < 2*len(a2.Spec.Stores) {
			return fmt.Errorf("%d refreshes", r-r0)
		}
		return nil
	})
	for _, x := range vols {
		if got := g.sh(x.meta); got != metaBefore[x.id] {
			t.Errorf("planning changed %s's metadata:\n%s\nwant\n%s", x.claim, got, metaBefore[x.id])
		}
		if got := g.sh("sha256sum < " + x.device); got != x.sum {
			t.Errorf("data of %s changed before --confirm", x.claim)
		}
	}
	if w := g.stampWrites(); w != writesBefore {
		t.Errorf("the agent wrote %d identity stamps before --confirm", w-writesBefore)
	}

	// --- --confirm; the claims arrive (stand-in for Flux syncing apps/)
	confirmStart := time.Now()
	res, err := adopt.Apply(ctx, c2, p, 3*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if !r.Ready {
			t.Fatalf("adoption %+v", r)
		}
	}
	t.Logf("TIMING guest recovery --confirm → %d VolumeStates Ready %s", len(res), time.Since(confirmStart).Round(time.Millisecond))
	for _, x := range vols {
		if err := c2.Create(ctx, recoveryClaim(x.claim, x.class)); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	for _, x := range vols {
		var pvc corev1.PersistentVolumeClaim
		eventually(t, 2*time.Minute, "claim "+x.claim+" Bound", func() error {
			if err := c2.Get(ctx, client.ObjectKey{Namespace: recoveryNamespace, Name: x.claim}, &pvc); err != nil {
				return err
			}
			if pvc.Status.Phase != corev1.ClaimBound {
				return fmt.Errorf("phase %s", pvc.Status.Phase)
			}
			return nil
		})
		if pvc.Spec.VolumeName != x.pv {
			t.Errorf("claim %s bound to %s, want its old PV %s", x.claim, pvc.Spec.VolumeName, x.pv)
		}
		vs, err := readyVS(ctx, c2, x.id)
		if err != nil {
			t.Fatal(err)
		}
		if vs.Status.DevicePath != x.device {
			t.Errorf("%s: device %s after adoption, was %s", x.claim, vs.Status.DevicePath, x.device)
		}
		if got := g.sh("sha256sum < " + x.device); got != x.sum {
			t.Errorf("data of %s differs after adoption", x.claim)
		}
		m, found := g.guestMark(x.id)
		if !found || m.UID != string(vs.UID) || len(m.Retired) == 0 || m.Retired[len(m.Retired)-1] != x.oldUID {
			t.Errorf("fencing mark of %s: %+v found=%v; want UID %s retiring %s", x.claim, m, found, vs.UID, x.oldUID)
		}
	}
	t.Logf("TIMING guest recovery --confirm → claims Bound, data checked %s", time.Since(confirmStart).Round(time.Millisecond))
	// a second plan finds nothing more to adopt
	in, err = adopt.LoadInput(ctx, c2, git)
	if err != nil {
		t.Fatal(err)
	}
	if p := adopt.Build(in); len(p.Adopt) != 0 {
		t.Errorf("second plan adopts %+v", p.Adopt)
	}
}

func poolIndex(pools []policyv1.StoragePool, name string) int {
	for i := range pools {
		if pools[i].Name == name {
			return i
		}
	}
	return -1
}
