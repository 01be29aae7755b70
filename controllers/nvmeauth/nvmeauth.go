// Package nvmeauth keeps one Kubernetes Secret per NVMe host for in-band authentication
// (DH-HMAC-CHAP): when a Protocol asks for it (spec.nvmeofTcp.auth.mode DHHMACCHAP), every Node
// with a host NQN (annotation plinth.dev/host-nqn, set by the CSI node plugin) gets the Secret
// nvme-auth-<node> in the controller's namespace, with a host secret and a controller secret
// generated with crypto/rand in the DHHC-1 representation (internal/dhchap). They are masters:
// the KeyServer (keyserver.go) hands out the secrets derived from them for one storage node, to
// that storage node's agent (which writes them into nvmet's host entries) and to the host's CSI
// node plugin (which presents them when it connects); neither reads a Secret.
//
// A Secret gets new keys when the node's host NQN changes or when the hash of the Protocols
// changes (the key length follows it), and a new host secret when their keyGeneration rises
// above the one the Secret was made for (annotation plinth.dev/dhchap-key-generation): a
// rotation asked in Git (the controller secret stays: see Reconcile). The keys are replaced
// in the same Secret, with a new key id (plinth.dev/dhchap-key-id) that
// agents and node plugins compare to order the switch: storage nodes first, then hosts. It is
// deleted with its Node (it is also owned by the Node, for the garbage collector). Turning
// authentication off in Git keeps the Secrets: volumes keep the policy they were created with.
// Secret data never reaches logs, events or conditions; only names do.
package nvmeauth

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/plinth-storage/plinth/internal/dhchap"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
)

// SecretType is the type of the host Secrets.
const SecretType corev1.SecretType = "plinth.dev/nvme-dhchap"

// Its RBAC: nodes get/list/watch and protocols get/list/watch (cluster), secrets
// get/list/watch/create/update/delete in the controller's namespace only (a Role).

// Reconciler keeps the host Secrets; one reconcile per Node.
type Reconciler struct {
	// Client reads Nodes and Protocols from the cache and writes Secrets.
	Client client.Client
	// Namespace holds the Secrets (the controller's namespace).
	Namespace string
	// SkipNameValidation lets tests start several managers in one process.
	SkipNameValidation bool
}

// Wanted is the authentication the Protocols ask for: On when one has mode DHHMACCHAP; Hash
// ("sha256", "sha384", "sha512") of those (the first by name decides: plinth vet refuses
// Protocols that disagree); KeyGeneration the highest keyGeneration among them (vet refuses
// disagreeing ones too; the highest wins so that a rotation is never undone by a lagging one).
type Wanted struct {
	On            bool
	Hash          string
	KeyGeneration int64
}

// WantedOf computes Wanted from the Protocols.
func WantedOf(protocols []policyv1.Protocol) Wanted {
	sort.Slice(protocols, func(i, j int) bool { return protocols[i].Name < protocols[j].Name })
	var w Wanted
	for _, p := range protocols {
		if p.Spec.NVMeoFTCP == nil || !p.Spec.NVMeoFTCP.Auth.Enabled() {
			continue
		}
		if !w.On {
			w.On, w.Hash = true, p.Spec.NVMeoFTCP.Auth.Hash
			if w.Hash == "" {
				w.Hash = "sha256"
			}
		}
		w.KeyGeneration = max(w.KeyGeneration, p.Spec.NVMeoFTCP.Auth.KeyGeneration)
	}
	return w
}

// SetupWithManager registers the reconciler: Nodes, Protocols (every Node), and the host
// Secrets (their Node).
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	allNodes := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, _ client.Object) []reconcile.Request {
		var nodes corev1.NodeList
		if err := r.Client.List(ctx, &nodes); err != nil {
			return nil
		}
		out := make([]reconcile.Request, 0, len(nodes.Items))
		for _, n := range nodes.Items {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKey{Name: n.Name}})
		}
		return out
	})
	ofSecret := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		if o.GetNamespace() != r.Namespace || o.GetLabels()[dhchap.LabelComponent] != dhchap.ComponentValue {
			return nil
		}
		node := o.GetAnnotations()[annotationNode]
		if node == "" {
			return nil
		}
		return []reconcile.Request{{NamespacedName: client.ObjectKey{Name: node}}}
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("nvmeauth").
		WithOptions(controller.Options{SkipNameValidation: &r.SkipNameValidation}).
		For(&corev1.Node{}, builder.WithPredicates(predicate.Or(predicate.AnnotationChangedPredicate{}, predicate.GenerationChangedPredicate{}))).
		Watches(&policyv1.Protocol{}, allNodes, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&corev1.Secret{}, ofSecret).
		Complete(r)
}

// annotationNode on a Secret names its Node (label values cannot hold every Node name).
const annotationNode = "plinth.dev/node"

