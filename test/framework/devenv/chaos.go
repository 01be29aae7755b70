package devenv

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/test/framework/cluster"
)

// Randomized faults with invariants on the real nodes: a pod writes checksummed records to its
// PVC while a seeded driver injects faults one at a time, checking after each that nothing a
// user relies on broke. The seed is printed in the step's title and replays the same sequence
// of faults (the timing of the cluster around them is not replayed).
const (
	// EnvChaosSeed replays a run: the seed of the fault sequence (a decimal int64); unset, the
	// seed is taken from the clock and printed.
	EnvChaosSeed = "PLINTH_CHAOS_SEED"
	// EnvChaosSteps is the number of faults of a run (a positive integer); unset, the caller's
	// default (test/e2e: a short run).
	EnvChaosSteps = "PLINTH_CHAOS_STEPS"
	// EnvChaosDuration makes a run last a time rather than a number of faults (a Go duration,
	// e.g. 30m): faults go on until it has passed since the first. The summary prints the
	// number of faults made: that number with the seed (EnvChaosSteps) replays the sequence.
	EnvChaosDuration = "PLINTH_CHAOS_DURATION"
	// ChaosClaim names the PVC and the writer pod of the run.
	ChaosClaim = "chaos-data"

	// chaosWriterScript appends 16 KiB records of random data to /data, each made durable
	// (written, fsynced, the folder synced) before its checksum is printed as "ACK <n> <sha256>":
	// a printed ACK is an acknowledged write. Numbering goes on from the records present, so a
	// restarted container does not overwrite acknowledged ones.
	chaosWriterScript = `cd /data || exit 1
i=$(ls | grep -c '^rec-')
while :; do
  i=$((i+1))
  dd if=/dev/urandom of=rec-$i bs=16k count=1 conv=fsync 2>/dev/null && sync || exit 1
  echo "ACK $i $(sha256sum rec-$i | cut -d' ' -f1)"
  sleep 0.2
done`
)

// ChaosOptions says how long a run is and which sequence of faults it injects.
type ChaosOptions struct {
	// Seed of the fault sequence.
	Seed int64
	// Steps is the number of faults (when Duration is 0).
	Steps int
	// Duration, when positive, is how long faults go on (from the first one); Steps is then
	// not used.
	Duration time.Duration
}

// ChaosOptionsFromEnv reads EnvChaosSeed, EnvChaosSteps and EnvChaosDuration; defaultSteps
// applies when EnvChaosSteps is unset. A malformed value is an error naming the variable.
func ChaosOptionsFromEnv(defaultSteps int) (ChaosOptions, error) {
	o := ChaosOptions{Seed: time.Now().UnixNano(), Steps: defaultSteps}
	if v := os.Getenv(EnvChaosSeed); v != "" {
		s, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return o, fmt.Errorf("%s=%q: want a decimal int64: %w", EnvChaosSeed, v, err)
		}
		o.Seed = s
	}
	if v := os.Getenv(EnvChaosSteps); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return o, fmt.Errorf("%s=%q: want a positive number of faults", EnvChaosSteps, v)
		}
		o.Steps = n
	}
	if v := os.Getenv(EnvChaosDuration); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return o, fmt.Errorf("%s=%q: want a positive duration such as 30m", EnvChaosDuration, v)
		}
		o.Duration = d
	}
	return o, nil
}

// String says how long a run is and how to replay it.
func (o ChaosOptions) String() string {
	if o.Duration > 0 {
		return fmt.Sprintf("seed %d, faults for %s (replay: %s=%d %s=<the number of faults made>)", o.Seed, o.Duration, EnvChaosSeed, o.Seed, EnvChaosSteps)
	}
	return fmt.Sprintf("seed %d, %d faults (replay: %s=%d %s=%d)", o.Seed, o.Steps, EnvChaosSeed, o.Seed, EnvChaosSteps, o.Steps)
}

// more says whether a run of o goes on to fault step (1-based), begun at begin.
func (o ChaosOptions) more(step int, begin time.Time) bool {
	if o.Duration > 0 {
		return step == 1 || time.Since(begin) < o.Duration
	}
	return step <= o.Steps
}

// ChaosSummary is what a run did.
type ChaosSummary struct {
	// Faults lists the faults injected, in order.
	Faults []string
	// Acked is the number of acknowledged writes checked, over every incarnation of the claim.
	Acked int
	// Claims is the number of incarnations of the claim (one, plus one per recreation).
	Claims int
	// Elapsed is the time from the first fault to the last one's checks.
	Elapsed time.Duration
}

