package manifests

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nvmeauthctrl "github.com/plinth-storage/plinth/controllers/nvmeauth"
	"github.com/plinth-storage/plinth/internal/dhchap"
	"github.com/plinth-storage/plinth/internal/hostkeys"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// audienceToken returns a token of sa with audience aud bound to pod (running on its node), as
// kubelet mounts the projected token of the agent and node plugin Pods for the key server.
func audienceToken(t *testing.T, ctx context.Context, c *cluster, sa, pod, aud string) string {
	t.Helper()
	p, err := c.kube.CoreV1().Pods(namespace).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := c.kube.CoreV1().ServiceAccounts(p.Namespace).CreateToken(ctx, sa, &authnv1.TokenRequest{
		Spec: authnv1.TokenRequestSpec{Audiences: []string{aud}, BoundObjectRef: &authnv1.BoundObjectReference{
			Kind: "Pod", APIVersion: "v1", Name: p.Name, UID: p.UID}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token of %s for %s bound to pod %s: %v", sa, aud, pod, err)
	}
	return tok.Status.Token
}

// The key distribution of docs/design.md#key-distribution and the threat model's "cannot"s,
// with the shipped RBAC applied and every component authenticated as it runs: tokens bound to
// Pods on its node. Worker A's agent and node plugin cannot get, list or watch any Secret of
// plinth-system (A's and B's master Secrets, a Helm release Secret, the key server's TLS
// Secret), get another namespace's Helm release Secret or list the Secrets of every namespace. The key server, run with the controller's own pod-bound credentials (which make its
// certificate and review the tokens), gives A's node plugin A's keys for any storage node and
// refuses B's; gives storage node S's agent the keys of A, whose publication one of S's
// VolumeStates names, equal to what A's plugin gets for S, and refuses B (not published), a
// target other than S, and A's agent anything; refuses a token for the API server's audience, a
// token bound to no pod, a workload's token on A and no token. A storage node that forges a
// publication to B on its own VolumeState gets B's key for itself only: it differs from B's key
// for any other storage node.
func testKeyDistribution(t *testing.T, c *cluster) {
	ctx := t.Context()
	newClient := applyRBAC(t, c)
	admin := newClient(c.cfg)

	const (
		nodeA, nodeB      = "keys-worker-a", "keys-worker-b"
		nodeC             = "keys-worker-c"
		storageS, storeT  = "keys-storage-s", "keys-storage-t"
		controllerNode    = "keys-control"
		nqnA, nqnB        = "nqn.2014-08.org.nvmexpress:uuid:keys-a", "nqn.2014-08.org.nvmexpress:uuid:keys-b"
		helmReleaseSecret = "sh.helm.release.v1.plinth.v1"
	)
	for _, n := range []string{nodeA, nodeB, nodeC, storageS, storeT, controllerNode} {
		if err := admin.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}); err != nil {
			t.Fatal(err)
		}
	}
	// The master Secrets as controllers/nvmeauth makes them, and a Secret of someone else.
	masters := map[string]string{}
	for n, nqn := range map[string]string{nodeA: nqnA, nodeB: nqnB} {
		host, err := dhchap.Generate("sha256")
		if err != nil {
			t.Fatal(err)
		}
		ctrlKey, _ := dhchap.Generate("sha256")
		masters[n] = host
		if err := admin.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: dhchap.SecretName(n),
				Labels:      map[string]string{dhchap.LabelComponent: dhchap.ComponentValue},
				Annotations: map[string]string{dhchap.AnnotationHostNQN: nqn, dhchap.AnnotationKeyID: "id-" + n, dhchap.AnnotationKeyGeneration: "3"}},
			Type: nvmeauthctrl.SecretType,
			Data: map[string][]byte{dhchap.KeyHostSecret: []byte(host), dhchap.KeyCtrlSecret: []byte(ctrlKey)},
		}); err != nil {
			t.Fatal(err)
		}
	}
	if err := admin.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: helmReleaseSecret},
		Type: "helm.sh/release.v1", Data: map[string][]byte{"release": []byte("H4sI")}}); err != nil {
		t.Fatal(err)
	}
	// A Helm release installed in another namespace keeps its release Secret there.
	if err := admin.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceDefault, Name: helmReleaseSecret},
		Type: "helm.sh/release.v1", Data: map[string][]byte{"release": []byte("H4sI")}}); err != nil {
		t.Fatal(err)
	}
	// Storage node S exports a volume published to A.
	backend := policyv1.Backend{File: &policyv1.FileBackend{Directory: "/var/lib/plinth/volumes"}}
	volS := storev1.VolumeID("keys-vol-s")
	if err := admin.Create(ctx, &storev1.VolumeState{
		ObjectMeta: metav1.ObjectMeta{Name: volS, Labels: map[string]string{policyv1.LabelNode: storev1.NameLabelValue(storageS)}},
		Spec: storev1.VolumeStateSpec{CSIName: "keys-vol-s", StoreName: storev1.StoreName("pool", storageS), CapacityBytes: 1 << 20, VolumeMode: "Filesystem",
			Policy: storev1.FrozenPolicy{Placement: "remote", Pool: "pool", Protocol: "nvme", Backend: backend,
				ProtocolSpec: policyv1.ProtocolSpec{NVMeoFTCP: &policyv1.NVMeoFTCPProtocol{Port: 4420, BindCIDR: "10.0.0.0/8"}}},
			Publications: []storev1.Publication{{NodeName: nodeA, HostNQN: nqnA, AccessMode: "SINGLE_NODE_WRITER"}}},
	}); err != nil {
		t.Fatal(err)
	}

	// The key server, run as the controller runs it: its pod's token, its RBAC.
	ctrlClient := newClient(boundToken(t, ctx, c, "plinth-controller", "keys-controller", controllerNode))
	listening := make(chan string, 1)
	srvCtx, stop := context.WithCancel(ctx)
	stopped := make(chan error, 1)
	go func() {
		stopped <- (&nvmeauthctrl.KeyServerRunnable{Addr: "127.0.0.1:0", Reader: ctrlClient, Client: ctrlClient, Namespace: namespace,
			Hosts: []string{"127.0.0.1"}, Listening: listening,
			Server: &nvmeauthctrl.KeyServer{Keys: hostkeys.Secrets{Reader: ctrlClient, Namespace: namespace}, Reader: ctrlClient,
				Reviewer: ctrlClient, Namespace: namespace, Audience: hostkeys.Audience}}).Start(srvCtx)
	}()
	t.Cleanup(func() {
		stop()
		if err := <-stopped; err != nil {
			t.Errorf("key server: %v", err)
		}
	})
	var addr string
	select {
	case addr = <-listening:
	case err := <-stopped:
		t.Fatalf("key server did not start: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("key server not listening after a minute")
	}
	var ca corev1.ConfigMap
	if err := admin.Get(ctx, client.ObjectKey{Namespace: namespace, Name: nvmeauthctrl.CAConfigMapName}, &ca); err != nil {
		t.Fatalf("the key server's CA ConfigMap: %v", err)
	}
	// Worker A's components, with their pods' tokens: no Secret at all (the key server's TLS
	// Secret is there by now).
	agentA := boundToken(t, ctx, c, "plinth-agent", "keys-agent-a", nodeA)
	pluginA := boundToken(t, ctx, c, "plinth-csi-node", "keys-plugin-a", nodeA)
	var all corev1.SecretList
	if err := admin.List(ctx, &all, client.InNamespace(namespace)); err != nil {
		t.Fatal(err)
	}
	names := make([]string, 0, len(all.Items))
	for _, s := range all.Items {
		names = append(names, s.Name)
	}
	for _, want := range []string{dhchap.SecretName(nodeA), dhchap.SecretName(nodeB), helmReleaseSecret, nvmeauthctrl.ServingSecretName} {
		if !slices.Contains(names, want) {
			t.Fatalf("Secrets of %s: %v, want %s among them", namespace, names, want)
		}
	}
	refusedReads := 0
	for who, cfg := range map[string]*rest.Config{"agent of " + nodeA: agentA, "node plugin of " + nodeA: pluginA} {
		cl := newClient(cfg)
		for _, name := range names {
			var s corev1.Secret
			if err := cl.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &s); !apierrors.IsForbidden(err) {
				t.Errorf("%s reads Secret %s/%s: %v, want Forbidden", who, namespace, name, err)
			} else {
				refusedReads++
			}
		}
		var l corev1.SecretList
		if err := cl.List(ctx, &l, client.InNamespace(namespace)); !apierrors.IsForbidden(err) {
			t.Errorf("%s lists the Secrets of %s: %v, want Forbidden", who, namespace, err)
		} else {
			refusedReads++
		}
		// Nor anywhere else: another namespace's Helm release Secret, every namespace's list, a
		// watch of the controller's namespace.
		if err := cl.Get(ctx, client.ObjectKey{Namespace: metav1.NamespaceDefault, Name: helmReleaseSecret}, &corev1.Secret{}); !apierrors.IsForbidden(err) {
			t.Errorf("%s reads Secret %s/%s: %v, want Forbidden", who, metav1.NamespaceDefault, helmReleaseSecret, err)
		} else {
			refusedReads++
		}
		if err := cl.List(ctx, &l); !apierrors.IsForbidden(err) {
			t.Errorf("%s lists the Secrets of every namespace: %v, want Forbidden", who, err)
		} else {
			refusedReads++
		}
		if w, err := kubernetes.NewForConfigOrDie(cfg).CoreV1().Secrets(namespace).Watch(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
			if w != nil {
				w.Stop()
			}
			t.Errorf("%s watches the Secrets of %s: %v, want Forbidden", who, namespace, err)
		} else {
			refusedReads++
		}
	}
	if want := 2 * (len(names) + 4); refusedReads != want {
		t.Errorf("%d Secret reads refused, want %d", refusedReads, want)
	}

	asker := func(token string) *hostkeys.Client {
		return &hostkeys.Client{URL: "https://" + addr, CA: func() ([]byte, error) { return []byte(ca.Data[nvmeauthctrl.CAKey]), nil },
			Token: func() (string, error) { return token, nil }}
	}
	podToken := func(sa, pod, node string) string {
		boundToken(t, ctx, c, sa, pod, node)
		return audienceToken(t, ctx, c, sa, pod, hostkeys.Audience)
	}
	keyPluginA := asker(audienceToken(t, ctx, c, "plinth-csi-node", "keys-plugin-a", hostkeys.Audience))
	keyAgentA := asker(audienceToken(t, ctx, c, "plinth-agent", "keys-agent-a", hostkeys.Audience))
	keyAgentS := asker(podToken("plinth-agent", "keys-agent-s", storageS))
	keyPluginB := asker(podToken("plinth-csi-node", "keys-plugin-b", nodeB))

	want := func(host, target string) string {
		k, err := dhchap.DeriveHostKey(masters[host], target)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	// Tokens that must get nothing: for the API server's audience, bound to no pod, a workload's.
	apiAudience := boundToken(t, ctx, c, "plinth-csi-node", "keys-plugin-a2", nodeA).BearerToken
	unbound, err := c.kube.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, "plinth-csi-node", &authnv1.TokenRequest{
		Spec: authnv1.TokenRequestSpec{Audiences: []string{hostkeys.Audience}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "keys-tenant"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "ServiceAccount keys-tenant/default", func() error {
		_, err := c.kube.CoreV1().ServiceAccounts("keys-tenant").Get(ctx, "default", metav1.GetOptions{})
		if apierrors.IsNotFound(err) { // no controller-manager service-account controller here
			_, err = c.kube.CoreV1().ServiceAccounts("keys-tenant").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
		}
		return err
	})
	workload, err := c.kube.CoreV1().Pods("keys-tenant").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "app"},
		Spec: corev1.PodSpec{ServiceAccountName: "default", NodeName: nodeA, Containers: []corev1.Container{{Name: "c", Image: "app"}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	workloadTok, err := c.kube.CoreV1().ServiceAccounts("keys-tenant").CreateToken(ctx, "default", &authnv1.TokenRequest{
		Spec: authnv1.TokenRequestSpec{Audiences: []string{hostkeys.Audience}, BoundObjectRef: &authnv1.BoundObjectReference{
			Kind: "Pod", APIVersion: "v1", Name: workload.Name, UID: workload.UID}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The workload's token is no key to the Secrets either.
	wcfg := rest.AnonymousClientConfig(c.cfg)
	wcfg.BearerToken = boundWorkloadAPIToken(t, ctx, c, workload)
	var ws corev1.Secret
	if err := newClient(wcfg).Get(ctx, client.ObjectKey{Namespace: namespace, Name: dhchap.SecretName(nodeA)}, &ws); !apierrors.IsForbidden(err) {
		t.Errorf("a workload on A reads Secret %s: %v, want Forbidden", dhchap.SecretName(nodeA), err)
	}
	served, refused := map[string]hostkeys.Key{}, 0
	for _, r := range []struct {
		what         string
		c            *hostkeys.Client
		host, target string
		allowed      bool
	}{
		{"A's node plugin, A's keys for S", keyPluginA, nodeA, storageS, true},
		{"A's node plugin, A's keys for T", keyPluginA, nodeA, storeT, true},
		{"S's agent, A's keys for S", keyAgentS, nodeA, storageS, true},
		{"B's node plugin, B's keys for T", keyPluginB, nodeB, storeT, true},
		{"A's node plugin asks for B's keys", keyPluginA, nodeB, storageS, false},
		{"A's agent asks for B's keys for A", keyAgentA, nodeB, nodeA, false},
		{"A's agent asks for A's keys for S", keyAgentA, nodeA, storageS, false},
		{"S's agent asks for B's keys (no volume of S published to B)", keyAgentS, nodeB, storageS, false},
		{"S's agent asks for A's keys for T", keyAgentS, nodeA, storeT, false},
		{"A's node plugin with a token for the API server's audience", asker(apiAudience), nodeA, storageS, false},
		{"the node plugin's token bound to no pod", asker(unbound.Status.Token), nodeA, storageS, false},
		{"a workload's token on A", asker(workloadTok.Status.Token), nodeA, storageS, false},
		{"no token", asker(""), nodeA, storageS, false},
	} {
		k, err := r.c.HostKey(ctx, r.host, r.target)
		switch {
		case !r.allowed && errors.Is(err, hostkeys.ErrRefused):
			refused++
			t.Logf("%s: %v", r.what, err)
		case !r.allowed:
			t.Errorf("%s: key %v, error %v; want refused", r.what, k.Key != "", err)
		case err != nil:
			t.Errorf("%s: %v", r.what, err)
		case k.Key != want(r.host, r.target) || k.HostNQN != map[string]string{nodeA: nqnA, nodeB: nqnB}[r.host] || k.KeyID != "id-"+r.host ||
			k.KeyGeneration != 3 || k.CtrlKey == "":
			t.Errorf("%s: host NQN %s, key id %s, generation %d, the derived key %v, a controller key %v", r.what, k.HostNQN, k.KeyID, k.KeyGeneration,
				k.Key == want(r.host, r.target), k.CtrlKey != "")
		default:
			served[r.what] = k
		}
	}
	if len(served) != 4 || refused != 9 {
		t.Errorf("%d of 4 pairs served, %d of 9 requests refused", len(served), refused)
	}
	if served["A's node plugin, A's keys for S"] != served["S's agent, A's keys for S"] {
		t.Error("A's node plugin and S's agent got different keys for the pair (A, S)")
	}
	if served["A's node plugin, A's keys for S"].Key == served["A's node plugin, A's keys for T"].Key {
		t.Error("A's keys for S and for T are equal")
	}

	// A node without a master Secret yet: not found (the CSI node retries), not refused.
	if _, err := asker(podToken("plinth-csi-node", "keys-plugin-c", nodeC)).HostKey(ctx, nodeC, storageS); !errors.Is(err, hostkeys.ErrNotFound) {
		t.Errorf("C's node plugin, C's keys (no master Secret): %v, want not found", err)
	}

	// A storage node forging a publication to B on its own VolumeState learns B's key for itself.
	agentS := newClient(boundToken(t, ctx, c, "plinth-agent", "keys-agent-s2", storageS))
	var vs storev1.VolumeState
	if err := agentS.Get(ctx, client.ObjectKey{Name: volS}, &vs); err != nil {
		t.Fatal(err)
	}
	vs.Spec.Publications = append(vs.Spec.Publications, storev1.Publication{NodeName: nodeB, HostNQN: nqnB, AccessMode: "SINGLE_NODE_WRITER"})
	if err := agentS.Update(ctx, &vs); err != nil {
		t.Fatalf("S's agent updates its own VolumeState: %v", err)
	}
	forged, err := keyAgentS.HostKey(ctx, nodeB, storageS)
	if err != nil {
		t.Fatalf("S's agent, B's keys for S after the forged publication: %v", err)
	}
	if forged.Key != want(nodeB, storageS) || forged.Key == served["B's node plugin, B's keys for T"].Key || forged.Key == masters[nodeB] {
		t.Errorf("B's key for S: the derived key %v; differs from B's key for T %v and from B's master %v",
			forged.Key == want(nodeB, storageS), forged.Key != served["B's node plugin, B's keys for T"].Key, forged.Key != masters[nodeB])
	}
	t.Logf("%d Secret reads refused, %d pairs served, %d refused, a forged publication yields a key for its own target only", refusedReads, len(served), refused)
}

// boundWorkloadAPIToken returns a token for the API server of pod's service account, bound to pod.
func boundWorkloadAPIToken(t *testing.T, ctx context.Context, c *cluster, pod *corev1.Pod) string {
	t.Helper()
	sa := pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	tok, err := c.kube.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, sa, &authnv1.TokenRequest{
		Spec: authnv1.TokenRequestSpec{BoundObjectRef: &authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tok.Status.Token
}
