package nvmeauth

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/internal/dhchap"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	"github.com/plinth-storage/plinth/test/framework/controlplane"
	"github.com/plinth-storage/plinth/test/framework/crdtest"
)

// logBuffer collects what the reconciler logs, to check that no secret reaches the log.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) write(prefix, args string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	fmt.Fprintln(&b.buf, prefix, args)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Expected, against a real API server: a Node with a host NQN and a Protocol with DH-HMAC-CHAP
// get a Secret with a host and a controller secret, the Protocol's keyGeneration and a key id.
// Reconciling again with the same generation changes nothing (same resourceVersion). Raising
// keyGeneration in the Protocol replaces the host secret and the key id in the same Secret (same
// UID), annotated with the new generation, and keeps the controller secret (a live
// re-authentication switches one secret at a time); lowering it changes nothing. A Secret made before
// key ids existed gets one, its secrets unchanged. No secret ever appears in the reconciler's
// log or in an event of the namespace.
func TestReconcileRotatesOnKeyGeneration(t *testing.T) {
	cp := crdtest.ControlPlane(t, controlplane.Options{})
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := policyv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cp.Admin.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	const ns, node, nqn = "plinth-system", "worker-1", "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-000000000001"
	for _, o := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, Annotations: map[string]string{policyv1.AnnotationHostNQN: nqn}}},
		&policyv1.Protocol{ObjectMeta: metav1.ObjectMeta{Name: "auth"}, Spec: policyv1.ProtocolSpec{NVMeoFTCP: &policyv1.NVMeoFTCPProtocol{
			BindCIDR: "10.0.0.0/8", Auth: &policyv1.NVMeoFAuth{Mode: policyv1.AuthDHHMACCHAP, Hash: "sha384", Bidirectional: true}}}},
	} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	var logs logBuffer
	lctx := ctrl.LoggerInto(ctx, funcr.New(logs.write, funcr.Options{Verbosity: 4}) /* client-go dumps request bodies from -v=8 on, any client's */)
	r := &Reconciler{Client: c, Namespace: ns}
	reconcile := func() corev1.Secret {
		t.Helper()
		if _, err := r.Reconcile(lctx, ctrl.Request{NamespacedName: client.ObjectKey{Name: node}}); err != nil {
			t.Fatalf("reconcile: %v", err)
		}
		var sec corev1.Secret
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: dhchap.SecretName(node)}, &sec); err != nil {
			t.Fatal(err)
		}
		return sec
	}
	setGeneration := func(gen int64) {
		t.Helper()
		var p policyv1.Protocol
		if err := c.Get(ctx, client.ObjectKey{Name: "auth"}, &p); err != nil {
			t.Fatal(err)
		}
		p.Spec.NVMeoFTCP.Auth.KeyGeneration = gen
		if err := c.Update(ctx, &p); err != nil {
			t.Fatal(err)
		}
	}
	var seen []string // every secret made, to look for in logs and events
	keysOf := func(sec corev1.Secret) (string, string) {
		h, k := string(sec.Data[dhchap.KeyHostSecret]), string(sec.Data[dhchap.KeyCtrlSecret])
		for _, s := range []string{h, k} {
			if b, _, err := dhchap.Decode(s); err != nil || len(b) != 48 {
				t.Fatalf("secret of %d bytes (%v), want a DHHC-1 secret of 48 bytes for sha384", len(b), err)
			}
		}
		seen = append(seen, h, k)
		return h, k
	}

	first := reconcile()
	h0, c0 := keysOf(first)
	id0 := first.Annotations[dhchap.AnnotationKeyID]
	if first.Annotations[dhchap.AnnotationKeyGeneration] != "0" || len(id0) != 16 {
		t.Errorf("new Secret: annotations %v, want keyGeneration 0 and a key id of 16 hex digits", first.Annotations)
	}

	if again := reconcile(); again.ResourceVersion != first.ResourceVersion {
		t.Errorf("same keyGeneration: Secret rewritten (resourceVersion %s, was %s)", again.ResourceVersion, first.ResourceVersion)
	}

	setGeneration(1)
	rotated := reconcile()
	h1, c1 := keysOf(rotated)
	if h1 == h0 || c1 != c0 {
		t.Errorf("keyGeneration 0 → 1: host secret changed %v, controller secret changed %v; want a new host secret and the same controller secret", h1 != h0, c1 != c0)
	}
	if rotated.UID != first.UID {
		t.Errorf("rotation made another Secret (UID %s, was %s), want the same one updated", rotated.UID, first.UID)
	}
	if a := rotated.Annotations; a[dhchap.AnnotationKeyGeneration] != "1" || a[dhchap.AnnotationKeyID] == id0 || len(a[dhchap.AnnotationKeyID]) != 16 ||
		a[dhchap.AnnotationHostNQN] != nqn || a[dhchap.AnnotationHash] != "sha384" {
		t.Errorf("rotated Secret: annotations %v, want keyGeneration 1, a new key id, the same host NQN and hash", a)
	}

	setGeneration(0)
	if lowered := reconcile(); lowered.ResourceVersion != rotated.ResourceVersion {
		t.Errorf("keyGeneration lowered to 0: Secret rewritten, want it kept")
	}

	// a Secret from before key ids: the id is added, the secrets stay
	old := rotated.DeepCopy()
	delete(old.Annotations, dhchap.AnnotationKeyID)
	delete(old.Annotations, dhchap.AnnotationKeyGeneration)
	if err := c.Update(ctx, old); err != nil {
		t.Fatal(err)
	}
	named := reconcile()
	if h, k := keysOf(named); h != h1 || k != c1 || len(named.Annotations[dhchap.AnnotationKeyID]) != 16 {
		t.Errorf("Secret without key id: secrets kept %v, key id %q; want the same secrets and a key id", h == h1 && k == c1, named.Annotations[dhchap.AnnotationKeyID])
	}

	var events corev1.EventList
	if err := c.List(ctx, &events, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	logged := logs.String()
	if !strings.Contains(logged, "keyGeneration raised from 0") {
		t.Errorf("the rotation is not logged with its reason:\n%s", logged)
	}
	for _, s := range seen {
		if strings.Contains(logged, s) {
			t.Errorf("a secret appears in the reconciler's log")
		}
		for _, e := range events.Items {
			if strings.Contains(e.Message, s) {
				t.Errorf("a secret appears in event %s", e.Name)
			}
		}
	}
	if strings.Contains(logged, "DHHC-1") {
		t.Errorf("a DHHC-1 value appears in the reconciler's log:\n%s", logged)
	}
}
