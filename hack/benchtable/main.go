// Command benchtable reads the output of `make bench` (go test -bench lines, and the SCALE: log
// lines of TestScaleThousandObjects, which no row shows any more) from the files named on its command line and prints ONE
// Markdown table: metric, Plinth, peer or floor measured in the same run, ratio, target. A row
// whose benchmark did not run (or failed) reads "not measured". With -o the table is also
// written to a file.
//
// Usage: go run ./hack/benchtable [-o table.md] out/*.txt
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// results maps "<benchmark name without the -GOMAXPROCS suffix> <unit>" to its values, one per
// run in the order read. A benchmark run several times (go test names the repeats of a
// sub-benchmark "name#01", "name#02", …, as BenchmarkPVCBurst's rounds are) is one key: the
// table shows the median of its values.
type results map[string][]float64

// median returns the median of vs (the mean of the middle two for an even count) and how many
// values there are; ok is false for none.
func (r results) median(key string) (v float64, n int, ok bool) {
	vs := slices.Clone(r[key])
	if len(vs) == 0 {
		return 0, 0, false
	}
	slices.Sort(vs)
	m := len(vs) / 2
	if len(vs)%2 == 1 {
		return vs[m], len(vs), true
	}
	return (vs[m-1] + vs[m]) / 2, len(vs), true
}

var (
	benchLine = regexp.MustCompile(`^(Benchmark\S+?)(?:-\d+)?\s+\d+\s+(.*)$`)
	// repeatSuffix is what go test appends to the name of a sub-benchmark run again.
	repeatSuffix = regexp.MustCompile(`#\d+(/|$)`)
	scaleNew     = regexp.MustCompile(`SCALE: applied (\d+) new objects in ([0-9.]+)(ms|s|m)`)
	scaleNoop    = regexp.MustCompile(`SCALE: no-op reconcile of (\d+) objects: ([0-9.]+)(µs|ms|s), (\d+) writes`)
)

func seconds(v, unit string) float64 {
	f, _ := strconv.ParseFloat(v, 64)
	switch unit {
	case "µs":
		return f / 1e6
	case "ms":
		return f / 1e3
	case "m":
		return f * 60
	}
	return f
}

func parse(r io.Reader, res results) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if m := benchLine.FindStringSubmatch(line); m != nil {
			name := repeatSuffix.ReplaceAllString(m[1], "$1")
			f := strings.Fields(m[2])
			for i := 0; i+1 < len(f); i += 2 {
				if v, err := strconv.ParseFloat(f[i], 64); err == nil {
					k := name + " " + f[i+1]
					res[k] = append(res[k], v)
				}
			}
			continue
		}
		if m := scaleNew.FindStringSubmatch(line); m != nil {
			res["fleet first-apply-s"] = append(res["fleet first-apply-s"], seconds(m[2], m[3]))
		}
		if m := scaleNoop.FindStringSubmatch(line); m != nil {
			w, _ := strconv.ParseFloat(m[4], 64)
			res["fleet noop-s"] = append(res["fleet noop-s"], seconds(m[2], m[3]))
			res["fleet noop-writes"] = append(res["fleet noop-writes"], w)
		}
	}
	return sc.Err()
}

// row is one line of the table: the keys of Plinth's value and of the peer's or floor's.
type row struct {
	metric, plinth, peer, peerName, target string
}

