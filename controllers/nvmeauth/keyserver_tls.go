package nvmeauth

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
)

// Names of the key server's TLS objects in the controller's namespace.
const (
	// ServingSecretName holds the key server's certificate and key (type kubernetes.io/tls).
	ServingSecretName = "plinth-key-server-tls"
	// CAConfigMapName publishes the certificate as CAKey for the clients, which mount it.
	CAConfigMapName = "plinth-key-server-ca"
	// CAKey is the data key of the certificate in CAConfigMapName.
	CAKey = "ca.crt"
	// ServiceName is the key server's Service in the shipped manifests.
	ServiceName = "plinth-key-server"
)

// certValidity is how long a made certificate is valid. Deleting the Secret and restarting the
// controllers makes a new one (the clients' mounted ConfigMap follows within kubelet's sync).
const certValidity = 10 * 365 * 24 * time.Hour

// ServingCertificate returns the key server's certificate from the Secret ServingSecretName in
// namespace, making it when absent: self-signed (its own CA), ECDSA P-256, valid certValidity,
// for the DNS names of the Service (ServiceName, .<namespace>, .svc, .svc.cluster.local) and
// hosts (extra DNS names or IP addresses, for tests). Replicas starting at once make one
// Secret: the loser of the create reads the winner's. It then keeps the ConfigMap
// CAConfigMapName's CAKey equal to the certificate. reader reads uncached (the manager's cache
// holds only the host Secrets).
func ServingCertificate(ctx context.Context, reader client.Reader, c client.Client, namespace string, hosts ...string) (tls.Certificate, error) {
	key := client.ObjectKey{Namespace: namespace, Name: ServingSecretName}
	var sec corev1.Secret
	err := reader.Get(ctx, key, &sec)
	if apierrors.IsNotFound(err) {
		certPEM, keyPEM, gerr := selfSigned(namespace, hosts)
		if gerr != nil {
			return tls.Certificate{}, gerr
		}
		sec = corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: ServingSecretName, Labels: map[string]string{policyv1.LabelManagedBy: "plinth"}},
			Type:       corev1.SecretTypeTLS,
			Data:       map[string][]byte{corev1.TLSCertKey: certPEM, corev1.TLSPrivateKeyKey: keyPEM},
		}
		err = c.Create(ctx, &sec)
		if apierrors.IsAlreadyExists(err) {
			err = reader.Get(ctx, key, &sec)
		}
	}
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("key server certificate, Secret %s: %w", key, err)
	}
	cert, err := tls.X509KeyPair(sec.Data[corev1.TLSCertKey], sec.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("key server certificate, Secret %s: %w", key, err)
	}
	want := string(sec.Data[corev1.TLSCertKey])
	var cm corev1.ConfigMap
	cmKey := client.ObjectKey{Namespace: namespace, Name: CAConfigMapName}
	err = reader.Get(ctx, cmKey, &cm)
	switch {
	case apierrors.IsNotFound(err):
		cm = corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: CAConfigMapName, Labels: map[string]string{policyv1.LabelManagedBy: "plinth"}},
			Data: map[string]string{CAKey: want}}
		if err = c.Create(ctx, &cm); apierrors.IsAlreadyExists(err) {
			err = nil // another replica made it from the same Secret
		}
	case err == nil && cm.Data[CAKey] != want:
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		cm.Data[CAKey] = want
		err = c.Update(ctx, &cm)
	}
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("key server CA, ConfigMap %s: %w", cmKey, err)
	}
	return cert, nil
}

func selfSigned(namespace string, hosts []string) (certPEM, keyPEM []byte, err error) {
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("key server key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, nil, fmt.Errorf("key server certificate serial: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: ServiceName + "." + namespace + ".svc"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(certValidity),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		DNSNames: []string{ServiceName, ServiceName + "." + namespace, ServiceName + "." + namespace + ".svc",
			ServiceName + "." + namespace + ".svc.cluster.local"},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &priv.PublicKey, priv)
	if err != nil {
		return nil, nil, fmt.Errorf("key server certificate: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(priv)
	if err != nil {
		return nil, nil, fmt.Errorf("key server key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), nil
}

// KeyServerRunnable serves a KeyServer over HTTPS on Addr in every replica (no leader election:
// the answers are reads). Start gets the certificate (ServingCertificate) and serves until its
// context ends.
type KeyServerRunnable struct {
	Addr      string
	Server    *KeyServer
	Reader    client.Reader
	Client    client.Client
	Namespace string
	// Hosts are extra certificate names (tests: 127.0.0.1).
	Hosts []string
	// Listening, when set, receives the bound address once the server listens (tests bind
	// port 0).
	Listening chan<- string
}

// NeedLeaderElection implements manager.LeaderElectionRunnable.
func (*KeyServerRunnable) NeedLeaderElection() bool { return false }

// Start implements manager.Runnable.
func (r *KeyServerRunnable) Start(ctx context.Context) error {
	cert, err := ServingCertificate(ctx, r.Reader, r.Client, r.Namespace, r.Hosts...)
	if err != nil {
		return err
	}
	l, err := net.Listen("tcp", r.Addr)
	if err != nil {
		return fmt.Errorf("key server: %w", err)
	}
	if r.Listening != nil {
		r.Listening <- l.Addr().String()
	}
	srv := &http.Server{
		Handler:           r.Server,
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13},
		ReadHeaderTimeout: 10 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}
	ctrl.LoggerFrom(ctx).Info("key server listening", "address", l.Addr().String())
	done := make(chan struct{})
	go func() {
		defer close(done)
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.ServeTLS(l, "", ""); !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("key server: %w", err)
	}
	<-done // Shutdown has let the requests in flight finish
	return nil
}
