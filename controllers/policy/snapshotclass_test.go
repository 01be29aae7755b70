package policy_test

import (
	"fmt"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

func snapshotClassObj() *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion(policyv1.SnapshotClassAPIVersion)
	u.SetKind(policyv1.SnapshotClassKind)
	return u
}

// TestSnapshotClassAppliedAndPruned: a Placement with spec.snapshotClass gets its
// VolumeSnapshotClass (external-snapshotter's CRD installed from testdata/crds) applied,
// listed in its status and in the inventory, changed in place when the policy changes, and
// pruned when the policy drops it, like the StorageClass.
func TestSnapshotClassAppliedAndPruned(t *testing.T) {
	c := env(t)
	node(t, c, "s1", map[string]string{"plinth.dev/storage": "s"})
	p, proto := pool("spool", "s", ""), localProtocol("slocal")
	pl := placement("ssnap", "spool", "slocal", "s-class")
	pl.Spec.SnapshotClass = &policyv1.SnapshotClassTemplate{Name: "s-snapshots", Velero: true}
	create(t, c, p, proto, pl)
	startController(t)
	waitReady(t, c, pl)

	vsc := snapshotClassObj()
	exists(t, c, vsc, "s-snapshots")
	if vsc.Object["driver"] != policyv1.DriverName || vsc.Object["deletionPolicy"] != "Delete" ||
		vsc.GetLabels()[policyv1.LabelVeleroSnapshotClass] != "true" || vsc.GetLabels()[policyv1.LabelPlacement] != "ssnap" {
		t.Errorf("VolumeSnapshotClass = %v", vsc.Object)
	}
	var cur policyv1.Placement
	if err := c.Get(ctx, types.NamespacedName{Name: "ssnap"}, &cur); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, r := range cur.Status.Produced {
		found = found || (r.Kind == policyv1.SnapshotClassKind && r.Name == "s-snapshots" && r.APIVersion == policyv1.SnapshotClassAPIVersion)
	}
	if !found {
		t.Errorf("status.produced lacks the VolumeSnapshotClass: %+v", cur.Status.Produced)
	}
	waitInventory(t, c, "lists the VolumeSnapshotClass", func(inv string) error { return contains(inv, " VolumeSnapshotClass s-snapshots ") })

	update(t, c, &cur, func(pl *policyv1.Placement) { pl.Spec.SnapshotClass.DeletionPolicy = "Retain" })
	eventually(t, 30e9, "deletionPolicy Retain applied", func() error {
		u := snapshotClassObj()
		if err := c.Get(ctx, types.NamespacedName{Name: "s-snapshots"}, u); err != nil {
			return err
		}
		if u.Object["deletionPolicy"] != "Retain" {
			return fmt.Errorf("deletionPolicy %v", u.Object["deletionPolicy"])
		}
		return nil
	})

	update(t, c, &cur, func(pl *policyv1.Placement) { pl.Spec.SnapshotClass = nil })
	gone(t, c, snapshotClassObj(), "s-snapshots")
	waitInventory(t, c, "drops the pruned VolumeSnapshotClass", func(inv string) error { return lacks(inv, "s-snapshots") })
	deleteAll(t, c, &cur, p, proto)
	gone(t, c, &storev1.Store{}, "spool.s1")
}
