package apimux

import (
	"net/url"
	"testing"
)

// StartForTest starts a Demux in front of the API server at apiURL (a
// controlplane URL, https://127.0.0.1:PORT: its host:port is the backend)
// and closes it at t's cleanup. It fails t when apiURL does not parse or
// Start fails.
func StartForTest(t testing.TB, apiURL string) *Demux {
	t.Helper()
	u, err := url.Parse(apiURL)
	if err != nil {
		t.Fatalf("apimux: API server URL: %v", err)
	}
	d, err := Start(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}
