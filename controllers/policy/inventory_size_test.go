package policy_test

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/controllers/inventory"
	"github.com/plinth-storage/plinth/internal/clientlimit"
)

// TestInventoryLargerThanAConfigMap stores the inventory of a 5,000-node fleet (10,001
// objects, 1.2 MiB as text: more than the API server takes in one ConfigMap) on the real API
// server, reads it back whole, then stores a small one over it: the compressed key goes and
// the plain one comes back, so no reader ever sees both.
func TestInventoryLargerThanAConfigMap(t *testing.T) {
	c := env(t)
	st := &inventory.Store{Client: c, Namespace: namespace, Name: "inventory-size", FieldOwner: "plinth-test"}
	digest := func(s string) string { sum := sha256.Sum256([]byte(s)); return hex.EncodeToString(sum[:]) }
	large := inventory.New()
	for i := 0; i < 10001; i++ {
		kind := []string{"Agent", "Store"}[i%2]
		large.Put(inventory.Entry{Group: "storage.plinth.dev", Version: "v1alpha1", Kind: kind, Name: fmt.Sprintf("gold.node-%05d", i/2), Digest: digest(fmt.Sprint(i))})
	}
	if _, err := st.Save(ctx, nil, large); err != nil {
		t.Fatalf("save 10,001 entries: %v", err)
	}
	got, err := st.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got.Len() != 10001 || !got.Equal(large) {
		t.Fatalf("read back %d entries (equal: %v), want the 10,001 saved", got.Len(), got.Equal(large))
	}
	keys := func() (data, binary int) {
		var cm corev1.ConfigMap
		if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: st.Name}, &cm); err != nil {
			t.Fatal(err)
		}
		return len(cm.Data), len(cm.BinaryData)
	}
	if d, b := keys(); d != 0 || b != 1 {
		t.Errorf("large inventory: %d data and %d binaryData keys, want 0 and 1", d, b)
	}
	small := inventory.New(inventory.Entry{Group: "storage.k8s.io", Version: "v1", Kind: "StorageClass", Name: "fast", Digest: digest("sc")})
	if _, err := st.Save(ctx, got, small); err != nil {
		t.Fatal(err)
	}
	if d, b := keys(); d != 1 || b != 0 {
		t.Errorf("small inventory over a large one: %d data and %d binaryData keys, want 1 and 0", d, b)
	}
	if got, err := st.Load(ctx); err != nil || !got.Equal(small) {
		t.Errorf("read back %v entries (err %v), want the one saved", got, err)
	}
}

// TestClientLimitFollowsAPF: the suite's kube-apiserver runs API Priority and Fairness (its
// default), so a Plinth process given no limit flag runs without a client-side limiter, and a
// client so configured works.
func TestClientLimitFollowsAPF(t *testing.T) {
	env(t)
	cfg := rest.CopyConfig(suite.cp.Admin.Config)
	mode, err := clientlimit.Apply(ctx, cfg, clientlimit.Limits{QPS: 50, Burst: 300}, nil)
	if err != nil || mode != clientlimit.ModeServerSide || cfg.QPS != -1 || cfg.Burst != -1 {
		t.Fatalf("mode %q, QPS %g, burst %d, error %v; want %q, -1, -1", mode, cfg.QPS, cfg.Burst, err, clientlimit.ModeServerSide)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if cs.CoreV1().RESTClient().GetRateLimiter() != nil {
		t.Error("the client has a rate limiter")
	}
	if _, err := cs.CoreV1().Namespaces().Get(ctx, namespace, metav1.GetOptions{}); err != nil {
		t.Fatalf("a request without a client-side limiter: %v", err)
	}
}