// Reconcile makes, renews or deletes the Secret of one Node.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	log := ctrl.LoggerFrom(ctx)
	name := dhchap.SecretName(req.Name)
	if !dhchap.ValidNodeName(req.Name) {
		log.Info("node name too long for its DH-HMAC-CHAP Secret name; no secret made", "node", req.Name)
		return ctrl.Result{}, nil
	}
	key := client.ObjectKey{Namespace: r.Namespace, Name: name}
	var sec corev1.Secret
	err := r.Client.Get(ctx, key, &sec)
	if err != nil && !apierrors.IsNotFound(err) {
		return ctrl.Result{}, err
	}
	exists := err == nil
	if exists && sec.Labels[dhchap.LabelComponent] != dhchap.ComponentValue {
		return ctrl.Result{}, fmt.Errorf("secret %s exists and is not Plinth's (label %s=%s missing): not touched", key, dhchap.LabelComponent, dhchap.ComponentValue)
	}
	var node corev1.Node
	if err := r.Client.Get(ctx, req.NamespacedName, &node); apierrors.IsNotFound(err) || err == nil && !node.DeletionTimestamp.IsZero() {
		if exists {
			log.Info("deleting the DH-HMAC-CHAP Secret of a deleted node", "secret", key)
			return ctrl.Result{}, client.IgnoreNotFound(r.Client.Delete(ctx, &sec))
		}
		return ctrl.Result{}, nil
	} else if err != nil {
		return ctrl.Result{}, err
	}
	nqn := node.Annotations[policyv1.AnnotationHostNQN]
	if nqn == "" {
		return ctrl.Result{}, nil // the node plugin has not said yet; agents refuse the host meanwhile
	}
	var protocols policyv1.ProtocolList
	if err := r.Client.List(ctx, &protocols); err != nil {
		return ctrl.Result{}, err
	}
	w := WantedOf(protocols.Items)
	if !exists && !w.On {
		return ctrl.Result{}, nil
	}
	if exists && !w.On {
		return ctrl.Result{}, nil // kept for the volumes made while auth was on
	}
	why := renewal(&sec, exists, nqn, w)
	if why == "" {
		if sec.Annotations[dhchap.AnnotationKeyID] != "" {
			return ctrl.Result{}, nil // up to date
		}
		// made before key ids existed: name its keys (unchanged) so that agents can report them
		id, err := dhchap.NewKeyID()
		if err != nil {
			return ctrl.Result{}, err
		}
		if sec.Annotations == nil {
			sec.Annotations = map[string]string{}
		}
		sec.Annotations[dhchap.AnnotationKeyID] = id
		log.Info("naming the keys of a DH-HMAC-CHAP Secret (keys unchanged)", "secret", key, "node", node.Name)
		return ctrl.Result{}, r.Client.Update(ctx, &sec)
	}
	keyID, err := dhchap.NewKeyID()
	if err != nil {
		return ctrl.Result{}, err
	}
	hostKey, err := dhchap.Generate(w.Hash)
	if err != nil {
		return ctrl.Result{}, err
	}
	// A rotation renews the host secret only: the live re-authentication that hands it to the
	// hosts' controllers (csi/node/rotate.go) can switch one secret at a time, and with both changed
	// Linux 6.12 first re-authenticates with one new and one old, fails, and the target drops
	// the connection (seen stuck in "resetting" for minutes in the kernel tests). The
	// controller secret is made anew with the host NQN or the hash.
	ctrlKey := string(sec.Data[dhchap.KeyCtrlSecret])
	if _, _, err := dhchap.Decode(ctrlKey); err != nil || !rotationOnly(why) {
		if ctrlKey, err = dhchap.Generate(w.Hash); err != nil {
			return ctrl.Result{}, err
		}
	}
	sec.Namespace, sec.Name = r.Namespace, name
	sec.Type = SecretType
	sec.Labels = map[string]string{policyv1.LabelManagedBy: "plinth", dhchap.LabelComponent: dhchap.ComponentValue}
	sec.Annotations = map[string]string{annotationNode: node.Name, dhchap.AnnotationHostNQN: nqn, dhchap.AnnotationHash: w.Hash,
		dhchap.AnnotationKeyGeneration: strconv.FormatInt(w.KeyGeneration, 10), dhchap.AnnotationKeyID: keyID}
	sec.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID, BlockOwnerDeletion: ptr.To(false)}}
	sec.Data = map[string][]byte{dhchap.KeyHostSecret: []byte(hostKey), dhchap.KeyCtrlSecret: []byte(ctrlKey)}
	if exists {
		// the update is a compare-and-swap on the resourceVersion read above: a concurrent
		// change makes it fail and the reconcile runs again on what is there
		log.Info("renewing the DH-HMAC-CHAP keys of a node", "secret", key, "node", node.Name, "why", why, "keyGeneration", w.KeyGeneration, "keyID", keyID)
		return ctrl.Result{}, r.Client.Update(ctx, &sec)
	}
	log.Info("making the DH-HMAC-CHAP Secret of a node", "secret", key, "node", node.Name)
	return ctrl.Result{}, r.Client.Create(ctx, &sec)
}

// renewal says why sec needs new keys for a node with host NQN nqn under w, or "" when its keys
// stand: none yet, another host NQN, another hash, or a keyGeneration below w's (a rotation).
// A keyGeneration above w's (lowered in Git) keeps the keys.
func renewal(sec *corev1.Secret, exists bool, nqn string, w Wanted) string {
	switch {
	case !exists:
		return "no Secret yet"
	case sec.Annotations[dhchap.AnnotationHostNQN] != nqn:
		return "host NQN changed"
	case sec.Annotations[dhchap.AnnotationHash] != w.Hash:
		return "hash changed"
	case dhchap.KeyGenerationOf(sec.Annotations) < w.KeyGeneration:
		return fmt.Sprintf("%s from %d", reasonRotation, dhchap.KeyGenerationOf(sec.Annotations))
	}
	return ""
}

// reasonRotation starts renewal's answer for a keyGeneration rise.
const reasonRotation = "keyGeneration raised"

// rotationOnly reports whether renewal's answer is a keyGeneration rise (host NQN and hash
// unchanged).
func rotationOnly(why string) bool { return strings.HasPrefix(why, reasonRotation) }
