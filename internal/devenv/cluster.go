package devenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
)

// readObjects decodes every YAML document of the given files (skipping empty ones).
func readObjects(files ...string) ([]*unstructured.Unstructured, error) {
	var out []*unstructured.Unstructured
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		objs, err := decodeObjects(data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		out = append(out, objs...)
	}
	return out, nil
}

func decodeObjects(data []byte) ([]*unstructured.Unstructured, error) {
	var out []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, err
		}
		if len(m) == 0 {
			continue
		}
		out = append(out, &unstructured.Unstructured{Object: m})
	}
}

// apply server-side applies obj under FieldManager, forcing ownership.
func (e *Env) apply(ctx context.Context, obj *unstructured.Unstructured) error {
	obj = obj.DeepCopy()
	obj.SetManagedFields(nil)
	obj.SetResourceVersion("")
	//nolint:staticcheck // client.Apply with unstructured objects is what this needs.
	return e.Client.Patch(ctx, obj, client.Apply, client.FieldOwner(FieldManager), client.ForceOwnership)
}

func (e *Env) ensureNamespace(ctx context.Context, name string) error {
	err := e.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// installCRDs applies schema/crd/bases and kustomize/csi/csidriver.yaml and
// waits until the API server serves every CRD.
func (e *Env) installCRDs(ctx context.Context) (string, error) {
	files, err := filepath.Glob(filepath.Join(e.Root, "schema", "crd", "bases", "*.yaml"))
	if err != nil || len(files) == 0 {
		return "", fmt.Errorf("no CRDs under %s/schema/crd/bases (%v)", e.Root, err)
	}
	n, err := e.applyCRDFiles(ctx, files)
	if err != nil {
		return "", err
	}
	driver, err := readObjects(filepath.Join(e.Root, "kustomize", "csi", "csidriver.yaml"))
	if err != nil {
		return "", err
	}
	for _, o := range driver {
		if err := e.apply(ctx, o); err != nil {
			return "", err
		}
	}
	return fmt.Sprintf("%d CRDs Established; CSIDriver %s (attachRequired, storageCapacity)", n, policyv1.DriverName), nil
}

func (e *Env) applyCRDFiles(ctx context.Context, files []string) (int, error) {
	crds, err := readObjects(files...)
	if err != nil {
		return 0, err
	}
	for _, c := range crds {
		if err := e.apply(ctx, c); err != nil {
			return 0, fmt.Errorf("CRD %s: %w", c.GetName(), err)
		}
	}
	for _, c := range crds {
		if err := poll(ctx, time.Minute, func() error {
			got := &unstructured.Unstructured{}
			got.SetGroupVersionKind(c.GroupVersionKind())
			if err := e.Client.Get(ctx, client.ObjectKey{Name: c.GetName()}, got); err != nil {
				return err
			}
			conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
			for _, ci := range conds {
				m, _ := ci.(map[string]any)
				if m["type"] == "Established" && m["status"] == "True" {
					return nil
				}
			}
			return fmt.Errorf("CRD %s not Established", c.GetName())
		}); err != nil {
			return 0, err
		}
	}
	return len(crds), nil
}

// registerNodes creates the Nodes, their status and CSINodes as kubelet would
// (this whole function stands in for kubelet's registration and the CSI node
// registrar): the storage node labelled for the quickstart pool, the others
// as objects only.
func (e *Env) registerNodes(ctx context.Context) (string, error) {
	var lines []string
	for _, name := range append([]string{StorageNode}, ObjectOnlyNodes...) {
		labels := map[string]string{
			"kubernetes.io/hostname":      name,
			"kubernetes.io/os":            "linux",
			policyv1.TopologyKeyNode:      name, // kubelet adds the driver's topology key from NodeGetInfo
			"topology.kubernetes.io/zone": "zone-1",
		}
		if name == StorageNode {
			labels["plinth.dev/storage"] = "dev" // the quickstart pool's nodeSelector
		} else {
			labels[LabelObjectOnly] = "true"
		}
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels,
			// The attach-detach controller only attaches for nodes kubelet marks so.
			Annotations: map[string]string{"volumes.kubernetes.io/controller-managed-attach-detach": "true"}}}
		if err := e.Client.Create(ctx, node); err != nil && !apierrors.IsAlreadyExists(err) {
			return "", err
		}
		node.Status = corev1.NodeStatus{
			Capacity:    corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("8Gi"), corev1.ResourcePods: resource.MustParse("110")},
			Allocatable: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("8Gi"), corev1.ResourcePods: resource.MustParse("110")},
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletStandIn",
				Message: "plinth dev stands in for kubelet", LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}},
		}
		if err := e.Client.Status().Update(ctx, node); err != nil {
			return "", fmt.Errorf("node %s status: %w", name, err)
		}
		csiNode := &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{{Name: policyv1.DriverName, NodeID: name, TopologyKeys: []string{policyv1.TopologyKeyNode}}}}}
		if err := e.Client.Create(ctx, csiNode); err != nil && !apierrors.IsAlreadyExists(err) {
			return "", err
		}
		role := "storage (file backend on this host)"
		if name != StorageNode {
			role = "object only (" + LabelObjectOnly + "=true)"
		}
		lines = append(lines, fmt.Sprintf("Node %s: %s; CSINode lists %s", name, role, policyv1.DriverName))
	}
	return strings.Join(lines, "\n"), nil
}

// poll calls f every 100 ms until it returns nil, ctx ends or timeout passes
// (then the last error is returned).
func poll(ctx context.Context, timeout time.Duration, f func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not after %s: %w", timeout, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
