package main

import (
	"github.com/spf13/pflag"

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
type keyServerFlags struct{ url, caFile, tokenFile string }

func (k *keyServerFlags) bind(f *pflag.FlagSet) {
	f.StringVar(&k.url, "key-server", "", "base URL of the controller's DH-HMAC-CHAP key server (e.g. https://plinth-key-server.plinth-system.svc:8443); empty reads the master Secrets with the API credentials instead (needs get on Secrets in --auth-namespace)")
	f.StringVar(&k.caFile, "key-server-ca-file", defaultKeyServerCAFile, "PEM certificate the key server's must chain to (the ConfigMap plinth-key-server-ca)")
	f.StringVar(&k.tokenFile, "key-server-token-file", defaultKeyServerTokenFile, "service-account token of audience "+hostkeys.Audience+" bound to this Pod, re-read at every request")
}

// source returns the key server client, or nil without --key-server.
func (k *keyServerFlags) source() hostkeys.Source {
	if k.url == "" {
		return nil
	}
	return &hostkeys.Client{URL: k.url, CA: hostkeys.FileReader(k.caFile), Token: hostkeys.TokenFile(k.tokenFile)}
}