// chaosFault is one kind of fault: what it does, on which node the writer runs.
type chaosFault struct {
	name string
	do   func(ctx context.Context, node string) (string, error)
}

// Chaos runs o.Steps faults (or faults for o.Duration) chosen by o.Seed among: the agent or the CSI node plugin of the
// writer's node killed (pod deleted with no grace period), the CSI controller or the policy
// controller killed, the claim deleted and created again. After each fault it checks the
// invariants: every write the writer acknowledged reads back with its checksum (from the
// volume's current incarnation); the writer acknowledges new writes (within a minute); the
// claim's VolumeState, every Store and every Plinth pod are Ready again (bounded). The kubelet
// or containerd of the writer's node killed and started again (cluster.RestartKubelet,
// RestartContainerd) are faults too: the writer's pod must go on acknowledging writes through
// both, as a pod does on a node whose kubelet or containerd service restarts. At the end the
// claim is deleted: its PV, VolumeState, file and loop device go, and no mount of the writer's
// pod is left on its node.
func (e *Walk) Chaos(ctx context.Context, o ChaosOptions) (*ChaosSummary, error) {
	sum := &ChaosSummary{}
	title := fmt.Sprintf("randomized faults: %s while %s writes checksummed records → no acknowledged write lost, all Ready, nothing leaked",
		o, ChaosClaim)
	return sum, e.step(title, []string{"agent", "csi-controller", "csi-node", "controller"}, func() (string, error) {
		rng := rand.New(rand.NewSource(o.Seed))
		id, node, err := e.chaosClaim(ctx)
		if err != nil {
			return "", err
		}
		sum.Claims = 1
		kill := func(component string, onNode bool) func(context.Context, string) (string, error) {
			return func(ctx context.Context, node string) (string, error) {
				where := ""
				if onNode {
					where = node
				}
				return e.killPlinthPod(ctx, component, where)
			}
		}
		faults := []chaosFault{
			{"kill the agent of the writer's node", kill("agent", true)},
			{"kill the CSI node plugin of the writer's node", kill("csi-node", true)},
			{"kill the CSI controller", kill("csi-controller", false)},
			{"kill the policy controller", kill("controller", false)},
			{"kill the kubelet of the writer's node and start it again", e.restartNodeService("kubelet", e.Nodes.RestartKubelet)},
			{"kill containerd of the writer's node and start it again", e.restartNodeService("containerd", e.Nodes.RestartContainerd)},
			{"delete and recreate the claim", func(ctx context.Context, _ string) (string, error) {
				n, err := e.chaosAcked(ctx, 0)
				if err != nil {
					return "", err
				}
				sum.Acked += n
				if err := e.unclaim(ctx, ChaosClaim, id); err != nil {
					return "", fmt.Errorf("claim deleted: %w", err)
				}
				if id, node, err = e.chaosClaim(ctx); err != nil {
					return "", err
				}
				sum.Claims++
				return fmt.Sprintf("%d acknowledged writes verified, the claim deleted (PV, VolumeState, file, loop device gone) and made again: %s on %s", n, id, node), nil
			}},
		}
		lines := []string{fmt.Sprintf("seed %d; the writer %s on %s, volume %s", o.Seed, ChaosClaim, node, id)}
		begin := time.Now()
		for step := 1; o.more(step, begin); step++ {
			f := faults[rng.Intn(len(faults))]
			before, err := e.chaosAcked(ctx, 0)
			if err != nil {
				return "", fmt.Errorf("before fault %d: %w", step, err)
			}
			what, err := f.do(ctx, node)
			if err != nil {
				return "", fmt.Errorf("fault %d (%s, seed %d): %w", step, f.name, o.Seed, err)
			}
			sum.Faults = append(sum.Faults, f.name)
			if f.name == faults[len(faults)-1].name {
				before = 0 // a new volume: its writes start again
			}
			acked, err := e.chaosAcked(ctx, before+1)
			if err != nil {
				return "", fmt.Errorf("after fault %d (%s, seed %d): %w", step, f.name, o.Seed, err)
			}
			if err := e.chaosConverged(ctx, id); err != nil {
				return "", fmt.Errorf("after fault %d (%s, seed %d): %w", step, f.name, o.Seed, err)
			}
			lines = append(lines, fmt.Sprintf("%d. %s: %s; %d acknowledged writes read back, all Ready", step, f.name, what, acked))
		}
		sum.Elapsed = time.Since(begin)
		lines = append(lines, fmt.Sprintf("%d faults in %s (replay: %s=%d %s=%d)", len(sum.Faults), sum.Elapsed.Round(time.Second), EnvChaosSeed, o.Seed, EnvChaosSteps, len(sum.Faults)))
		n, err := e.chaosAcked(ctx, 0)
		if err != nil {
			return "", err
		}
		sum.Acked += n
		var pod corev1.Pod
		if err := e.Client.Get(ctx, client.ObjectKey{Namespace: QuickstartNamespace, Name: ChaosClaim}, &pod); err != nil {
			return "", err
		}
		if err := e.unclaim(ctx, ChaosClaim, id); err != nil {
			return "", fmt.Errorf("clean-up: %w", err)
		}
		if err := e.noPodMounts(ctx, &pod); err != nil {
			return "", fmt.Errorf("clean-up: %w", err)
		}
		lines = append(lines, fmt.Sprintf("clean-up: the claim deleted → PV, VolumeState, file, loop device and the pod's mounts gone; %d acknowledged writes verified over %d claims", sum.Acked, sum.Claims))
		return strings.Join(lines, "\n"), nil
	})
}

