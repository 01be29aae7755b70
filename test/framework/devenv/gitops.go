package devenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/test/framework/controlplane"
)

// The policy changes the scenario commits.
const (
	// ExtraPlacement is the placement the change commit adds (StorageClass ExtraClass).
	ExtraPlacement = "scratch"
	// ExtraClass is the StorageClass of ExtraPlacement.
	ExtraClass = "plinth-scratch"
	// InvalidPlacement is the name of the placement of the invalid commit: a dot is valid in a
	// Kubernetes object name, so the API server accepts it, but Plinth's CUE schema requires a
	// DNS-1123 label (names derived from it must fit label values).
	InvalidPlacement = "dev.xfs"

	extraPlacementYAML = `# Scratch space: volumes spread over the pool's nodes, not expandable.
apiVersion: policy.plinth.dev/v1alpha1
kind: Placement
metadata:
  name: scratch
spec:
  poolRef: {name: dev}
  protocolRef: {name: local}
  storageClass:
    name: plinth-scratch
    reclaimPolicy: Delete
    volumeBindingMode: WaitForFirstConsumer
    allowVolumeExpansion: false
  filesystem:
    fsType: ext4
  strategy: Spreadout
`
	invalidPlacementYAML = `# Invalid: a placement name must be a DNS-1123 label (no dots).
apiVersion: policy.plinth.dev/v1alpha1
kind: Placement
metadata:
  name: dev.xfs
spec:
  poolRef: {name: dev}
  protocolRef: {name: local}
  storageClass:
    name: plinth-dev-xfs
  filesystem:
    fsType: xfs
`
)

// agentAndCSI are the components (app.kubernetes.io/component) whose logs explain a volume step.
var agentAndCSI = []string{"agent", "csi-controller", "csi-node"}

// step runs f as a reported step; on failure it remembers the components
// whose log tails explain it.
func (e *Walk) step(title string, components []string, f func() (string, error)) error {
	err := e.rep.run(title, f)
	if err != nil {
		e.failed = components
	}
	return err
}

// placement reads a Placement as unstructured (conditions by type).
func (e *Walk) placement(ctx context.Context, name string) (*unstructured.Unstructured, error) {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(policyKinds[2])
	err := e.Client.Get(ctx, client.ObjectKey{Name: name}, u)
	return u, err
}

// CorrectDrift commits driftPolicy: Correct on the pool and shows Plinth
// revert the hand edit of HandDrift: the StorageClass gets its policy value
// back and the Placement says Drifted=False (DriftCorrected).
func (e *Walk) CorrectDrift(ctx context.Context, sum *Summary) error {
	return e.step(e.verb()+" driftPolicy: Correct on the pool → Plinth reverts the hand edit", []string{BinKustomizeController, "controller"}, func() (string, error) {
		set := e.delivered.clone()
		if err := set.edit("pool.yaml", "driftPolicy: Report", "driftPolicy: Correct"); err != nil {
			return "", err
		}
		start := time.Now()
		// Not waiting for Flux's verdict first: its health checks take ~5s, the correction less.
		shown, err := e.deliver(ctx, "dev pool: correct drift", set, false)
		if err != nil {
			return "", err
		}
		var msg string
		err = poll(ctx, 2*time.Minute, func() error {
			var sc storagev1.StorageClass
			if err := e.Client.Get(ctx, client.ObjectKey{Name: QuickstartClass}, &sc); err != nil {
				return err
			}
			if sc.AllowVolumeExpansion == nil || !*sc.AllowVolumeExpansion {
				return fmt.Errorf("StorageClass %s allowVolumeExpansion still %v", QuickstartClass, deref(sc.AllowVolumeExpansion))
			}
			u, err := e.placement(ctx, QuickstartPlacement)
			if err != nil {
				return err
			}
			s, r, m := conditionOf(u, "Drifted")
			if s != "False" {
				return fmt.Errorf("Placement %s Drifted=%q %s", QuickstartPlacement, s, m)
			}
			msg = r + ": " + m
			return nil
		})
		sum.DriftCorrected = time.Since(start)
		if err != nil {
			return "", err
		}
		if e.Opts.Flux {
			rev, verdict, err := e.waitKustomization(ctx, 3*time.Minute, true)
			if err != nil {
				return "", err
			}
			shown += fmt.Sprintf("\nKustomization %s/%s at %s after %.1fs: %s", FluxNamespace, fluxRepoName, rev, time.Since(start).Seconds(), verdict)
		}
		return fmt.Sprintf("%s\nStorageClass %s allowVolumeExpansion true again; Placement %s Drifted=False (%s) %.1fs after the %s",
			shown, QuickstartClass, QuickstartPlacement, msg, sum.DriftCorrected.Seconds(), e.verb()), nil
	})
}

