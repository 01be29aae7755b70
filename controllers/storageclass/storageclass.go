// Package storageclass classifies changes to a StorageClass and builds its replacement:
// parameters, provisioner, reclaimPolicy and volumeBindingMode are immutable once created
// (kubernetes pkg/apis/storage/validation ValidateStorageClassUpdate), so a change to them
// needs a replacement (delete, then create), while allowVolumeExpansion, mountOptions, labels
// and annotations are patched in place.
package storageclass

import (
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/equality"
)

// DefaultClassAnnotation marks the cluster's default StorageClass.
const DefaultClassAnnotation = "storageclass.kubernetes.io/is-default-class"

// Change is one differing field between a live and a desired StorageClass.
type Change struct {
	// Field is the JSON path, such as "parameters.csi.storage.k8s.io/fstype" or "allowVolumeExpansion".
	Field string
	// Live and Desired are the values, formatted for messages ("<unset>" when absent).
	Live, Desired string
	// Immutable is true when the API server forbids updating the field.
	Immutable bool
}

// String is "field: live → desired".
func (c Change) String() string { return fmt.Sprintf("%s: %s → %s", c.Field, c.Live, c.Desired) }

// Diff lists the changes from live to desired in the fields render sets, sorted by field;
// immutable changes and in-place changes are both listed. Server defaults on live
// (reclaimPolicy Delete, volumeBindingMode Immediate) count as values only when desired sets
// the field, which render always does.
func Diff(live, desired *storagev1.StorageClass) []Change {
	var out []Change
	add := func(field, l, d string, immutable bool) {
		if l != d {
			out = append(out, Change{Field: field, Live: l, Desired: d, Immutable: immutable})
		}
	}
	add("provisioner", live.Provisioner, desired.Provisioner, true)
	keys := map[string]bool{}
	for k := range live.Parameters {
		keys[k] = true
	}
	for k := range desired.Parameters {
		keys[k] = true
	}
	for k := range keys {
		add("parameters."+k, value(live.Parameters, k), value(desired.Parameters, k), true)
	}
	if desired.ReclaimPolicy != nil {
		add("reclaimPolicy", reclaim(live.ReclaimPolicy), string(*desired.ReclaimPolicy), true)
	}
	if desired.VolumeBindingMode != nil {
		add("volumeBindingMode", binding(live.VolumeBindingMode), string(*desired.VolumeBindingMode), true)
	}
	if desired.AllowVolumeExpansion != nil {
		add("allowVolumeExpansion", boolean(live.AllowVolumeExpansion), boolean(desired.AllowVolumeExpansion), false)
	}
	if !equality.Semantic.DeepEqual(nonEmpty(live.MountOptions), nonEmpty(desired.MountOptions)) {
		add("mountOptions", list(live.MountOptions), list(desired.MountOptions), false)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Field < out[j].Field })
	return out
}

// Immutable returns the changes that need a replacement.
func Immutable(changes []Change) []Change {
	var out []Change
	for _, c := range changes {
		if c.Immutable {
			out = append(out, c)
		}
	}
	return out
}

// Describe joins changes as "a: x → y; b: …".
func Describe(changes []Change) string {
	s := make([]string, len(changes))
	for i, c := range changes {
		s[i] = c.String()
	}
	return strings.Join(s, "; ")
}

// KeepImmutable returns a copy of desired with the immutable fields taken from live: the
// object to apply when a replacement is not allowed, so the in-place changes
// (allowVolumeExpansion, mountOptions, labels, annotations) still land.
func KeepImmutable(desired, live *storagev1.StorageClass) *storagev1.StorageClass {
	out := desired.DeepCopy()
	out.Provisioner = live.Provisioner
	out.Parameters = nil
	if len(live.Parameters) > 0 {
		out.Parameters = make(map[string]string, len(live.Parameters))
		for k, v := range live.Parameters {
			out.Parameters[k] = v
		}
	}
	if live.ReclaimPolicy != nil {
		r := *live.ReclaimPolicy
		out.ReclaimPolicy = &r
	}
	if live.VolumeBindingMode != nil {
		b := *live.VolumeBindingMode
		out.VolumeBindingMode = &b
	}
	return out
}

// Replacement returns the object to create in place of live: desired, keeping live's
// default-class annotation when desired does not set one (the cluster must not lose its
// default class through a replacement).
func Replacement(desired, live *storagev1.StorageClass) *storagev1.StorageClass {
	out := desired.DeepCopy()
	if v, ok := live.Annotations[DefaultClassAnnotation]; ok {
		if _, set := out.Annotations[DefaultClassAnnotation]; !set {
			if out.Annotations == nil {
				out.Annotations = map[string]string{}
			}
			out.Annotations[DefaultClassAnnotation] = v
		}
	}
	return out
}

func value(m map[string]string, k string) string {
	if v, ok := m[k]; ok {
		return fmt.Sprintf("%q", v)
	}
	return "<unset>"
}

func reclaim(p *corev1.PersistentVolumeReclaimPolicy) string {
	if p == nil {
		return string(corev1.PersistentVolumeReclaimDelete) // the API server's default
	}
	return string(*p)
}

func binding(m *storagev1.VolumeBindingMode) string {
	if m == nil {
		return string(storagev1.VolumeBindingImmediate) // the API server's default
	}
	return string(*m)
}

func boolean(b *bool) string {
	if b == nil || !*b {
		return "false"
	}
	return "true"
}

func nonEmpty(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return s
}

func list(s []string) string {
	if len(s) == 0 {
		return "[]"
	}
	return "[" + strings.Join(s, ",") + "]"
}
