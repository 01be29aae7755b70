package guestnode

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/controllers/nvmeauth"
	"github.com/plinth-storage/plinth/internal/hostkeys"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/test/kernel/apimux"
	"github.com/plinth-storage/plinth/test/kernel/guest"
)

// The guests' agent and node plugins get their DH-HMAC-CHAP keys as the shipped manifests have
// them do (docs/design.md#key-distribution): from the controller's key server, run here on the
// host (controllers/nvmeauth.KeyServer behind the certificate nvmeauth.ServingCertificate makes,
// the controller's code), which reviews each caller's token with the real API server. The
// tokens are what kubelet projects into their Pods: audience hostkeys.Audience, bound to a Pod
// of the caller's service account on the caller's Node, so the review carries the node claim.
// The guests reach the server as they reach the API server: through their own apimux (guest
// port keyServerGuestPort on 127.0.0.1) over a guestfwd to a Demux on the host.
const (
	// keyServerGuestPort is where the key server answers inside each guest.
	keyServerGuestPort = 8444
	// keyServerCAFile and keyServerTokenFile (a %s for the node) are the key server's CA and
	// the callers' tokens in the guests' share.
	keyServerCAFile    = "key-server-ca.crt"
	keyServerTokenFile = "key-server-token-%s"
	// keyTokenSeconds is the tokens' lifetime: longer than the suite (guest.Options.Timeout).
	keyTokenSeconds = 3 * 60 * 60
)

// keyServerFlags are the agent's or node plugin's flags for the key server, as node.
func keyServerFlags(node string) string {
	return fmt.Sprintf("--key-server https://127.0.0.1:%d --key-server-ca-file %s/%s --key-server-token-file %s/"+keyServerTokenFile,
		keyServerGuestPort, guest.SharePath, keyServerCAFile, guest.SharePath, node)
}

// keyServerMuxScript starts the guest's end of the key server's mux.
var keyServerMuxScript = fmt.Sprintf("(/tmp/apimux -listen 127.0.0.1:%[1]d -upstream %[2]s:%[1]d >/tmp/apimux-keys.log 2>&1 & echo $! > /tmp/apimux-keys.pid)",
	keyServerGuestPort, guest.GuestForwardAddr)

// keyServer is the key server of the suite and what it served.
type keyServer struct {
	demux *apimux.Demux
	ca    []byte
	// tokens maps each caller's token to its name ("agent storage-0", "node plugin worker-a").
	tokens map[string]string
	files  map[string][]byte // share file name → content

	mu sync.Mutex
	// served counts the answers by caller, pair ("worker-a→storage-0") and HTTP status.
	served map[string]int
}

// keyCaller names a caller in served: "agent storage-0", "node plugin worker-a".
func keyCaller(account, node string) string {
	if account == nvmeauth.DefaultAgentAccount {
		return "agent " + node
	}
	return "node plugin " + node
}