// storeAllocatable returns the allocatable bytes of the quickstart Store of
// the pod's node (-1 when not reported).
func (e *Walk) storeAllocatable(ctx context.Context) (int64, error) {
	var st storev1.Store
	if err := e.Client.Get(ctx, client.ObjectKey{Name: storev1.StoreName(QuickstartPool, e.node)}, &st); err != nil {
		return 0, err
	}
	if st.Status.Capacity == nil {
		return -1, nil
	}
	return st.Status.Capacity.Allocatable, nil
}

// ChangePolicy commits one change of two edits — the pool's reserve 1Gi →
// 2Gi and a new placement (ExtraPlacement) — and shows it reconciled through
// Flux and Plinth: every policy Ready, the new StorageClass rendered, and the
// Store's allocatable capacity 1Gi lower once the agent has re-measured.
func (e *Walk) ChangePolicy(ctx context.Context, sum *Summary) error {
	return e.step(e.verb()+": reserve 1Gi → 2Gi and a new placement "+ExtraPlacement+" → reconciled", []string{BinKustomizeController, "controller", "agent"}, func() (string, error) {
		before, err := e.storeAllocatable(ctx)
		if err != nil {
			return "", err
		}
		set := e.delivered.clone()
		if err := set.edit("pool.yaml", "reserve: 1Gi", "reserve: 2Gi"); err != nil {
			return "", err
		}
		set["placement-"+ExtraPlacement+".yaml"] = []byte(extraPlacementYAML)
		start := time.Now()
		shown, err := e.deliver(ctx, "dev pool: reserve 2Gi; placement scratch", set, true)
		if err != nil {
			return "", err
		}
		sum.ChangeReady = e.policyReady
		ready, err := e.waitPolicyReady(ctx, 2*time.Minute, ExtraPlacement)
		if err != nil {
			return "", err
		}
		var sc storagev1.StorageClass
		if err := poll(ctx, time.Minute, func() error { return e.Client.Get(ctx, client.ObjectKey{Name: ExtraClass}, &sc) }); err != nil {
			return "", err
		}
		var after int64
		if err := poll(ctx, time.Minute, func() error {
			if after, err = e.storeAllocatable(ctx); err != nil {
				return err
			}
			if before-after != 1<<30 {
				return fmt.Errorf("Store allocatable %s, was %s: want 1Gi less", bytesStr(after), bytesStr(before))
			}
			return nil
		}); err != nil {
			return "", err
		}
		capacityAfter := time.Since(start)
		return fmt.Sprintf("%s\n%s\nStorageClass %s rendered; Store allocatable %s → %s (%.1fs after the %s)",
			shown, ready, ExtraClass, bytesStr(before), bytesStr(after), capacityAfter.Seconds(), e.verb()), nil
	})
}

