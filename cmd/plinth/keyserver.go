package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/plinth-storage/plinth/controllers/nvmeauth"
	"github.com/plinth-storage/plinth/internal/hostkeys"
)

// Default paths of the key server's CA and token in the agent and node plugin Pods of the
// shipped manifests: the ConfigMap plinth-key-server-ca and a projected service-account token
// of audience hostkeys.Audience.
const (
	defaultKeyServerCAFile    = "/etc/plinth/key-server/ca.crt"
	defaultKeyServerTokenFile = "/var/run/secrets/plinth.dev/key-server/token"
)

// keyServerFlags are the agent's and node plugin's flags for the controller's key server.
type keyServerFlags struct{ url, caFile, caConfigMap, tokenFile string }

func (k *keyServerFlags) bind(f *pflag.FlagSet) {
	f.StringVar(&k.url, "key-server", "", "base URL of the controller's DH-HMAC-CHAP key server (e.g. https://plinth-key-server.plinth-system.svc:8443); empty reads the master Secrets with the API credentials instead (needs get on Secrets in --auth-namespace)")
	f.StringVar(&k.caFile, "key-server-ca-file", defaultKeyServerCAFile, "PEM certificate the key server's must chain to (the ConfigMap plinth-key-server-ca)")
	f.StringVar(&k.caConfigMap, "key-server-ca-configmap", "plinth-system/"+nvmeauth.CAConfigMapName, "namespace/name of the ConfigMap the controller publishes the key server's certificate in, read through the API while --key-server-ca-file is not filled yet (kubelet fills an optional ConfigMap volume only at a later Pod sync); empty reads the file only")
	f.StringVar(&k.tokenFile, "key-server-token-file", defaultKeyServerTokenFile, "service-account token of audience "+hostkeys.Audience+" bound to this Pod, re-read at every request")
}

// source returns the key server client, or nil without --key-server. With cfg (the API
// credentials) and --key-server-ca-configmap, the CA is read from the ConfigMap while the
// mounted file is not filled yet (hostkeys.FileOrAPI).
func (k *keyServerFlags) source(cfg *rest.Config) (hostkeys.Source, error) {
	if k.url == "" {
		return nil, nil
	}
	ca := hostkeys.FileReader(k.caFile)
	if cfg != nil && k.caConfigMap != "" {
		ns, name, ok := strings.Cut(k.caConfigMap, "/")
		if !ok || ns == "" || name == "" {
			return nil, fmt.Errorf("--key-server-ca-configmap %q: want namespace/name", k.caConfigMap)
		}
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return nil, err
		}
		ca = hostkeys.FileOrAPI(k.caFile, hostkeys.CAConfigMap{Namespace: ns, Name: name, Key: nvmeauth.CAKey,
			Get: func(ctx context.Context, ns, name string) (map[string]string, error) {
				cm, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
				if err != nil {
					return nil, err
				}
				return cm.Data, nil
			}})
	}
	return &hostkeys.Client{URL: k.url, CA: ca, Token: hostkeys.TokenFile(k.tokenFile)}, nil
}
