package agent_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/agents/agent"
	"github.com/plinth-storage/plinth/agents/file"
	"github.com/plinth-storage/plinth/internal/identity"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

func counterValue(c prometheus.Counter) float64 {
	m := &dto.Metric{}
	if err := c.Write(m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}

// identityHost runs, inside TestHostFaults's control plane and Store s (file backend in
// dir), the agent's identity stamping and its scan of unclaimed volumes under driftPolicy
// Correct with a grace period of 1 ns:
//   - a Ready volume is stamped on the next pass with the claim its PV names and the
//     Store's UID; a lost record is written again at the next pass without touching the
//     image; stamps already current are not rewritten (the write counter stays put);
//   - volumes no VolumeState names and whose stamp was written under another Store object
//     (a lost control plane), or is torn, are listed in status.unclaimed with their stamp,
//     reported as orphans and never deleted nor written to.
func identityHost(t *testing.T, e *env, s *storev1.Store, dir string, in agent.Options) {
	ctx := t.Context()
	backendDecl := policyv1.Backend{File: &policyv1.FileBackend{Directory: dir}}
	local := policyv1.ProtocolSpec{Local: &policyv1.LocalProtocol{}}
	setPolicy := func(p policyv1.DriftPolicy) {
		t.Helper()
		if err := e.c.Get(ctx, client.ObjectKeyFromObject(s), s); err != nil {
			t.Fatal(err)
		}
		s.Spec.DriftPolicy = p
		if err := e.c.Update(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	setPolicy(policyv1.DriftPolicyCorrect)
	defer setPolicy(policyv1.DriftPolicyReport)

	fb, err := file.New(file.Config{Directory: dir})
	if err != nil {
		t.Fatal(err)
	}
	// two volumes of a lost control plane, with data: one stamped, one with a torn record
	lostStamp := identity.Stamp{VolumeID: storev1.VolumeID("pvc-lost"), PVCNamespace: "shop", PVCName: "data-0",
		PVCUID: "uid-lost", PVName: "pvc-lost", StorageClass: "plinth-fast", Placement: "fast", SizeBytes: mib,
		Filesystem: "ext4", VolumeMode: "Filesystem", PolicyDigest: strings.Repeat("ab", 16), StoreUID: "uid-of-a-lost-store"}
	torn := storev1.VolumeID("pvc-torn")
	images := map[string][]byte{}
	for _, id := range []string{lostStamp.VolumeID, torn} {
		if _, err := fb.Create(ctx, id, mib); err != nil {
			t.Fatal(err)
		}
		data := bytes.Repeat([]byte(id[:12]), 1000)
		if err := os.WriteFile(filepath.Join(dir, id+".img"), data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(filepath.Join(dir, id+".img"), mib); err != nil {
			t.Fatal(err)
		}
		images[id], _ = os.ReadFile(filepath.Join(dir, id+".img"))
	}
	if err := fb.Stamp(ctx, lostStamp); err != nil {
		t.Fatal(err)
	}
	tornStamp := lostStamp
	tornStamp.VolumeID = torn
	text, _ := tornStamp.Text()
	if err := os.WriteFile(filepath.Join(dir, torn+".id"), []byte(text[:len(text)/2]), 0o600); err != nil {
		t.Fatal(err)
	}
	records := map[string][]byte{}
	for id := range images {
		records[id], _ = os.ReadFile(filepath.Join(dir, id+".id"))
	}

	// a claimed volume whose PV exists before the agent stamps it
	vs := newVolumeState("pvc-stamped", node, pool, s.Name, 2*mib, local, backendDecl)
	vs.Spec.Policy.Filesystem.FSType = "ext4"
	pv := &corev1.PersistentVolume{}
	pv.Name = vs.Spec.CSIName
	pv.Spec = corev1.PersistentVolumeSpec{
		Capacity:               corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("2Mi")},
		AccessModes:            []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
		StorageClassName:       "plinth-fast",
		ClaimRef:               &corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: "shop", Name: "data-1", UID: "uid-data-1"},
		PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: "csi.plinth.dev", VolumeHandle: vs.Name}},
	}
	for _, o := range []client.Object{pv, vs} {
		if err := e.c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	defer func() {
		e.c.Delete(context.Background(), pv)
	}()

	in.OrphanGracePeriod = time.Nanosecond
	// The agent counts a stamp write after the file is in place: a wait on the file alone
	// could read the counter before it moved, so each wait below ends on both, with the
	// count of writes so far exact.
	base := counterValue(agent.StampWrites)
	counted := func(n float64) error {
		if got := counterValue(agent.StampWrites) - base; got != n {
			return fmt.Errorf("%v stamp writes counted, want %v", got, n)
		}
		return nil
	}
	r := &runner{t: t, cfg: e.cfg}
	r.start(in)
	defer r.stop()
	eventually(t, 60*time.Second, "claimed volume Ready", func() error { _, err := readyVS(ctx, e.c, vs.Name); return err })
	if err := e.c.Get(ctx, client.ObjectKeyFromObject(s), s); err != nil {
		t.Fatal(err)
	}
	digest, _ := identity.PolicyDigest(vs.Spec.Policy)
	want := identity.Stamp{VolumeID: vs.Name, PVCNamespace: "shop", PVCName: "data-1", PVCUID: "uid-data-1",
		PVName: vs.Spec.CSIName, StorageClass: "plinth-fast", Placement: "p", SizeBytes: 2 * mib, Filesystem: "ext4",
		VolumeMode: "Filesystem", PolicyDigest: digest, StoreUID: string(s.UID)}
	rec := filepath.Join(dir, vs.Name+".id")
	stamped := func() error {
		b, err := os.ReadFile(rec)
		if err != nil {
			return err
		}
		got, err := identity.ParseText(string(b))
		if err != nil || got != want {
			return fmt.Errorf("stamp %+v, %v; want %+v", got, err, want)
		}
		return nil
	}
	eventually(t, 30*time.Second, "claimed volume stamped, one write", func() error { return errors.Join(stamped(), counted(1)) })
	ino := inode(t, filepath.Join(dir, vs.Name+".img"))
	if err := os.Remove(rec); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "lost record written again at the next pass, one write", func() error { return errors.Join(stamped(), counted(2)) })
	if inode(t, filepath.Join(dir, vs.Name+".img")) != ino {
		t.Error("restamping re-provisioned the volume")
	}

	writes := counterValue(agent.StampWrites)
	beats := map[string]bool{}
	var st storev1.StoreStatus
	eventually(t, 60*time.Second, "unclaimed volumes listed over three refreshes", func() error {
		if err := e.c.Get(ctx, client.ObjectKeyFromObject(s), s); err != nil {
			return err
		}
		st = s.Status
		if len(st.Unclaimed) != 2 {
			return fmt.Errorf("unclaimed %+v", st.Unclaimed)
		}
		beats[st.LastHeartbeatTime.String()] = true
		if len(beats) < 3 {
			return fmt.Errorf("%d refreshes seen", len(beats))
		}
		return nil
	})
	if w := counterValue(agent.StampWrites); w != writes {
		t.Errorf("%v stamp writes on passes where every stamp was current", w-writes)
	}
	byID := map[string]storev1.UnclaimedVolume{}
	for _, u := range st.Unclaimed {
		byID[u.VolumeID] = u
	}
	if got, err := identity.ParseLine(byID[lostStamp.VolumeID].Stamp); err != nil || got != lostStamp || byID[lostStamp.VolumeID].SizeBytes != mib {
		t.Errorf("unclaimed entry %+v decodes to %+v, %v; want %+v", byID[lostStamp.VolumeID], got, err, lostStamp)
	}
	if u := byID[torn]; u.Stamp != "" || !strings.Contains(u.StampError, identity.ErrTorn.Error()) {
		t.Errorf("torn entry %+v", u)
	}
	kept := 0
	for _, d := range st.Drift {
		if d.Reason == agent.DriftOrphan && strings.Contains(d.Message, "driftPolicy Correct keeps it") {
			kept++
		}
	}
	if kept != 2 {
		t.Errorf("%d orphans reported as kept under Correct, want 2: %+v", kept, st.Drift)
	}
	for id, data := range images {
		if got, err := os.ReadFile(filepath.Join(dir, id+".img")); err != nil || !bytes.Equal(got, data) {
			t.Errorf("image of unclaimed %s changed or gone: %v", id, err)
		}
		if got, _ := os.ReadFile(filepath.Join(dir, id+".id")); !bytes.Equal(got, records[id]) {
			t.Errorf("record of unclaimed %s written to", id)
		}
	}
	if err := e.c.Delete(ctx, vs); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "claimed volume deleted", func() error { return gone(ctx, e.c, vs) })
	if _, err := os.Stat(rec); !os.IsNotExist(err) {
		t.Errorf("record of the deleted volume: %v", err)
	}
	for id := range images {
		if err := fb.Delete(ctx, id); err != nil {
			t.Error(err)
		}
	}
}
