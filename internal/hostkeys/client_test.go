package hostkeys

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const testPEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"

// Expected: while the mounted file is absent or empty (kubelet has not filled the optional
// ConfigMap volume yet), FileOrAPI reads the ConfigMap through the API, once per call; once
// the file holds a certificate, the file alone; a ConfigMap without the key, or unreadable,
// is an error naming the file's state and the ConfigMap.
func TestFileOrAPIReadsTheConfigMapUntilTheFileIsFilled(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ca.crt")
	gets := 0
	data := map[string]string{}
	var getErr error
	ca := FileOrAPI(path, CAConfigMap{Namespace: "plinth-system", Name: "plinth-key-server-ca", Key: "ca.crt",
		Get: func(_ context.Context, ns, name string) (map[string]string, error) {
			gets++
			if ns != "plinth-system" || name != "plinth-key-server-ca" {
				t.Errorf("get %s/%s", ns, name)
			}
			return data, getErr
		}})

	if _, err := ca(); err == nil || !strings.Contains(err.Error(), `has no "ca.crt" yet`) || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("no file, ConfigMap without the key: %v", err)
	}
	getErr = errors.New("forbidden")
	if _, err := ca(); err == nil || !strings.Contains(err.Error(), "plinth-system/plinth-key-server-ca: forbidden") {
		t.Errorf("no file, ConfigMap unreadable: %v", err)
	}
	getErr = nil
	data["ca.crt"] = testPEM
	if err := os.WriteFile(path, nil, 0o644); err != nil { // kubelet's empty optional volume
		t.Fatal(err)
	}
	if b, err := ca(); err != nil || string(b) != testPEM {
		t.Errorf("empty file, ConfigMap filled: %q, %v", b, err)
	}
	if gets != 3 {
		t.Errorf("%d ConfigMap reads, want 3", gets)
	}
	if err := os.WriteFile(path, []byte(testPEM+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := ca(); err != nil || string(b) != testPEM+"\n" {
		t.Errorf("file filled: %q, %v", b, err)
	}
	if gets != 3 {
		t.Errorf("%d ConfigMap reads after the file was filled, want still 3", gets)
	}
}
