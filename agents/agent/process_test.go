package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2/textlogger"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/plinth-storage/plinth/agents/agent"
	"github.com/plinth-storage/plinth/internal/failpoint"
)

// processEnv carries a processSpec (JSON) to a copy of this test binary that
// runs the agent instead of the tests: a crash point then ends a real process
// (os.Exit, no deferred cleanup), as a kill at that step would.
const processEnv = "PLINTH_TEST_AGENT_PROCESS"

// processSpec is what the agent process runs with.
type processSpec struct {
	Kubeconfig, NodeName, StateDir, HostNQNFile, SysRoot, NVMetRoot string
	RefreshInterval                                                 time.Duration
}

func TestMain(m *testing.M) {
	if spec := os.Getenv(processEnv); spec != "" {
		os.Exit(runAgentProcess(spec))
	}
	os.Exit(m.Run())
}

// runAgentProcess is the main of the agent process: agent.Run until SIGTERM.
func runAgentProcess(raw string) int {
	var spec processSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", processEnv, err)
		return 1
	}
	ctrl.SetLogger(textlogger.NewLogger(textlogger.NewConfig(textlogger.Verbosity(1))))
	cfg, err := clientcmd.BuildConfigFromFlags("", spec.Kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cfg.QPS, cfg.Burst = 50, 100
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	err = agent.Run(ctx, cfg, agent.Options{
		NodeName: spec.NodeName, StateDir: spec.StateDir, RefreshInterval: spec.RefreshInterval,
		MetricsAddr: "0", ProbeAddr: "0", Version: "v-test",
		HostNQNFile: spec.HostNQNFile, SysRoot: spec.SysRoot, NVMetRoot: spec.NVMetRoot,
	})
	if err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// agentProcess is one agent running as a child process.
type agentProcess struct {
	t    *testing.T
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	code int
}

// startProcess runs the agent of spec in a child process; failpoints is the
// value of PLINTH_FAILPOINTS ("" arms nothing). Its log goes to a file
// printed when the test fails.
func startProcess(t *testing.T, spec processSpec, failpoints string) *agentProcess {
	t.Helper()
	raw, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	logf, err := os.CreateTemp(t.TempDir(), "agent-*.log")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, "-test.run=^$")
	cmd.Env = append(os.Environ(), processEnv+"="+string(raw), failpoint.Env+"="+failpoints)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &agentProcess{t: t, cmd: cmd, log: logf.Name(), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		defer logf.Close()
		err := cmd.Wait()
		var ee *exec.ExitError
		switch {
		case err == nil:
		case errors.As(err, &ee):
			p.code = ee.ExitCode()
		default:
			p.code = -1
		}
	}()
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			b, _ := os.ReadFile(p.log)
			t.Logf("agent process log (%s=%q):\n%s", failpoint.Env, failpoints, tail(string(b), 60))
		}
	})
	return p
}

// waitExit waits for the process to end on its own and returns its exit code.
func (p *agentProcess) waitExit(timeout time.Duration) int {
	p.t.Helper()
	select {
	case <-p.done:
		return p.code
	case <-time.After(timeout):
		p.t.Fatalf("agent process still running after %s", timeout)
		return 0
	}
}

// stop ends the process with SIGTERM (SIGKILL when it does not stop in 30 s).
func (p *agentProcess) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
}

// logText returns the process's log so far.
func (p *agentProcess) logText() string {
	b, _ := os.ReadFile(p.log)
	return string(b)
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
