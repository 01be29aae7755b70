package v1alpha1

// Names of the VolumeSnapshotClass a Placement renders (spec.snapshotClass). The kind belongs to
// the external-snapshotter project (kubernetes-csi/external-snapshotter, CRDs installed with
// its snapshot-controller), so Plinth renders it as an unstructured object of this group.
const (
	// SnapshotClassAPIVersion is the apiVersion of VolumeSnapshotClass.
	SnapshotClassAPIVersion = "snapshot.storage.k8s.io/v1"
	// SnapshotClassKind is its kind.
	SnapshotClassKind = "VolumeSnapshotClass"
	// AnnotationDefaultSnapshotClass marks the default VolumeSnapshotClass of a driver
	// (external-snapshotter's snapshot-controller reads it).
	AnnotationDefaultSnapshotClass = "snapshot.storage.kubernetes.io/is-default-class"
	// LabelVeleroSnapshotClass (value "true") is the label Velero's CSI support looks for to
	// choose a driver's VolumeSnapshotClass.
	LabelVeleroSnapshotClass = "velero.io/csi-volumesnapshot-class"
	// GroupSnapshotClassAPIVersion and GroupSnapshotClassKind name the VolumeGroupSnapshotClass
	// a Placement renders with spec.snapshotClass.group (external-snapshotter's, GA).
	GroupSnapshotClassAPIVersion = "groupsnapshot.storage.k8s.io/v1"
	GroupSnapshotClassKind       = "VolumeGroupSnapshotClass"
	// AnnotationDefaultGroupSnapshotClass marks the default VolumeGroupSnapshotClass of a
	// driver (external-snapshotter's snapshot-controller reads it).
	AnnotationDefaultGroupSnapshotClass = "groupsnapshot.storage.kubernetes.io/is-default-class"
)
