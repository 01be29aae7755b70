package guestnode

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// rolloutTimeline describes, for a failure message or a TIMING log, what plinth-system's pods
// did since since: each event (scheduler, kubelet: Pulling, Pulled, BackOff, Created, Started,
// Killing, Unhealthy...) with its count, then each pod's steps (created by the API server;
// scheduled, initialized, containers started, Ready as the kubelet reported them). Times are
// seconds after since; the kubelet's are its guest's clock, which the guests set from the
// host's at boot.
func rolloutTimeline(ctx context.Context, cs *kubernetes.Clientset, since time.Time) string {
	var b strings.Builder
	rel := func(at time.Time) string {
		if at.IsZero() {
			return "-"
		}
		return fmt.Sprintf("%+.0fs", at.Sub(since).Seconds())
	}
	evs, err := cs.CoreV1().Events(plinthNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	type line struct {
		at   time.Time
		text string
	}
	var lines []line
	for _, e := range evs.Items {
		first, last := e.FirstTimestamp.Time, e.LastTimestamp.Time
		if !e.EventTime.IsZero() && first.IsZero() {
			first, last = e.EventTime.Time, e.EventTime.Time
		}
		if last.Before(since) {
			continue
		}
		src := e.Source.Host
		if src == "" {
			src = e.ReportingInstance
		}
		lines = append(lines, line{first, fmt.Sprintf("\n  %s..%s %s %s/%s x%d [%s]: %s", rel(first), rel(last), e.Reason,
			strings.ToLower(e.InvolvedObject.Kind), e.InvolvedObject.Name, max(e.Count, 1), src, e.Message)})
	}
	slices.SortStableFunc(lines, func(a, b line) int { return a.at.Compare(b.at) })
	b.WriteString("events:")
	for _, l := range lines {
		b.WriteString(l.text)
	}
	pods, err := cs.CoreV1().Pods(plinthNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		return b.String() + "\n" + err.Error()
	}
	b.WriteString("\npods (created, then the kubelet's condition times):")
	for _, p := range pods.Items {
		if p.CreationTimestamp.Time.Before(since) {
			continue
		}
		fmt.Fprintf(&b, "\n  %s on %s: created %s", p.Name, p.Spec.NodeName, rel(p.CreationTimestamp.Time))
		for _, c := range p.Status.Conditions {
			fmt.Fprintf(&b, ", %s=%s %s", c.Type, c.Status, rel(c.LastTransitionTime.Time))
		}
		for _, c := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
			switch {
			case c.State.Running != nil:
				fmt.Fprintf(&b, ", %s started %s", c.Name, rel(c.State.Running.StartedAt.Time))
			case c.State.Terminated != nil:
				fmt.Fprintf(&b, ", %s ran %s..%s (%s)", c.Name, rel(c.State.Terminated.StartedAt.Time), rel(c.State.Terminated.FinishedAt.Time), c.State.Terminated.Reason)
			case c.State.Waiting != nil:
				fmt.Fprintf(&b, ", %s waiting (%s)", c.Name, c.State.Waiting.Reason)
			}
		}
	}
	return b.String()
}

// livenessKills counts the containers of plinth-system the kubelets restarted for a failed
// liveness probe since since (their Killing events), by pod.
func livenessKills(ctx context.Context, cs *kubernetes.Clientset, since time.Time) (int, map[string]int, error) {
	evs, err := cs.CoreV1().Events(plinthNS).List(ctx, metav1.ListOptions{FieldSelector: "reason=Killing"})
	if err != nil {
		return 0, nil, err
	}
	total, by := 0, map[string]int{}
	for _, e := range evs.Items {
		if e.LastTimestamp.Time.Before(since) || !strings.Contains(e.Message, "failed liveness probe") {
			continue
		}
		n := int(max(e.Count, 1))
		total += n
		by[e.InvolvedObject.Name] += n
	}
	return total, by, nil
}
