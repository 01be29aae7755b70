package nvmeauth

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/internal/hostkeys"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// Its RBAC: tokenreviews create (cluster); volumestates list (cluster); the host Secrets as
// the Reconciler's.

// NodeNameExtra is the user-info extra key under which the API server names the node of the Pod
// a service-account token is bound to (Kubernetes 1.32 and later, beta since 1.30).
const NodeNameExtra = "authentication.kubernetes.io/node-name"

// Default service-account names of the callers the key server serves.
const (
	DefaultAgentAccount      = "plinth-agent"
	DefaultNodePluginAccount = "plinth-csi-node"
)

// reviewTTL bounds how long a successful TokenReview answers for its token: a token invalidated
// meanwhile (its Pod deleted) keeps its access at most this long, as the API server's own
// webhook token cache does for two minutes.
const reviewTTL = time.Minute

// maxCachedReviews bounds the review cache: one entry per live agent and node plugin token.
const maxCachedReviews = 4096

// KeyServer answers hostkeys.Path (docs/design.md#key-distribution): the keys of one (host,
// target) pair, derived from the host's master Secret, to the node plugin of the host (any
// target) and to the agent of the target (hosts a publication of one of its VolumeStates names),
// each authenticated by a TokenReview of its bearer token and identified by the review's user
// (system:serviceaccount:<Namespace>:<account>) and node claim (NodeNameExtra). Everything else
// is refused: 401 for no or an invalid token, 403 for another caller or pair. Answers and logs
// never hold a key.
type KeyServer struct {
	// Keys reads and derives the masters (hostkeys.Secrets over the manager's cache).
	Keys hostkeys.Source
	// Reader lists the VolumeStates of the caller's node (the API reader: what the agent sees
	// is there).
	Reader client.Reader
	// Reviewer creates TokenReviews.
	Reviewer client.Writer
	// Namespace is the namespace of the callers' service accounts (the controller's).
	Namespace string
	// Audience is asked of every TokenReview (hostkeys.Audience); "" takes the API server's.
	Audience string
	// AgentAccount and NodePluginAccount name the callers' service accounts (defaults
	// DefaultAgentAccount, DefaultNodePluginAccount).
	AgentAccount, NodePluginAccount string

	mu      sync.Mutex
	reviews map[[32]byte]reviewed
	// now is time.Now; tests move it.
	now func() time.Time
}

type reviewed struct {
	user, node string
	expires    time.Time
}

// errUnauthenticated marks a token the API server did not authenticate (401).
var errUnauthenticated = errors.New("not authenticated")

// caller is who asks: the review's user name and node claim.
type caller struct{ user, node string }

func (s *KeyServer) clock() time.Time {
	if s.now != nil {
		return s.now()
	}
	return time.Now()
}

// authenticate reviews token (cached for reviewTTL when it authenticates).
func (s *KeyServer) authenticate(ctx context.Context, token string) (caller, error) {
	sum := sha256.Sum256([]byte(token))
	now := s.clock()
	s.mu.Lock()
	if r, ok := s.reviews[sum]; ok && now.Before(r.expires) {
		s.mu.Unlock()
		return caller{r.user, r.node}, nil
	}
	s.mu.Unlock()
	tr := &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: token}}
	if s.Audience != "" {
		tr.Spec.Audiences = []string{s.Audience}
	}
	if err := s.Reviewer.Create(ctx, tr); err != nil {
		return caller{}, fmt.Errorf("token review: %w", err)
	}
	if !tr.Status.Authenticated {
		return caller{}, fmt.Errorf("%w: %s", errUnauthenticated, tr.Status.Error)
	}
	if s.Audience != "" && !contains(tr.Status.Audiences, s.Audience) {
		return caller{}, fmt.Errorf("%w: the token is not for audience %s", errUnauthenticated, s.Audience)
	}
	c := caller{user: tr.Status.User.Username}
	if n := tr.Status.User.Extra[NodeNameExtra]; len(n) == 1 {
		c.node = n[0]
	}
	s.mu.Lock()
	if s.reviews == nil || len(s.reviews) >= maxCachedReviews {
		s.reviews = map[[32]byte]reviewed{}
	}
	s.reviews[sum] = reviewed{user: c.user, node: c.node, expires: now.Add(reviewTTL)}
	s.mu.Unlock()
	return c, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// errForbidden marks a caller not allowed the pair it asked for (403).