// startKeyServer makes the callers' service accounts, Pods and tokens in authNamespace with c
// and starts the key server with cfg (the controller's credentials: it reads the master
// Secrets, makes its certificate and reviews tokens) and its Demux; both stop at t's cleanup.
func startKeyServer(t *testing.T, c client.Client, cfg *rest.Config) *keyServer {
	t.Helper()
	ctx := t.Context()
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: authNamespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ks := &keyServer{tokens: map[string]string{}, files: map[string][]byte{}, served: map[string]int{}}
	for _, sa := range []string{nvmeauth.DefaultAgentAccount, nvmeauth.DefaultNodePluginAccount} {
		create(t, c, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: authNamespace, Name: sa}})
	}
	for node, sa := range map[string]string{storageNode: nvmeauth.DefaultAgentAccount, workerA: nvmeauth.DefaultNodePluginAccount, workerB: nvmeauth.DefaultNodePluginAccount} {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: authNamespace, Name: sa + "-" + node},
			Spec: corev1.PodSpec{ServiceAccountName: sa, NodeName: node, Containers: []corev1.Container{{Name: "plinth", Image: "plinth"}}}}
		create(t, c, pod)
		tok, err := kube.CoreV1().ServiceAccounts(authNamespace).CreateToken(ctx, sa, &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{
			Audiences: []string{hostkeys.Audience}, ExpirationSeconds: ptr.To(int64(keyTokenSeconds)),
			BoundObjectRef: &authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("token of %s bound to pod %s: %v", sa, pod.Name, err)
		}
		ks.tokens[tok.Status.Token] = keyCaller(sa, node)
		ks.files[fmt.Sprintf(keyServerTokenFile, node)] = []byte(tok.Status.Token)
	}

	// The controller's client: the built-in kinds (TokenReview) and Plinth's.
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, storev1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	if c, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		t.Fatal(err)
	}
	cert, err := nvmeauth.ServingCertificate(ctx, c, c, authNamespace, "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	var cm corev1.ConfigMap
	if err := c.Get(ctx, client.ObjectKey{Namespace: authNamespace, Name: nvmeauth.CAConfigMapName}, &cm); err != nil {
		t.Fatalf("the key server's CA ConfigMap: %v", err)
	}
	ks.ca = []byte(cm.Data[nvmeauth.CAKey])
	ks.files[keyServerCAFile] = ks.ca
	srv := &nvmeauth.KeyServer{Keys: hostkeys.Secrets{Reader: c, Namespace: authNamespace}, Reader: c, Reviewer: c,
		Namespace: authNamespace, Audience: hostkeys.Audience}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: ks.count(srv), ReadHeaderTimeout: 10 * time.Second,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13}}
	done := make(chan error, 1)
	go func() { done <- hs.ServeTLS(l, "", "") }()
	t.Cleanup(func() {
		hs.Close()
		if err := <-done; err != http.ErrServerClosed {
			t.Errorf("key server: %v", err)
		}
	})
	ks.demux, err = apimux.Start(l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ks.demux.Close() })
	return ks
}

// forward is the guestfwd of the key server's mux.
func (ks *keyServer) forward() guest.Forward {
	return guest.Forward{HostPort: ks.demux.Port(), GuestPort: keyServerGuestPort}
}

// writeShare writes the CA and the tokens into a guest's share.
func (ks *keyServer) writeShare(t *testing.T, dir string) {
	t.Helper()
	for name, data := range ks.files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// statusRecorder keeps the status a handler wrote.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	r.status = code
	r.ResponseWriter.WriteHeader(code)
}

// count wraps h, counting each answer in served by caller (from its token), pair and status.
func (ks *keyServer) count(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		h.ServeHTTP(rec, r)
		who := ks.tokens[strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")]
		if who == "" {
			who = "unknown"
		}
		q := r.URL.Query()
		ks.mu.Lock()
		ks.served[fmt.Sprintf("%s %s→%s %d", who, q.Get("host"), q.Get("target"), rec.status)]++
		ks.mu.Unlock()
	})
}

// servedKeys returns how many times the key server gave caller the keys of host toward target.
func (ks *keyServer) servedKeys(caller, host, target string) int {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	return ks.served[fmt.Sprintf("%s %s→%s %d", caller, host, target, http.StatusOK)]
}

// answers lists every answer counted so far ("caller host→target status": count).
func (ks *keyServer) answers() map[string]int {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	out := make(map[string]int, len(ks.served))
	for k, v := range ks.served {
		out[k] = v
	}
	return out
}

// checkKeysFromKeyServer checks, once A staged an authenticated volume of the storage node,
// that both ends got A's keys for the storage node from the key server with their own tokens
// (the agent for the target's host entry, A's node plugin for the connection), and that the
// server refused nobody: every caller asks only for what its node may have.
func (s *suite) checkKeysFromKeyServer(t *testing.T) {
	t.Helper()
	for _, who := range []string{keyCaller(nvmeauth.DefaultAgentAccount, storageNode), keyCaller(nvmeauth.DefaultNodePluginAccount, workerA)} {
		if n := s.keys.servedKeys(who, workerA, storageNode); n == 0 {
			t.Errorf("the key server never gave the %s the keys of %s for %s; its answers: %v", who, workerA, storageNode, s.keys.answers())
		}
	}
	for a, n := range s.keys.answers() {
		if strings.HasPrefix(a, "unknown ") || (!strings.HasSuffix(a, " 200") && !strings.HasSuffix(a, " 404")) {
			t.Errorf("key server answered %s (%d times): want only keys (200) or no Secret yet (404) to the suite's callers", a, n)
		}
	}
}
