package policy_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nvmeauthctrl "github.com/plinth-storage/plinth/controllers/nvmeauth"
	"github.com/plinth-storage/plinth/controllers/policy"
	"github.com/plinth-storage/plinth/internal/dhchap"
	"github.com/plinth-storage/plinth/internal/hostkeys"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// Expected: the controller manager with --key-server-bind-address serves the key server from
// its own cache and credentials. A Protocol asking for DH-HMAC-CHAP and worker W's host NQN make
// W's master Secret; W's node plugin (a token of audience plinth-key-server bound to its Pod on
// W) gets W's keys for storage node S, and S's agent, whose VolumeState is published to W, gets
// the same. Raising keyGeneration in the Protocol rotates them: both then get a new host key
// with a new key id and generation 1, and the same controller key (a rotation keeps it).
func TestKeyServerServesRotatedKeys(t *testing.T) {
	c := env(t)
	ctx := t.Context()
	const worker, storage = "ks-worker", "ks-storage"
	const nqn = "nqn.2014-08.org.nvmexpress:uuid:ks-worker"
	listening := make(chan string, 1)
	startController(t, func(o *policy.Options) {
		o.KeyServerAddr, o.KeyServerHosts, o.KeyServerListening = "127.0.0.1:0", []string{"127.0.0.1"}, listening
	})
	var addr string
	select {
	case addr = <-listening:
	case <-time.After(time.Minute):
		t.Fatal("key server not listening after a minute")
	}
	var ca corev1.ConfigMap
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: nvmeauthctrl.CAConfigMapName}, &ca); err != nil {
		t.Fatal(err)
	}

	for _, n := range []*corev1.Node{
		{ObjectMeta: metav1.ObjectMeta{Name: worker, Annotations: map[string]string{policyv1.AnnotationHostNQN: nqn}}},
		{ObjectMeta: metav1.ObjectMeta{Name: storage}},
	} {
		if err := c.Create(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	proto := &policyv1.Protocol{ObjectMeta: metav1.ObjectMeta{Name: "ks-auth"}, Spec: policyv1.ProtocolSpec{
		NVMeoFTCP: &policyv1.NVMeoFTCPProtocol{Port: 4420, BindCIDR: "10.0.0.0/8", ACL: ptr.To(true),
			Auth: &policyv1.NVMeoFAuth{Mode: policyv1.AuthDHHMACCHAP, Hash: "sha256"}}}}
	if err := c.Create(ctx, proto); err != nil {
		t.Fatal(err)
	}
	backend := policyv1.Backend{File: &policyv1.FileBackend{Directory: "/var/lib/plinth/volumes"}}
	if err := c.Create(ctx, &storev1.VolumeState{
		ObjectMeta: metav1.ObjectMeta{Name: storev1.VolumeID("ks-vol"), Labels: map[string]string{policyv1.LabelNode: storev1.NameLabelValue(storage)}},
		Spec: storev1.VolumeStateSpec{CSIName: "ks-vol", StoreName: storev1.StoreName("pool", storage), CapacityBytes: 1 << 20, VolumeMode: "Filesystem",
			Policy:       storev1.FrozenPolicy{Placement: "remote", Pool: "pool", Protocol: proto.Name, Backend: backend, ProtocolSpec: proto.Spec},
			Publications: []storev1.Publication{{NodeName: worker, HostNQN: nqn, AccessMode: "SINGLE_NODE_WRITER"}}},
	}); err != nil {
		t.Fatal(err)
	}

	kube, err := kubernetes.NewForConfig(suite.cp.Admin.Config)
	if err != nil {
		t.Fatal(err)
	}
	// A component's projected token: its ServiceAccount, a Pod on its node, audience plinth-key-server.
	asker := func(sa, node string) *hostkeys.Client {
		if _, err := kube.CoreV1().ServiceAccounts(namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		p, err := kube.CoreV1().Pods(namespace).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: sa + "-" + node},
			Spec: corev1.PodSpec{ServiceAccountName: sa, NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "plinth"}}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		tok, err := kube.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, sa, &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{
			Audiences: []string{hostkeys.Audience}, BoundObjectRef: &authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: p.Name, UID: p.UID}}},
			metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return &hostkeys.Client{URL: "https://" + addr, CA: func() ([]byte, error) { return []byte(ca.Data[nvmeauthctrl.CAKey]), nil },
			Token: func() (string, error) { return tok.Status.Token, nil }}
	}
	plugin, agent := asker(nvmeauthctrl.DefaultNodePluginAccount, worker), asker(nvmeauthctrl.DefaultAgentAccount, storage)

	// both sides' answer once it has generation gen
	both := func(gen int64) hostkeys.Key {
		var k hostkeys.Key
		eventually(t, 30*time.Second, fmt.Sprintf("keys of generation %d from the key server", gen), func() error {
			p, err := plugin.HostKey(ctx, worker, storage)
			if err != nil {
				return err
			}
			a, err := agent.HostKey(ctx, worker, storage)
			if err != nil {
				return err
			}
			if p != a {
				return errors.New("the node plugin and the agent got different keys")
			}
			if p.KeyGeneration != gen {
				return fmt.Errorf("generation %d", p.KeyGeneration)
			}
			k = p
			return nil
		})
		return k
	}
	k0 := both(0)
	var sec corev1.Secret
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: dhchap.SecretName(worker)}, &sec); err != nil {
		t.Fatal(err)
	}
	if want, _ := dhchap.DeriveHostKey(string(sec.Data[dhchap.KeyHostSecret]), storage); k0.Key != want || k0.HostNQN != nqn || k0.KeyID == "" {
		t.Errorf("generation 0: the derived key %v, host NQN %s, key id %q", k0.Key == want, k0.HostNQN, k0.KeyID)
	}

	if err := c.Get(ctx, client.ObjectKey{Name: proto.Name}, proto); err != nil {
		t.Fatal(err)
	}
	proto.Spec.NVMeoFTCP.Auth.KeyGeneration = 1
	if err := c.Update(ctx, proto); err != nil {
		t.Fatal(err)
	}
	k1 := both(1)
	if k1.Key == k0.Key || k1.KeyID == k0.KeyID || k1.CtrlKey != k0.CtrlKey {
		t.Errorf("after the rotation: new host key %v, new key id %v, same controller key %v", k1.Key != k0.Key, k1.KeyID != k0.KeyID, k1.CtrlKey == k0.CtrlKey)
	}
}