// chaosClaim claims ChaosClaim (1Gi of the quickstart class) with the writer pod and waits
// until it writes; it returns the volume id and the writer's node.
func (e *Walk) chaosClaim(ctx context.Context) (id, node string, err error) {
	class := QuickstartClass
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: ChaosClaim, Namespace: QuickstartNamespace},
		Spec: corev1.PersistentVolumeClaimSpec{
			StorageClassName: &class,
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	}
	if err := e.Client.Create(ctx, pvc); err != nil {
		return "", "", err
	}
	pod := quickstartPod()
	pod.Name = ChaosClaim
	pod.Spec.Volumes[0].PersistentVolumeClaim.ClaimName = ChaosClaim
	pod.Spec.Containers[0].Command = []string{"sh", "-c", chaosWriterScript}
	if err := e.Client.Create(ctx, pod); err != nil {
		return "", "", err
	}
	if _, err := e.waitBound(ctx, ChaosClaim, 4*time.Minute); err != nil {
		return "", "", err
	}
	if err := e.Client.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
		return "", "", err
	}
	if _, id, err = e.volumeOf(ctx, ChaosClaim); err != nil {
		return "", "", err
	}
	if _, err := e.waitVolumeReady(ctx, id); err != nil {
		return "", "", err
	}
	if _, err := e.chaosAcked(ctx, 1); err != nil {
		return "", "", err
	}
	return id, pod.Spec.NodeName, nil
}

var ackRE = regexp.MustCompile(`(?m)^ACK (\d+) ([0-9a-f]{64})$`)

// chaosAcked reads the writer's acknowledgements (its log) and then the checksums of its
// records on the volume: every acknowledged record must read back with its checksum. It polls
// (a minute) until at least `least` records are acknowledged, and returns their number.
func (e *Walk) chaosAcked(ctx context.Context, least int) (int, error) {
	var acked int
	err := poll(ctx, time.Minute, func() error {
		logs, err := e.KubectlRun(ctx, "logs", "-n", QuickstartNamespace, ChaosClaim)
		if err != nil {
			return err
		}
		if n := len(ackRE.FindAllString(logs, -1)); n < least {
			return fmt.Errorf("%d writes acknowledged, want at least %d: the writer does not write", n, least)
		}
		out, err := e.KubectlRun(ctx, "exec", "-n", QuickstartNamespace, ChaosClaim, "--", "sh", "-c", "cd /data && sha256sum rec-*")
		if err != nil && ackRE.MatchString(logs) {
			return err // no record on the volume is an error only once one was acknowledged
		}
		n, err := verifyAcks(logs, out)
		if err != nil {
			return err
		}
		acked = n
		return nil
	})
	return acked, err
}

// verifyAcks checks the writer's acknowledgements (logs: "ACK <n> <sha256>" lines) against the
// checksums read on the volume (sums: sha256sum's "<sha256>  rec-<n>" lines): every
// acknowledged record must be there with its checksum. It returns the number acknowledged.
func verifyAcks(logs, sums string) (int, error) {
	acks := map[string]string{}
	for _, m := range ackRE.FindAllStringSubmatch(logs, -1) {
		acks["rec-"+m[1]] = m[2]
	}
	onDisk := map[string]string{}
	for _, l := range strings.Split(sums, "\n") {
		if f := strings.Fields(l); len(f) == 2 {
			onDisk[f[1]] = f[0]
		}
	}
	var lost []string
	for rec, want := range acks {
		if got, ok := onDisk[rec]; !ok {
			lost = append(lost, rec+" missing")
		} else if got != want {
			lost = append(lost, fmt.Sprintf("%s reads %s, acknowledged %s", rec, got, want))
		}
	}
	if len(lost) > 0 {
		sort.Strings(lost)
		return 0, fmt.Errorf("acknowledged writes lost: %s", strings.Join(lost, "; "))
	}
	return len(acks), nil
}

