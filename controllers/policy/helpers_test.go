package policy_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/conditions"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
)

var ctx = context.Background()

// node creates a Node (standing in for kubelet, which registers Nodes) with labels.
func node(t *testing.T, c client.Client, name string, labels map[string]string) {
	t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	if err := c.Create(ctx, n); err != nil {
		t.Fatal(err)
	}
}

func pool(name, label string, drift policyv1.DriftPolicy) *policyv1.StoragePool {
	return &policyv1.StoragePool{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: policyv1.StoragePoolSpec{
			NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"plinth.dev/storage": label}},
			Backend:      policyv1.Backend{File: &policyv1.FileBackend{Directory: "/var/lib/plinth/" + name}},
			DriftPolicy:  drift,
		},
	}
}

func localProtocol(name string) *policyv1.Protocol {
	return &policyv1.Protocol{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: policyv1.ProtocolSpec{Local: &policyv1.LocalProtocol{}}}
}

func placement(name, poolName, proto, class string) *policyv1.Placement {
	return &policyv1.Placement{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: policyv1.PlacementSpec{
			PoolRef: policyv1.LocalObjectReference{Name: poolName}, ProtocolRef: policyv1.LocalObjectReference{Name: proto},
			StorageClass: policyv1.StorageClassTemplate{Name: class, VolumeBindingMode: "WaitForFirstConsumer"},
		},
	}
}

func create(t *testing.T, c client.Client, objs ...client.Object) {
	t.Helper()
	for _, o := range objs {
		if err := c.Create(ctx, o); err != nil {
			t.Fatalf("create %T %s: %v", o, o.GetName(), err)
		}
	}
}

// update re-reads obj, applies mutate and writes it, retrying on conflicts.
func update[T client.Object](t *testing.T, c client.Client, obj T, mutate func(T)) {
	t.Helper()
	for i := 0; ; i++ {
		if err := c.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
			t.Fatal(err)
		}
		mutate(obj)
		err := c.Update(ctx, obj)
		if err == nil {
			return
		}
		if !apierrors.IsConflict(err) || i > 10 {
			t.Fatalf("update %s: %v", obj.GetName(), err)
		}
	}
}

// ready waits until obj (a policy object) is Ready=True for its current generation.
func waitCondition(t *testing.T, c client.Client, obj client.Object, condType, status, reason string) {
	t.Helper()
	eventually(t, 30e9, fmt.Sprintf("%T %s %s=%s %s", obj, obj.GetName(), condType, status, reason), func() error {
		if err := c.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
			return err
		}
		g := obj.(conditions.Getter)
		cond := conditions.Get(g, condType)
		if cond == nil {
			return fmt.Errorf("no %s condition", condType)
		}
		if string(cond.Status) != status || (reason != "" && cond.Reason != reason) {
			return fmt.Errorf("%s=%s %s: %s", condType, cond.Status, cond.Reason, cond.Message)
		}
		if cond.ObservedGeneration != obj.GetGeneration() {
			return fmt.Errorf("condition observedGeneration %d, generation %d", cond.ObservedGeneration, obj.GetGeneration())
		}
		return nil
	})
}

func waitReady(t *testing.T, c client.Client, obj client.Object) {
	t.Helper()
	waitCondition(t, c, obj, meta.ReadyCondition, "True", "")
}

func exists(t *testing.T, c client.Client, obj client.Object, name string) {
	t.Helper()
	eventually(t, 30e9, fmt.Sprintf("%T %s exists", obj, name), func() error {
		return c.Get(ctx, types.NamespacedName{Name: name}, obj)
	})
}

func gone(t *testing.T, c client.Client, obj client.Object, name string) {
	t.Helper()
	eventually(t, 30e9, fmt.Sprintf("%T %s gone", obj, name), func() error {
		err := c.Get(ctx, types.NamespacedName{Name: name}, obj)
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		return fmt.Errorf("still there")
	})
}

// pvc creates a PVC of class in namespace default.
func pvc(t *testing.T, c client.Client, name, class string) *corev1.PersistentVolumeClaim {
	t.Helper()
	p := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: corev1.PersistentVolumeClaimSpec{
			StorageClassName: &class,
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	}
	create(t, c, p)
	return p
}

// deletePVC deletes p and removes the pvc-protection finalizer, standing in for
// kube-controller-manager's pvc-protection controller (not started in this suite).
func deletePVC(t *testing.T, c client.Client, p *corev1.PersistentVolumeClaim) {
	t.Helper()
	if err := c.Delete(ctx, p); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	eventually(t, 10e9, "PVC "+p.Name+" gone", func() error {
		var cur corev1.PersistentVolumeClaim
		err := c.Get(ctx, client.ObjectKeyFromObject(p), &cur)
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if len(cur.Finalizers) > 0 {
			cur.Finalizers = nil
			if err := c.Update(ctx, &cur); err != nil {
				return err
			}
		}
		return fmt.Errorf("still there")
	})
}

func storageClass(t *testing.T, c client.Client, name string) *storagev1.StorageClass {
	t.Helper()
	var sc storagev1.StorageClass
	if err := c.Get(ctx, types.NamespacedName{Name: name}, &sc); err != nil {
		t.Fatal(err)
	}
	return &sc
}

// waitInventory waits until the inventory ConfigMap's text satisfies check. The inventory is
// saved after the apply and prune steps of the same reconcile, so an object seen created or
// deleted is not yet proof that the inventory says so.
func waitInventory(t *testing.T, c client.Client, what string, check func(inv string) error) {
	t.Helper()
	eventually(t, 30e9, "inventory: "+what, func() error {
		var cm corev1.ConfigMap
		if err := c.Get(ctx, types.NamespacedName{Namespace: namespace, Name: "plinth-inventory"}, &cm); err != nil {
			return err
		}
		if err := check(cm.Data["inventory"]); err != nil {
			return fmt.Errorf("%w\n%s", err, cm.Data["inventory"])
		}
		return nil
	})
}

// lacks reports an error naming the first of subs that s contains.
func lacks(s string, subs ...string) error {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return fmt.Errorf("still lists %q", sub)
		}
	}
	return nil
}

func contains(s string, subs ...string) error {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return fmt.Errorf("%q lacks %q", s, sub)
		}
	}
	return nil
}

func deleteAll(t *testing.T, c client.Client, objs ...client.Object) {
	t.Helper()
	for _, o := range objs {
		if err := c.Delete(ctx, o); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete %T %s: %v", o, o.GetName(), err)
		}
	}
}