// InvalidPolicy commits a placement the CUE schema rejects and shows it
// Stalled with the schema's message (and, with Flux, the Kustomization's
// failed health check), nothing of the set applied, and the running volume
// untouched: its VolumeState still Ready, its file and its StorageClass still
// there, the published mount still readable. The commit is then reverted in
// Git and the policy is Ready again.
func (e *Walk) InvalidPolicy(ctx context.Context, sum *Summary) error {
	return e.step(e.verb()+" an invalid placement → Stalled with the CUE message; the running volume untouched; revert", []string{BinKustomizeController, "controller"}, func() (string, error) {
		good := e.delivered.clone()
		bad := good.clone()
		bad["placement-invalid.yaml"] = []byte(invalidPlacementYAML)
		fiBefore, err := os.Stat(sum.VolumeFile)
		if err != nil {
			return "", err
		}
		start := time.Now()
		shown, err := e.deliver(ctx, "placement dev.xfs (invalid name)", bad, false)
		if err != nil {
			return "", err
		}
		var stalled string
		if err := poll(ctx, 2*time.Minute, func() error {
			u, err := e.placement(ctx, InvalidPlacement)
			if err != nil {
				return err
			}
			s, r, m := conditionOf(u, "Stalled")
			if s != "True" {
				return fmt.Errorf("Placement %s Stalled=%q", InvalidPlacement, s)
			}
			stalled = r + ": " + m
			return nil
		}); err != nil {
			return "", err
		}
		sum.Rejected = time.Since(start)
		if !strings.Contains(stalled, "DNS-1123") {
			return "", fmt.Errorf("Placement %s Stalled without the schema's message: %s", InvalidPlacement, stalled)
		}
		if e.Opts.Flux {
			// Flux's health checks see the Stalled placement and fail the Kustomization.
			rev, verdict, err := e.waitKustomization(ctx, 3*time.Minute, false)
			if err != nil {
				return "", err
			}
			shown += fmt.Sprintf("\nKustomization %s/%s at %s after %.1fs: %s", FluxNamespace, fluxRepoName, rev, time.Since(start).Seconds(), verdict)
		}
		// The rest of the set is not applied while one document is invalid; what runs stays.
		u, err := e.placement(ctx, QuickstartPlacement)
		if err != nil {
			return "", err
		}
		_, r, m := conditionOf(u, "Ready")
		others := fmt.Sprintf("Placement %s: %s: %s", QuickstartPlacement, r, m)
		var vs storev1.VolumeState
		if err := e.Client.Get(ctx, client.ObjectKey{Name: sum.VolumeID}, &vs); err != nil {
			return "", err
		}
		if vs.Status.Phase != storev1.VolumeReady {
			return "", fmt.Errorf("VolumeState %s phase %s after the invalid commit", vs.Name, vs.Status.Phase)
		}
		fi, err := os.Stat(sum.VolumeFile)
		if err != nil {
			return "", fmt.Errorf("volume file after the invalid commit: %w", err)
		}
		if fi.Size() != fiBefore.Size() {
			return "", fmt.Errorf("volume file %s changed size: %d → %d", sum.VolumeFile, fiBefore.Size(), fi.Size())
		}
		if err := e.Client.Get(ctx, client.ObjectKey{Name: QuickstartClass}, &storagev1.StorageClass{}); err != nil {
			return "", fmt.Errorf("StorageClass %s after the invalid commit: %w", QuickstartClass, err)
		}
		var sc storagev1.StorageClass
		if err := e.Client.Get(ctx, client.ObjectKey{Name: "plinth-dev-xfs"}, &sc); !apierrors.IsNotFound(err) {
			return "", fmt.Errorf("StorageClass plinth-dev-xfs of the invalid placement: want none, got %v", err)
		}
		out, err := e.KubectlRun(ctx, "exec", "-n", QuickstartNamespace, QuickstartPod, "--", "cat", "/data/hello.txt")
		if err != nil || !strings.Contains(out, probeText) {
			return "", fmt.Errorf("the pod's volume after the invalid commit: %q %v", out, err)
		}
		probe := "; /data/hello.txt still readable in the pod"
		reverted, err := e.deliver(ctx, "revert: remove placement dev.xfs", good, true)
		if err != nil {
			return "", fmt.Errorf("revert: %w", err)
		}
		if _, err := e.waitPolicyReady(ctx, 2*time.Minute, ExtraPlacement); err != nil {
			return "", fmt.Errorf("after the revert: %w", err)
		}
		if err := poll(ctx, time.Minute, func() error {
			if _, err := e.placement(ctx, InvalidPlacement); !apierrors.IsNotFound(err) {
				return fmt.Errorf("Placement %s still there after the revert (%v)", InvalidPlacement, err)
			}
			return nil
		}); err != nil {
			return "", err
		}
		return fmt.Sprintf("%s\nPlacement %s Stalled=True %.1fs after the %s: %s\n%s\nVolumeState %s still Ready, %s unchanged (%s), StorageClass %s kept%s\nreverted: %s",
			shown, InvalidPlacement, sum.Rejected.Seconds(), e.verb(), stalled, others, vs.Name, sum.VolumeFile, bytesStr(fi.Size()), QuickstartClass, probe,
			strings.ReplaceAll(reverted, "\n", "; ")), nil
	})
}