// chaosConverged waits (three minutes) until the VolumeState id, every Store and every Plinth
// pod are Ready.
func (e *Walk) chaosConverged(ctx context.Context, id string) error {
	return poll(ctx, 3*time.Minute, func() error {
		var vs storev1.VolumeState
		if err := e.Client.Get(ctx, client.ObjectKey{Name: id}, &vs); err != nil {
			return err
		}
		if vs.Status.Phase != storev1.VolumeReady {
			return fmt.Errorf("VolumeState %s phase %s", id, vs.Status.Phase)
		}
		var stores storev1.StoreList
		if err := e.Client.List(ctx, &stores); err != nil {
			return err
		}
		for _, s := range stores.Items {
			if !apimeta.IsStatusConditionTrue(s.Status.Conditions, storev1.ConditionReady) {
				return fmt.Errorf("Store %s not Ready: %+v", s.Name, s.Status.Conditions)
			}
		}
		var pods corev1.PodList
		if err := e.Client.List(ctx, &pods, client.InNamespace(ControllerNamespace)); err != nil {
			return err
		}
		for i := range pods.Items {
			p := &pods.Items[i]
			if !podReady(p) {
				return fmt.Errorf("pod %s/%s on %s not Ready: %s", p.Namespace, p.Name, p.Spec.NodeName, podWhy(p))
			}
		}
		return nil
	})
}

func podReady(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// killPlinthPod deletes, with no grace period (as a kill), the Plinth pod of component (on
// node, when node is set) and waits until its replacement is Ready.
func (e *Walk) killPlinthPod(ctx context.Context, component, node string) (string, error) {
	var pods corev1.PodList
	if err := e.Client.List(ctx, &pods, client.InNamespace(ControllerNamespace), client.MatchingLabels{"app.kubernetes.io/component": component}); err != nil {
		return "", err
	}
	var victim *corev1.Pod
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.DeletionTimestamp == nil && (node == "" || p.Spec.NodeName == node) {
			victim = p
			break
		}
	}
	if victim == nil {
		return "", fmt.Errorf("no %s pod (node %q) to kill", component, node)
	}
	zero := int64(0)
	start := time.Now()
	if err := e.Client.Delete(ctx, victim, &client.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		return "", err
	}
	old := map[types.UID]bool{victim.UID: true}
	err := poll(ctx, 3*time.Minute, func() error {
		var now corev1.PodList
		if err := e.Client.List(ctx, &now, client.InNamespace(ControllerNamespace), client.MatchingLabels{"app.kubernetes.io/component": component}); err != nil {
			return err
		}
		for i := range now.Items {
			p := &now.Items[i]
			if !old[p.UID] && (node == "" || p.Spec.NodeName == node) && podReady(p) {
				return nil
			}
		}
		return fmt.Errorf("no new Ready %s pod (node %q) yet", component, node)
	})
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("pod %s killed, replaced and Ready after %.1fs", victim.Name, time.Since(start).Seconds()), nil
}

// restartNodeService returns the fault that kills a node service (SIGKILL) through restart and
// starts it again; the new process is added to the PID log that clean-up after a crashed run
// reads.
func (e *Walk) restartNodeService(what string, restart func(context.Context, string, bool) error) func(context.Context, string) (string, error) {
	return func(ctx context.Context, node string) (string, error) {
		start := time.Now()
		if err := restart(ctx, node, true); err != nil {
			return "", err
		}
		e.logNodePIDs()
		return fmt.Sprintf("%s of %s killed and started again in %.1fs", what, node, time.Since(start).Seconds()), nil
	}
}

// noPodMounts checks that nothing of the deleted pod stays mounted on its node.
func (e *Walk) noPodMounts(ctx context.Context, pod *corev1.Pod) error {
	n := e.Nodes.Node(pod.Spec.NodeName)
	if n == nil {
		return fmt.Errorf("pod %s on unknown node %q", pod.Name, pod.Spec.NodeName)
	}
	return poll(ctx, time.Minute, func() error {
		m, err := cluster.MountsUnder(podCSIDir(n, pod.UID))
		if err != nil {
			return err
		}
		if len(m) > 0 {
			return fmt.Errorf("mounts of the deleted pod %s (%s) left on %s: %v", pod.Name, pod.UID, n.Name, m)
		}
		return nil
	})
}