var rows = []row{
	{"PVC burst (N at once, file backend): CreateVolume p50, ms", "BenchmarkPVCBurst/plinth createvolume-p50-ms", "BenchmarkPVCBurst/floor createvolume-p50-ms", "no-op CSI floor", "≤ 100"},
	{"PVC burst: CreateVolume p99, ms", "BenchmarkPVCBurst/plinth createvolume-p99-ms", "BenchmarkPVCBurst/floor createvolume-p99-ms", "no-op CSI floor", "≤ 1000"},
	{"PVC burst: PVC → Bound, vol/s", "BenchmarkPVCBurst/plinth bound-vol/s", "BenchmarkPVCBurst/floor bound-vol/s", "no-op CSI floor", "≥ 0.95× floor"},
	{"PVC burst: PVC → Bound p50, ms", "BenchmarkPVCBurst/plinth bound-p50-ms", "BenchmarkPVCBurst/floor bound-p50-ms", "no-op CSI floor", "—"},
	{"PVC burst: PVC → Bound p99, ms", "BenchmarkPVCBurst/plinth bound-p99-ms", "BenchmarkPVCBurst/floor bound-p99-ms", "no-op CSI floor", "—"},
	{"PVC burst: delete all, vol/s", "BenchmarkPVCBurst/plinth delete-vol/s", "BenchmarkPVCBurst/floor delete-vol/s", "no-op CSI floor", "—"},
	{"PVC burst: DeleteVolume p99, ms", "BenchmarkPVCBurst/plinth deletevolume-p99-ms", "BenchmarkPVCBurst/floor deletevolume-p99-ms", "no-op CSI floor", "—"},
	{"PVC burst: API server CPU per volume (the agent-idle window left out), ms", "BenchmarkPVCBurst/plinth apiserver-cpu-ms/vol", "BenchmarkPVCBurst/floor apiserver-cpu-ms/vol", "no-op CSI floor", "≤ 1.15× floor"},
	{"PVC burst: API server CPU per volume, this tree beside PLINTH_BENCH_BURST_BASE, ms", "BenchmarkPVCBurst/plinth apiserver-cpu-ms/vol", "BenchmarkPVCBurst/plinth-base apiserver-cpu-ms/vol", "the base binary", "—"},
	{"PVC burst: API requests per volume (create + delete)", "BenchmarkPVCBurst/plinth apiserver-req/vol", "BenchmarkPVCBurst/floor apiserver-req/vol", "no-op CSI floor", "—"},
	{"PVC burst: API writes per volume (create + delete)", "BenchmarkPVCBurst/plinth apiserver-writes/vol", "BenchmarkPVCBurst/floor apiserver-writes/vol", "no-op CSI floor", "—"},
	{"PVC burst: idle agent CPU holding N volumes (default 30 s refresh), %", "BenchmarkPVCBurst/plinth agent-idle-cpu-%", "", "", "< 1"},
	{"Tier change: N claims to another VolumeAttributesClass at once → all status.currentVolumeAttributesClassName, s", "BenchmarkTierChange/plinth tier-s", "BenchmarkTierChange/floor tier-s", "no-op CSI floor", "≤ 60 (N = 300)"},
	{"Tier change: claims/s", "BenchmarkTierChange/plinth tier-claims/s", "BenchmarkTierChange/floor tier-claims/s", "no-op CSI floor", "≥ 5"},
	{"Agent alone, N volumes at once: create → Ready p50, ms", "BenchmarkAgentFileVolumes/workers=default ready-p50-ms", "BenchmarkAgentFileVolumes/workers=1 ready-p50-ms", "1 worker (serial)", "—"},
	{"Agent alone: create → Ready p99, ms", "BenchmarkAgentFileVolumes/workers=default ready-p99-ms", "BenchmarkAgentFileVolumes/workers=1 ready-p99-ms", "1 worker (serial)", "—"},
	{"Agent alone: burst rate, vol/s", "BenchmarkAgentFileVolumes/workers=default vol/s", "BenchmarkAgentFileVolumes/workers=1 vol/s", "1 worker (serial)", "—"},
	{"Agent alone: delete → gone p99, ms", "BenchmarkAgentFileVolumes/workers=default delete-p99-ms", "BenchmarkAgentFileVolumes/workers=1 delete-p99-ms", "1 worker (serial)", "—"},
	{"Idle agent CPU holding N file volumes (refresh 30 s), %", "BenchmarkAgentFileVolumes/workers=default idle-cpu-%", "", "", "< 1"},
	{"Control plane lost, 100 file volumes: plan (load checkout + cluster, plan), s", "BenchmarkControlPlaneLost100 plan-s", "", "", "—"},
	{"Control plane lost: --confirm → 100 VolumeStates Ready, s", "BenchmarkControlPlaneLost100 ready-s", "", "", "—"},
	{"Control plane lost: --confirm → 100 claims Bound to their old PVs (PV binder), s", "BenchmarkControlPlaneLost100 bound-s", "", "", "—"},
	{"Control plane lost: checksums equal after adoption (of 100)", "BenchmarkControlPlaneLost100 checksums-equal", "", "", "100"},
	{"Control plane lost: identity-stamp writes before --confirm", "BenchmarkControlPlaneLost100 stamp-writes-before-confirm", "", "", "0"},
	{"CreateVolume overhead above the agent p99, ms", "BenchmarkCreateVolume overhead-p99-ms", "BenchmarkCreateVolume api-write-watch-p99-ms", "API write → watch", "≤ 20"},
	{"CreateVolume overhead above the agent p50, ms", "BenchmarkCreateVolume overhead-p50-ms", "BenchmarkCreateVolume api-write-watch-p50-ms", "API write → watch", "—"},
	{"PVC → Bound one at a time, real sidecars, p99, ms", "BenchmarkPVCBound bound-p99-ms", "", "", "—"},
	{"Scheduler Filter+Score at 5,000 nodes, ns/node", "BenchmarkFilterScore ns/node", "", "", "≤ 200"},
	{"Scheduler Filter+Score, allocs per 5,000-node cycle", "BenchmarkFilterScore allocs/op", "", "", "0"},
	{"vet + render 10,000 policies over 1,000 nodes, CPU s (one core)", "BenchmarkVetAndRender10kPolicies1kNodes cpu-s/op", "", "", "≤ 5"},
	{"vet + render 10,000 policies over 1,000 nodes, wall s (shared machine)", "BenchmarkVetAndRender10kPolicies1kNodes sec/op", "", "", "—"},
	{"render only 10,000 policies over 1,000 nodes, CPU s", "BenchmarkRender10kPolicies1kNodes cpu-s/op", "", "", "—"},
	{"Re-render after one policy changes (10,000 policies, 1,000 nodes), CPU p50, ms", "BenchmarkRerenderOneOf10kPolicies1kNodes cpu-p50-ms", "BenchmarkRerenderOneOf10kPolicies1kNodes cold-cpu-ms", "cold vet + render", "≤ 50"},
	{"Re-render after one policy changes, CPU p99, ms", "BenchmarkRerenderOneOf10kPolicies1kNodes cpu-p99-ms", "BenchmarkRerenderOneOf10kPolicies1kNodes cold-cpu-ms", "cold vet + render", "—"},
	{"Re-render after one policy changes, wall p50, ms", "BenchmarkRerenderOneOf10kPolicies1kNodes p50-ms", "BenchmarkRerenderOneOf10kPolicies1kNodes cold-ms", "cold vet + render", "≤ 50"},
	{"Re-render after one policy changes, wall p99, ms", "BenchmarkRerenderOneOf10kPolicies1kNodes p99-ms", "BenchmarkRerenderOneOf10kPolicies1kNodes cold-ms", "cold vet + render", "—"},
	{"Reconcile after one policy changes, beyond render (convert, plan, inventory), CPU p50, ms", "BenchmarkReconcileAfterOneChange post-cpu-p50-ms", "BenchmarkReconcileAfterOneChange coldpost-cpu-ms", "the same step, nothing kept", "render + this ≤ 50"},
	{"Reconcile after one policy changes, beyond render, CPU p99, ms", "BenchmarkReconcileAfterOneChange post-cpu-p99-ms", "BenchmarkReconcileAfterOneChange coldpost-cpu-ms", "the same step, nothing kept", "—"},
	{"Reconcile after one policy changes, beyond render, wall p50, ms", "BenchmarkReconcileAfterOneChange post-p50-ms", "BenchmarkReconcileAfterOneChange coldpost-ms", "the same step, nothing kept", "—"},
	{"Reconcile beyond render: conversion of every rendered object, ms", "BenchmarkRerenderOneOf10kPolicies1kNodes convert-ms", "", "", "—"},
	{"Reconcile beyond render: digests of every rendered object, ms", "BenchmarkRerenderOneOf10kPolicies1kNodes digest-ms", "", "", "—"},
	{"Controller RSS, 1,000 nodes, MiB", "BenchmarkControllerMemory fleet-rss-mib", "", "", "report"},
	{"Controller RSS, 1,000 nodes + 10,000 VolumeStates, MiB", "BenchmarkControllerMemory rss-mib", "", "", "≤ 256"},
	{"Controller peak RSS (VmHWM), MiB", "BenchmarkControllerMemory hwm-mib", "", "", "—"},
	{"Fleet apply (N nodes, 2N+1 objects): first apply, s", "BenchmarkFleetApply/plinth first-apply-s", "BenchmarkFleetApply/kustomize-controller first-apply-s", "kustomize-controller", "≤ 10 and ≤ 0.25× peer"},
	{"Fleet apply: no-op re-apply (reconcile), s", "BenchmarkFleetApply/plinth noop-s", "BenchmarkFleetApply/kustomize-controller noop-s", "kustomize-controller", "≤ 0.5"},
	{"Fleet apply: no-op writes", "BenchmarkFleetApply/plinth noop-writes", "BenchmarkFleetApply/kustomize-controller noop-writes", "kustomize-controller", "0"},
	{"Fleet apply: no-op requests for the applied kinds", "BenchmarkFleetApply/plinth noop-requests", "BenchmarkFleetApply/kustomize-controller noop-requests", "kustomize-controller", "—"},
	{"Fleet apply: first apply, requests for the applied kinds", "BenchmarkFleetApply/plinth first-requests", "BenchmarkFleetApply/kustomize-controller first-requests", "kustomize-controller", "—"},
	{"Fleet apply: first apply, of which dry-runs", "BenchmarkFleetApply/plinth first-dryruns", "BenchmarkFleetApply/kustomize-controller first-dryruns", "kustomize-controller", "—"},
	{"Fleet apply: first apply, API server CPU, s", "BenchmarkFleetApply/plinth apiserver-cpu-s", "BenchmarkFleetApply/kustomize-controller apiserver-cpu-s", "kustomize-controller", "—"},
	{"Fleet apply: controller CPU (first apply + no-op), s", "BenchmarkFleetApply/plinth cpu-s", "BenchmarkFleetApply/kustomize-controller cpu-s", "kustomize-controller", "—"},
	{"Fleet apply: controller peak RSS, MiB", "BenchmarkFleetApply/plinth rss-mb", "BenchmarkFleetApply/kustomize-controller rss-mb", "kustomize-controller", "report"},
	{"Fleet apply, cluster defaults (APF on, no limit flags): first apply, s", "BenchmarkFleetApplyDefaults/plinth first-apply-s", "BenchmarkFleetApplyDefaults/kustomize-controller first-apply-s", "kustomize-controller", "≤ 10 and ≤ 0.25× peer"},
	{"Fleet apply, cluster defaults: no-op re-apply (reconcile), s", "BenchmarkFleetApplyDefaults/plinth noop-s", "BenchmarkFleetApplyDefaults/kustomize-controller noop-s", "kustomize-controller", "≤ 0.5"},
	{"Fleet apply, cluster defaults: no-op writes", "BenchmarkFleetApplyDefaults/plinth noop-writes", "BenchmarkFleetApplyDefaults/kustomize-controller noop-writes", "kustomize-controller", "0"},
	{"Fleet apply, cluster defaults: first apply, API server CPU, s", "BenchmarkFleetApplyDefaults/plinth apiserver-cpu-s", "BenchmarkFleetApplyDefaults/kustomize-controller apiserver-cpu-s", "kustomize-controller", "—"},
	{"Fleet apply, cluster defaults: controller CPU (first apply + no-op), s", "BenchmarkFleetApplyDefaults/plinth cpu-s", "BenchmarkFleetApplyDefaults/kustomize-controller cpu-s", "kustomize-controller", "—"},
	{"Fleet apply, cluster defaults: controller peak RSS, MiB", "BenchmarkFleetApplyDefaults/plinth rss-mb", "BenchmarkFleetApplyDefaults/kustomize-controller rss-mb", "kustomize-controller", "report"},
	{"Idle LVM Store, 100 thin volumes (guest): vgs/lvs per minute per VG", "BenchmarkGuestIdleLVM/kept lvm-cmds/min/VG", "BenchmarkGuestIdleLVM/poll lvm-cmds/min/VG", "vgs+lvs every 30 s refresh (before)", "≤ 1"},
	{"Idle LVM Store refresh (guest, emulated), ms", "BenchmarkGuestIdleLVM/kept ms/op", "BenchmarkGuestIdleLVM/poll ms/op", "vgs+lvs every refresh", "—"},
	{"Idle LVM backend, 100 volumes: RSS of the test process, MiB", "BenchmarkGuestIdleLVM/kept rss-MiB", "BenchmarkGuestIdleLVM/poll rss-MiB", "vgs+lvs every refresh", "report"},
	{"Real kube-scheduler, 1,000 pods on 500 nodes, pods/s", "BenchmarkRealScheduler/plinth pods/s", "BenchmarkRealScheduler/default pods/s", "default plugins only", "≥ 0.9×"},
	{"Real kube-scheduler: scheduling cycle, ms", "BenchmarkRealScheduler/plinth cycle-ms", "BenchmarkRealScheduler/default cycle-ms", "default plugins only", "—"},
	{"Real kube-scheduler: PlinthCapacity's share of the cycle, %", "BenchmarkRealScheduler/plinth plugin-%-of-cycle", "", "", "report"},
	{"Agent RSS holding N file volumes (plinth agent process), MiB", "BenchmarkAgentMemory rss-mib", "BenchmarkAgentMemory rss-0-mib", "same agent, no volume", "report"},
	{"Agent RssAnon holding N file volumes, MiB", "BenchmarkAgentMemory rss-anon-mib", "BenchmarkAgentMemory rss-anon-0-mib", "same agent, no volume", "report"},
	{"Agent Go heap in use holding N file volumes, MiB", "BenchmarkAgentMemory heap-mib", "", "", "report"},
	{"PVC burst: agent peak RSS holding N volumes, MiB", "BenchmarkPVCBurst/plinth agent-rss-mb", "BenchmarkPVCBurst/plinth-base agent-rss-mb", "the base binary", "< 45"},
	{"PVC burst: agent RssAnon holding N volumes (RssFile: the binary's pages), MiB", "BenchmarkPVCBurst/plinth agent-rss-anon-mib", "BenchmarkPVCBurst/plinth agent-rss-file-mib", "its RssFile", "report"},
	{"PVC burst: CSI controller peak RSS, MiB", "BenchmarkPVCBurst/plinth csi-rss-mib", "BenchmarkPVCBurst/peer csi-rss-mib", "peer driver (PLINTH_BENCH_CSI_CMD)", "< 45"},
	{"PVC burst: CSI controller peak RSS beside PLINTH_BENCH_BURST_BASE, MiB", "BenchmarkPVCBurst/plinth csi-rss-mib", "BenchmarkPVCBurst/plinth-base csi-rss-mib", "the base binary", "—"},
	{"PVC burst: CSI controller RssAnon at the end (RssFile: the binary's pages), MiB", "BenchmarkPVCBurst/plinth csi-rss-anon-mib", "BenchmarkPVCBurst/plinth csi-rss-file-mib", "its RssFile", "report"},
	{"PVC → pod Running on real nodes p50, ms", "BenchmarkPodWithVolumeRunning p50-ms", "BenchmarkPodWithVolumeRunning floor-p50-ms", "same pod, no volume", "—"},
	{"PVC → pod Running on real nodes p99, ms", "BenchmarkPodWithVolumeRunning p99-ms", "BenchmarkPodWithVolumeRunning floor-p99-ms", "same pod, no volume", "—"},
}