var errForbidden = errors.New("forbidden")

// authorize says whether c may have the keys of (host, target).
func (s *KeyServer) authorize(ctx context.Context, c caller, host, target string) error {
	agent, plugin := s.AgentAccount, s.NodePluginAccount
	if agent == "" {
		agent = DefaultAgentAccount
	}
	if plugin == "" {
		plugin = DefaultNodePluginAccount
	}
	prefix := "system:serviceaccount:" + s.Namespace + ":"
	switch c.user {
	case prefix + plugin, prefix + agent:
	default:
		return fmt.Errorf("%w: %s is neither %s nor %s", errForbidden, c.user, prefix+agent, prefix+plugin)
	}
	if c.node == "" {
		return fmt.Errorf("%w: the credentials of %s carry no node (user extra %s): use the token of its Pod", errForbidden, c.user, NodeNameExtra)
	}
	if c.user == prefix+plugin {
		if host != c.node {
			return fmt.Errorf("%w: the node plugin of node %s gets that node's keys only, not host %s's", errForbidden, c.node, host)
		}
		return nil
	}
	if target != c.node {
		return fmt.Errorf("%w: the agent of node %s gets keys for target %s only, not %s", errForbidden, c.node, c.node, target)
	}
	var vss storev1.VolumeStateList
	if err := s.Reader.List(ctx, &vss, client.MatchingLabels{policyv1.LabelNode: storev1.NameLabelValue(c.node)}); err != nil {
		return fmt.Errorf("list the VolumeStates of node %s: %w", c.node, err)
	}
	for _, vs := range vss.Items {
		for _, p := range vs.Spec.Publications {
			if p.NodeName == host && p.HostNQN != "" { // a local volume's publication grants no keys
				return nil
			}
		}
	}
	return fmt.Errorf("%w: no volume of node %s is published to host %s", errForbidden, c.node, host)
}

// ServeHTTP implements http.Handler for hostkeys.Path.
func (s *KeyServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	log := ctrl.LoggerFrom(ctx).WithName("key-server")
	if r.URL.Path != hostkeys.Path {
		http.NotFound(w, r)
		return
	}
	if r.Method != http.MethodGet {
		http.Error(w, "GET only", http.StatusMethodNotAllowed)
		return
	}
	q := r.URL.Query()
	host, target := q.Get("host"), q.Get("target")
	if host == "" || target == "" {
		http.Error(w, "query parameters host and target (Node names) are required", http.StatusBadRequest)
		return
	}
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || token == "" {
		http.Error(w, "no bearer token", http.StatusUnauthorized)
		return
	}
	c, err := s.authenticate(ctx, token)
	if errors.Is(err, errUnauthenticated) {
		log.Info("refused a token", "host", host, "target", target, "why", err.Error())
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	} else if err != nil {
		log.Error(err, "token review failed")
		http.Error(w, "token review failed; retry", http.StatusServiceUnavailable)
		return
	}
	if err := s.authorize(ctx, c, host, target); errors.Is(err, errForbidden) {
		log.Info("refused the keys of a pair", "user", c.user, "node", c.node, "host", host, "target", target, "why", err.Error())
		http.Error(w, err.Error(), http.StatusForbidden)
		return
	} else if err != nil {
		log.Error(err, "authorize", "user", c.user, "node", c.node)
		http.Error(w, "authorization failed; retry", http.StatusServiceUnavailable)
		return
	}
	k, err := s.Keys.HostKey(ctx, host, target)
	switch {
	case errors.Is(err, hostkeys.ErrNotFound):
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	case errors.Is(err, hostkeys.ErrUnusable):
		http.Error(w, err.Error(), http.StatusUnprocessableEntity)
		return
	case err != nil:
		log.Error(err, "read the host's keys", "host", host)
		http.Error(w, "reading the host's keys failed; retry", http.StatusServiceUnavailable)
		return
	}
	log.V(1).Info("served the keys of a pair", "user", c.user, "node", c.node, "host", host, "target", target, "keyID", k.KeyID)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(k)
}
