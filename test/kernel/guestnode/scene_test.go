package guestnode

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/test/framework/controlplane"
	"github.com/plinth-storage/plinth/test/kernel/guest"
	"github.com/plinth-storage/plinth/test/kernel/netrelay"
)

// scene is what the scenario's steps share: one control plane, the two guest nodes on one
// relay, the registry, and the release helm installed.
type scene struct {
	cs   *kubernetes.Clientset
	c    client.Client
	cp   *controlplane.ControlPlane
	root string
	// work is the test's folder (outlives every step).
	work  string
	nodes []*node
	relay *netrelay.Relay
	// reg is the registry's address on the host (where the test pushes).
	reg string
	// helm, chart and values: the CLI and what HelmInstall installed.
	helm          helm
	chart, values string
	// sum is the sha256 of the data the writer pod wrote on its NVMe-oF volume.
	sum string
	// storageOpts boot the storage guest again (its WorkDir: the same disks); join makes
	// nodes[i]'s booted guest a node.
	storageOpts guest.Options
	join        func(t *testing.T, i int) error
	// policyRepo and policyURL: the policy repository Flux reads (commitPolicy), its folder on
	// the host and its URL.
	policyRepo, policyURL string
	// cleanup registers f to run when the whole test ends (TestGuestKubelet's t.Cleanup): what
	// a step starts for the later steps (the policy repository's Git server) must outlive it.
	cleanup func(f func())
}

func (s *scene) storage() *node { return s.nodes[0] }
func (s *scene) worker() *node  { return s.nodes[1] }

// tick is one write of writerScript's loop: when it began and ended (guest uptime, seconds)
// and its error ("" when it succeeded).
type tick struct {
	start, end float64
	err        string
}

var tickLine = regexp.MustCompile(`(?m)^tick ([0-9.]+) ([0-9.]+) (ok|err.*)$`)

// parseTicks returns the ticks of a writer's log, in order.
func parseTicks(log string) []tick {
	var out []tick
	for _, m := range tickLine.FindAllStringSubmatch(log, -1) {
		a, _ := strconv.ParseFloat(m[1], 64)
		b, _ := strconv.ParseFloat(m[2], 64)
		tk := tick{start: a, end: b}
		if m[3] != "ok" {
			tk.err = strings.TrimSpace(strings.TrimPrefix(m[3], "err"))
		}
		out = append(out, tk)
	}
	return out
}

// ticksBetween returns the ticks that ended after from and began before to (guest uptime).
func ticksBetween(all []tick, from, to float64) []tick {
	var out []tick
	for _, tk := range all {
		if tk.end >= from && tk.start <= to {
			out = append(out, tk)
		}
	}
	return out
}

// longest is the longest write of ticks (seconds), and how many failed.
func longest(ticks []tick) (max float64, failed int) {
	for _, tk := range ticks {
		if d := tk.end - tk.start; d > max {
			max = d
		}
		if tk.err != "" {
			failed++
		}
	}
	return max, failed
}

// podLog returns the current log of pod name in volumeNS.
func (s *scene) podLog(t *testing.T, name string) string {
	t.Helper()
	b, err := s.cs.CoreV1().Pods(volumeNS).GetLogs(name, &corev1.PodLogOptions{}).DoRaw(t.Context())
	if err != nil {
		t.Fatalf("log of %s: %v", name, err)
	}
	return string(b)
}

// uptimeF is the guest's uptime as a number.
func (n *node) uptimeF(t *testing.T) float64 {
	t.Helper()
	f, err := strconv.ParseFloat(n.uptime(t), 64)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// waitTicks waits until the writer's log has a tick that began after from (guest uptime) and
// succeeded, and returns the log's ticks.
func (s *scene) waitTicks(t *testing.T, name string, from float64, timeout time.Duration) []tick {
	t.Helper()
	var ticks []tick
	poll(t, timeout, time.Second, name+" writes again", func() error {
		ticks = parseTicks(s.podLog(t, name))
		for _, tk := range ticks {
			if tk.start > from && tk.err == "" {
				return nil
			}
		}
		return fmt.Errorf("%d ticks, none ok since %.1f", len(ticks), from)
	})
	return ticks
}

// recreate deletes the StatefulSet's pod and waits for its successor to run and print its
// data's sum; it returns that log.
func (s *scene) recreate(t *testing.T) string {
	t.Helper()
	old, err := s.cs.CoreV1().Pods(volumeNS).Get(t.Context(), writerPod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.cs.CoreV1().Pods(volumeNS).Delete(t.Context(), writerPod, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	poll(t, 5*time.Minute, time.Second, "a new "+writerPod, func() error {
		p, err := s.cs.CoreV1().Pods(volumeNS).Get(t.Context(), writerPod, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.UID == old.UID {
			return fmt.Errorf("still the old pod (%s)", p.Status.Phase)
		}
		return nil
	})
	waitRunning(t, s.cs, writerPod)
	return writerLog(t, s.cs, writerPod)
}

// blobSum is the data's sum the writer printed last (after "done" it prints none).
func blobSum(t *testing.T, log string) string {
	t.Helper()
	sums := sumLine.FindAllStringSubmatch(log, -1)
	if len(sums) == 0 {
		t.Fatalf("no sha256 of /data/blob in the log:\n%s", log)
	}
	return sums[len(sums)-1][1]
}
