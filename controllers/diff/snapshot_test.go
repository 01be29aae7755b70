package diff

import (
	"context"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/plinth-storage/plinth/controllers/plan"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	"github.com/plinth-storage/plinth/test/framework/controlplane"
)

func snapshotClass(name string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion(policyv1.SnapshotClassAPIVersion)
	u.SetKind(policyv1.SnapshotClassKind)
	u.SetName(name)
	u.SetLabels(map[string]string{policyv1.LabelPlacement: "fast"})
	return u
}

// A VolumeSnapshotClass that is pruned or changes is listed with the VolumeSnapshots that name
// it (live) and what happens to them; offline says their number is not known.
func TestSnapshotClassImpact(t *testing.T) {
	snaps := []Snapshot{{Namespace: "db", Name: "nightly", Source: "data-db-0", ReadyToUse: true}, {Namespace: "db", Name: "pre-upgrade", Source: "data-db-0"}}
	b := &builder{rep: &Report{}, cl: &cluster{snapshots: map[string][]Snapshot{"fast-snap": snaps}}}
	b.stale(&plan.Prune{Live: snapshotClass("fast-snap"), Verdict: plan.PruneDelete, Usage: plan.Usage{Known: true}})
	b.object(&plan.Object{Object: snapshotClass("other-snap"), Action: plan.Change, Fields: []string{"deletionPolicy"}})
	got := b.rep.Storage.SnapshotClasses
	if len(got) != 2 {
		t.Fatalf("snapshot classes %+v, want the pruned and the changed one", got)
	}
	if got[0].Name != "fast-snap" || got[0].Action != ActionPrune || got[0].Placement != "fast" || !reflect.DeepEqual(got[0].Snapshots, snaps) ||
		!strings.HasPrefix(got[0].Outcome, "2 VolumeSnapshots name it: they stay restorable") {
		t.Errorf("pruned class %+v", got[0])
	}
	if got[1].Name != "other-snap" || got[1].Action != ActionChange || len(got[1].Snapshots) != 0 || !reflect.DeepEqual(got[1].Fields, []string{"deletionPolicy"}) ||
		!strings.HasPrefix(got[1].Outcome, "0 VolumeSnapshots name it: they keep the settings") {
		t.Errorf("changed class %+v", got[1])
	}
	if n := len(b.rep.Objects); n != 2 {
		t.Errorf("%d objects listed, want 2: %+v", n, b.rep.Objects)
	}
	out := text(b.rep)
	for _, line := range []string{
		"  VolumeSnapshotClass fast-snap leaves the policy: 2 VolumeSnapshots name it",
		"    VolumeSnapshot db/nightly of data-db-0 (ready)",
		"    VolumeSnapshot db/pre-upgrade of data-db-0 (not ready)",
		"  VolumeSnapshotClass other-snap changes (deletionPolicy): 0 VolumeSnapshots name it",
	} {
		if !strings.Contains(out, line) {
			t.Errorf("text report lacks %q:\n%s", line, out)
		}
	}
	if md := markdown(b.rep); !strings.Contains(md, "- VolumeSnapshotClass fast-snap leaves the policy") || !strings.Contains(md, "  - VolumeSnapshot db/nightly of data-db-0 (ready)") {
		t.Errorf("markdown report lacks the snapshot class:\n%s", md)
	}

	off := &builder{rep: &Report{}}
	off.stale(&plan.Prune{Live: snapshotClass("fast-snap"), Verdict: plan.PruneDelete})
	if sc := off.rep.Storage.SnapshotClasses; len(sc) != 1 || !strings.HasPrefix(sc[0].Outcome, "its VolumeSnapshots are not known offline") {
		t.Errorf("offline: %+v", sc)
	}
}

// readSnapshots on the real API server: none without the snapshot.storage.k8s.io CRDs (not an
// error), then the VolumeSnapshots by class with their source and readiness.
func TestReadSnapshots(t *testing.T) {
	cp := controlplane.ForTest(t, controlplane.Options{})
	ctx := context.Background()
	c, err := client.New(cp.Admin.Config, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := readSnapshots(ctx, c); err != nil || got != nil {
		t.Fatalf("without the snapshot CRDs: %v, %v; want none and no error", got, err)
	}
	bin, err := controlplane.TestBinDir()
	if err != nil {
		t.Fatal(err)
	}
	// The VolumeSnapshot kinds only (the folder also holds groupsnapshot.storage.k8s.io's).
	crds, _ := filepath.Glob(filepath.Join(bin, "crds", "snapshot", "snapshot.storage.k8s.io_*.yaml"))
	if len(crds) != 3 {
		t.Fatalf("snapshot.storage.k8s.io CRDs in %s: %v, want 3 (make testbin)", filepath.Join(bin, "crds", "snapshot"), crds)
	}
	if _, err := envtest.InstallCRDs(cp.Admin.Config, envtest.CRDInstallOptions{Paths: crds, ErrorIfPathMissing: true}); err != nil {
		t.Fatal(err)
	}
	// a new client: the first one's REST mapper has no snapshot kinds
	c, err = client.New(cp.Admin.Config, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	snap := func(name, class, pvc string) {
		u := &unstructured.Unstructured{}
		u.SetAPIVersion("snapshot.storage.k8s.io/v1")
		u.SetKind("VolumeSnapshot")
		u.SetNamespace(metav1.NamespaceDefault)
		u.SetName(name)
		spec := map[string]any{"source": map[string]any{"persistentVolumeClaimName": pvc}}
		if class != "" {
			spec["volumeSnapshotClassName"] = class
		}
		u.Object["spec"] = spec
		if err := c.Create(ctx, u); err != nil {
			t.Fatal(err)
		}
	}
	snap("b", "fast-snap", "data-1")
	snap("a", "fast-snap", "data-0")
	snap("c", "slow-snap", "data-2")
	snap("d", "", "data-3") // no class yet: snapshot-controller would set the default
	got, err := readSnapshots(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]Snapshot{
		"fast-snap": {{Namespace: "default", Name: "a", Source: "data-0"}, {Namespace: "default", Name: "b", Source: "data-1"}},
		"slow-snap": {{Namespace: "default", Name: "c", Source: "data-2"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("snapshots by class %+v, want %+v", got, want)
	}
}
