package render

import (
	"bytes"
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"
)

// Objects returns every rendered object in apply order: StorageClasses, VolumeSnapshotClasses,
// VolumeGroupSnapshotClasses, VolumeAttributesClasses, Agents, Stores, each sorted by name.
func (o *Output) Objects() []runtime.Object {
	objs := make([]runtime.Object, 0, len(o.StorageClasses)+len(o.VolumeSnapshotClasses)+len(o.VolumeGroupSnapshotClasses)+len(o.VolumeAttributesClasses)+len(o.Agents)+len(o.Stores))
	for i := range o.StorageClasses {
		objs = append(objs, &o.StorageClasses[i])
	}
	for i := range o.VolumeSnapshotClasses {
		objs = append(objs, &o.VolumeSnapshotClasses[i])
	}
	for i := range o.VolumeGroupSnapshotClasses {
		objs = append(objs, &o.VolumeGroupSnapshotClasses[i])
	}
	for i := range o.VolumeAttributesClasses {
		objs = append(objs, &o.VolumeAttributesClasses[i])
	}
	for i := range o.Agents {
		objs = append(objs, &o.Agents[i])
	}
	for i := range o.Stores {
		objs = append(objs, &o.Stores[i])
	}
	return objs
}

// Unstructured converts every rendered object to unstructured form without the fields render
// never sets (status, metadata.creationTimestamp), in the order of Objects.
func (o *Output) Unstructured() ([]*unstructured.Unstructured, error) {
	objs := o.Objects()
	out := make([]*unstructured.Unstructured, 0, len(objs))
	for _, obj := range objs {
		u, err := ToUnstructured(obj)
		if err != nil {
			return nil, err
		}
		out = append(out, u)
	}
	return out, nil
}

// ToUnstructured converts one typed object to unstructured form without the fields render
// never sets (status, metadata.creationTimestamp), as server-side apply should receive it.
func ToUnstructured(obj runtime.Object) (*unstructured.Unstructured, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, fmt.Errorf("convert %T: %w", obj, err)
	}
	u := &unstructured.Unstructured{Object: m}
	unstructured.RemoveNestedField(u.Object, "status")
	unstructured.RemoveNestedField(u.Object, "metadata", "creationTimestamp")
	return u, nil
}

// YAML writes every rendered object as one YAML stream ("---" between documents); the bytes
// depend only on the input.
func (o *Output) YAML() ([]byte, error) {
	us, err := o.Unstructured()
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	for i, u := range us {
		if i > 0 {
			buf.WriteString("---\n")
		}
		b, err := yaml.Marshal(u.Object)
		if err != nil {
			return nil, err
		}
		buf.Write(b)
	}
	return buf.Bytes(), nil
}