func format(v float64) string {
	switch {
	case v >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case v >= 1:
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}

// medianOf says a value is the median of n runs (nothing for one run).
func medianOf(n int) string {
	if n <= 1 {
		return ""
	}
	return fmt.Sprintf(" (median of %d)", n)
}

func table(res results) string {
	var b strings.Builder
	b.WriteString("| metric | Plinth | peer / floor (same run) | ratio | target |\n| --- | --- | --- | --- | --- |\n")
	for _, r := range rows {
		// ns/op of a benchmark reported in seconds or milliseconds reads better
		for _, key := range []string{r.plinth, r.peer} {
			for unit, div := range map[string]float64{" sec/op": 1e9, " ms/op": 1e6} {
				if strings.HasSuffix(key, unit) {
					if vs, ok := res[strings.TrimSuffix(key, unit[1:])+"ns/op"]; ok {
						res[key] = nil
						for _, v := range vs {
							res[key] = append(res[key], v/div)
						}
					}
				}
			}
		}
		p, np, ok := res.median(r.plinth)
		plinth, peer, ratio := "not measured", "—", "—"
		if ok {
			plinth = format(p) + medianOf(np)
		}
		if r.peer != "" {
			if q, nq, ok2 := res.median(r.peer); ok2 {
				peer = format(q) + medianOf(nq) + " (" + r.peerName + ")"
				if ok && q != 0 {
					ratio = strconv.FormatFloat(p/q, 'f', 2, 64) + "×"
				}
			} else {
				peer = "not measured (" + r.peerName + ")"
			}
		} else if r.peerName != "" {
			peer = r.peerName
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", r.metric, plinth, peer, ratio, r.target)
	}
	return b.String()
}

func main() {
	out := flag.String("o", "", "also write the table to this file")
	flag.Parse()
	res := results{}
	for _, name := range flag.Args() {
		f, err := os.Open(name)
		if err != nil {
			fmt.Fprintln(os.Stderr, "benchtable:", err)
			os.Exit(1)
		}
		err = parse(f, res)
		f.Close()
		if err != nil {
			fmt.Fprintf(os.Stderr, "benchtable: %s: %v\n", name, err)
			os.Exit(1)
		}
	}
	t := table(res)
	fmt.Print(t)
	if *out != "" {
		if err := os.WriteFile(*out, []byte(t), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "benchtable:", err)
			os.Exit(1)
		}
	}
}
