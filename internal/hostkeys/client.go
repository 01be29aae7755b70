package hostkeys

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"
)

// Path is the key server's one resource: GET Path?host=<node>&target=<node> answers a Key as
// JSON (200), or a plain-text reason: 400 bad request, 401 no or an invalid token, 403 not this
// caller's pair, 404 no master Secret for the host (docs/design.md#key-distribution).
const Path = "/v1/hostkeys"

// Audience is the token audience the key server asks the TokenReview for: clients present a
// projected service-account token made for it (a token for the API server is refused).
const Audience = "plinth-key-server"

// requestTimeout bounds one request to the key server (the caller's context may be longer).
const requestTimeout = 30 * time.Second

// Client is the Source that asks the controller's key server.
type Client struct {
	// URL is the server's base, "https://plinth-key-server.plinth-system.svc:8443".
	URL string
	// CA returns the PEM certificates the server's certificate must chain to (the ConfigMap
	// plinth-key-server-ca mounted as a file: FileReader). Read at every request, so that a
	// kubelet update of the mount is seen.
	CA func() ([]byte, error)
	// Token returns the bearer token to present: a service-account token bound to the caller's
	// Pod with audience Audience (a projected token file, re-read at every request as kubelet
	// renews it: FileReader).
	Token func() (string, error)

	mu     sync.Mutex
	caPEM  []byte
	client *http.Client
}

// FileReader returns a function that reads path, for Client.CA and, trimmed, Client.Token.
func FileReader(path string) func() ([]byte, error) {
	return func() ([]byte, error) { return os.ReadFile(path) }
}

// TokenFile returns a Client.Token that reads a token file and trims white space.
func TokenFile(path string) func() (string, error) {
	return func() (string, error) {
		b, err := os.ReadFile(path)
		if err != nil {
			return "", fmt.Errorf("key server token: %w", err)
		}
		return strings.TrimSpace(string(b)), nil
	}
}

// httpClient returns the HTTP client for the CA now in place, made anew when it changed.
func (c *Client) httpClient() (*http.Client, error) {
	pem, err := c.CA()
	if err != nil {
		return nil, fmt.Errorf("key server CA: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.client != nil && bytes.Equal(pem, c.caPEM) {
		return c.client, nil
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, errors.New("key server CA: no PEM certificate")
	}
	c.caPEM = pem
	c.client = &http.Client{Timeout: requestTimeout, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13},
		// the server's answer is small and per pair: a few idle connections serve every pair
		MaxIdleConnsPerHost: 2,
		IdleConnTimeout:     90 * time.Second,
	}}
	return c.client, nil
}

// HostKey implements Source: one GET of Path.
func (c *Client) HostKey(ctx context.Context, host, target string) (Key, error) {
	hc, err := c.httpClient()
	if err != nil {
		return Key{}, err
	}
	tok, err := c.Token()
	if err != nil {
		return Key{}, err
	}
	u := strings.TrimSuffix(c.URL, "/") + Path + "?" + url.Values{"host": {host}, "target": {target}}.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return Key{}, fmt.Errorf("key server request: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Accept", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return Key{}, fmt.Errorf("key server: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return Key{}, fmt.Errorf("key server: read the answer: %w", err)
	}
	reason := strings.TrimSpace(string(body))
	if len(reason) > 512 {
		reason = reason[:512]
	}
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound:
		return Key{}, fmt.Errorf("%w (key server %s: %s)", ErrNotFound, c.URL, reason)
	case http.StatusUnauthorized, http.StatusForbidden:
		return Key{}, fmt.Errorf("%w: keys of host %s for target %s (%s: %s)", ErrRefused, host, target, resp.Status, reason)
	case http.StatusUnprocessableEntity:
		return Key{}, fmt.Errorf("%w (key server %s: %s)", ErrUnusable, c.URL, reason)
	default:
		return Key{}, fmt.Errorf("key server %s: %s: %s", c.URL, resp.Status, reason)
	}
	var k Key
	if err := json.Unmarshal(body, &k); err != nil {
		return Key{}, fmt.Errorf("key server %s: an answer that is not a key (%d bytes)", c.URL, len(body))
	}
	return k, nil
}

// CAConfigMap names the ConfigMap the controller publishes the key server's certificate in
// (namespace, name, data key) and reads it: the fallback of FileOrAPI.
type CAConfigMap struct {
	Namespace, Name, Key string
	// Get returns the ConfigMap's data (an error when it is absent or unreadable).
	Get func(ctx context.Context, namespace, name string) (map[string]string, error)
}

// FileOrAPI returns a Client.CA that reads path and, while that file is absent or holds no
// PEM certificate, the ConfigMap cm through the API. kubelet fills an optional ConfigMap
// volume made before its ConfigMap only at a later sync of the Pod (a minute or more: every
// Pod of a fresh install starts before the controller has published the certificate); the API
// has it as soon as the controller wrote it. The file wins once kubelet has filled it (a renewed
// certificate reaches both).
func FileOrAPI(path string, cm CAConfigMap) func() ([]byte, error) {
	return func() ([]byte, error) {
		b, ferr := os.ReadFile(path)
		if ferr == nil && bytes.Contains(b, []byte("-----BEGIN CERTIFICATE-----")) {
			return b, nil
		}
		ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
		defer cancel()
		data, err := cm.Get(ctx, cm.Namespace, cm.Name)
		if err != nil {
			return nil, fmt.Errorf("file %s: %v; ConfigMap %s/%s: %w", path, fileState(b, ferr), cm.Namespace, cm.Name, err)
		}
		pem, ok := data[cm.Key]
		if !ok || pem == "" {
			return nil, fmt.Errorf("file %s: %v; ConfigMap %s/%s has no %q yet", path, fileState(b, ferr), cm.Namespace, cm.Name, cm.Key)
		}
		return []byte(pem), nil
	}
}

func fileState(b []byte, err error) string {
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("%d bytes, no certificate", len(b))
}