// Scenario runs the quickstart end to end on a running Env and returns the
// measured figures: policy delivered (committed to Git and synced by Flux, or
// applied), rendered objects, PVC + pod, volume staged and published, hand
// edit → Drifted (and PlinthDriftPersisting firing in Prometheus) → corrected, a change committed, an invalid policy
// rejected, the observability step (Observe: a pool filled, a failed volume,
// kernel drift, a fencing refusal → their alerts firing; every dashboard panel
// evaluated), then the volume released. It prints a summary with timings.
func (e *Walk) Scenario(ctx context.Context) (*Summary, error) {
	sum := &Summary{}
	if e.Prom == nil {
		return sum, errors.New("the scenario reads Prometheus: Up without Options.NoPrometheus")
	}
	start := time.Now()
	sum.ObserveStart = start
	steps := []func(context.Context, *Summary) error{e.Policy, e.ShowRendered, e.Claim, e.PodIO, e.HandDrift, e.DriftAlert, e.CorrectDrift,
		e.ChangePolicy, e.InvalidPolicy, e.Observe, e.PodGone, e.Release, e.ResolvedAlerts}
	for _, s := range steps {
		if err := s(ctx, sum); err != nil {
			sum.Total = time.Since(start)
			return sum, e.fail(err)
		}
	}
	sum.Total = time.Since(start)
	how := "applied directly (--no-flux)"
	if e.Opts.Flux {
		v := controlplane.PinnedVersions()
		how = fmt.Sprintf("committed to Git, synced by Flux source-controller %s and kustomize-controller %s", v["FLUX_SOURCE_CONTROLLER_VERSION"], v["FLUX_KUSTOMIZE_CONTROLLER_VERSION"])
	}
	e.rep.printf("\nsummary (policy %s):\n", how)
	e.rep.printf("  %-34s %5.1fs (quickstart), %.1fs (reserve 2Gi + placement %s)\n", e.verb()+" → policy Ready", sum.PolicyReady.Seconds(), sum.ChangeReady.Seconds(), ExtraPlacement)
	e.rep.printf("  %-34s %5.1fs\n", "PVC → pod Running (on "+e.node+")", sum.PVCBound.Seconds())
	e.rep.printf("  %-34s %5.1fs; %s driftPolicy Correct → corrected %.1fs\n", "hand edit → Drifted", sum.DriftShown.Seconds(), e.verb(), sum.DriftCorrected.Seconds())
	e.rep.printf("  %-34s %5.1fs\n", "invalid "+e.verb()+" → Stalled", sum.Rejected.Seconds())
	e.rep.printf("  %-34s %s; Prometheus %s\n", "dashboards", sum.Panels, e.Prom.URL)
	e.rep.printf("  %-34s %5.1fs\n", "whole scenario", sum.Total.Seconds())
	return sum, nil
}

func (e *Walk) fail(err error) error {
	e.failureTails()
	return err
}

// failureTails prints the tail of the log of every process that died; when
// none did, of the components the failed step names.
func (e *Env) failureTails() {
	if e.CP == nil {
		return
	}
	var names []string
	for n, p := range e.procs {
		if p.Exited() {
			names = append(names, n)
		}
	}
	what := "exited"
	if len(names) == 0 {
		what = "last lines"
		for _, n := range e.failed {
			if _, ok := e.procs[n]; ok {
				names = append(names, n)
			}
		}
	}
	// A process that failed to start is not in e.procs: its error carries its log's tail.
	sort.Strings(names)
	for _, n := range names {
		p := e.procs[n]
		e.rep.printf("\n--- %s (pid %d, %s of %s):\n%s\n", n, p.PID(), what, p.LogPath, p.Tail(20))
	}
	e.podTails()
}

// podTails prints the state of every Plinth pod that is not Ready and the
// last lines of the containers of the components the failed step names
// (app.kubernetes.io/component), through the API server as kubectl logs does.
func (e *Env) podTails() {
	if e.CS == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pods, err := e.CS.CoreV1().Pods(ControllerNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return
	}
	wanted := map[string]bool{}
	for _, c := range e.failed {
		wanted[c] = true
	}
	for _, p := range pods.Items {
		ready := false
		for _, c := range p.Status.Conditions {
			ready = ready || (c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue)
		}
		if !ready {
			e.rep.printf("\n--- pod %s on %s not Ready: %s %s\n", p.Name, p.Spec.NodeName, p.Status.Phase, podWhy(&p))
		}
		if !wanted[p.Labels["app.kubernetes.io/component"]] && ready {
			continue
		}
		for _, ct := range p.Spec.Containers {
			data, err := e.CS.CoreV1().Pods(p.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: ct.Name, TailLines: ptr(int64(20))}).DoRaw(ctx)
			if err == nil {
				e.rep.printf("\n--- %s/%s on %s (last lines):\n%s\n", p.Name, ct.Name, p.Spec.NodeName, data)
			}
		}
	}
}
