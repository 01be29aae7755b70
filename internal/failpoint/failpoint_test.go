package failpoint

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		spec    string
		want    map[string]Action
		wantErr string
	}{
		{spec: "", want: map[string]Action{}},
		{spec: " agent.volume.created=once , file.create.sized=exit", want: map[string]Action{AgentVolumeCreated: Once, FileCreateSized: Exit}},
		{spec: "agent.volume.created", wantErr: "want name=action"},
		{spec: "agent.volume.made=exit", wantErr: `unknown point "agent.volume.made"; known: agent.delete.mark-released`},
		{spec: "agent.volume.created=panic", wantErr: `unknown action "panic"`},
	} {
		t.Run(tc.spec, func(t *testing.T) {
			got, err := Parse(tc.spec)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want it to contain %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || len(got) != len(tc.want) {
				t.Fatalf("%v %v, want %v", got, err, tc.want)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Errorf("%s: %q, want %q", k, got[k], v)
				}
			}
		})
	}
}

// exits counts the exits a Hit asked for instead of ending the test binary.
func exits(t *testing.T) *int {
	n := 0
	exit = func(code int) {
		if code != ExitCode {
			t.Errorf("exit code %d, want %d", code, ExitCode)
		}
		n++
	}
	t.Cleanup(func() {
		exit = os.Exit
		if _, err := Configure("", ""); err != nil {
			t.Error(err)
		}
	})
	return &n
}

func TestOnceExitsOncePerFolder(t *testing.T) {
	n := exits(t)
	dir := filepath.Join(t.TempDir(), "failpoints")
	names, err := Configure(AgentVolumeCreated+"=once", dir)
	if err != nil || len(names) != 1 || names[0] != AgentVolumeCreated {
		t.Fatalf("Configure: %v %v", names, err)
	}
	Hit(FileCreateSized) // not armed
	Hit(AgentVolumeCreated)
	Hit(AgentVolumeCreated)
	if *n != 1 {
		t.Fatalf("%d exits, want 1", *n)
	}
	// a restart: same environment, same folder
	if _, err := Configure(AgentVolumeCreated+"=once", dir); err != nil {
		t.Fatal(err)
	}
	Hit(AgentVolumeCreated)
	if *n != 1 {
		t.Fatalf("%d exits after the restart, want still 1", *n)
	}
	if _, err := os.Stat(filepath.Join(dir, AgentVolumeCreated+".hit")); err != nil {
		t.Errorf("marker: %v", err)
	}
}

func TestExitEveryHit(t *testing.T) {
	n := exits(t)
	if _, err := Configure(FencingMarkTorn+"=exit", ""); err != nil {
		t.Fatal(err)
	}
	Hit(FencingMarkTorn)
	Hit(FencingMarkTorn)
	if *n != 2 {
		t.Fatalf("%d exits, want 2", *n)
	}
}

func TestOnceNeedsFolder(t *testing.T) {
	if _, err := Configure(FencingMarkTorn+"=once", ""); err == nil || !strings.Contains(err.Error(), "folder") {
		t.Fatalf("error %v", err)
	}
}

func TestEnableRunsFunc(t *testing.T) {
	calls := 0
	disable := Enable(CSIPublishBeforeUpdate, func() { calls++ })
	Hit(CSIPublishBeforeUpdate)
	Hit(AgentMarkSaved)
	disable()
	Hit(CSIPublishBeforeUpdate)
	if calls != 1 {
		t.Fatalf("%d calls, want 1", calls)
	}
}
