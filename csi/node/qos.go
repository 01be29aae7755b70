package node

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/csi/iolimit"
	"github.com/plinth-storage/plinth/csi/stage"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// The node service's access for the limits (docs/design.md#qos): it watches the VolumeStates
// for their spec.attributes and reports its own entry of status.appliedAttributes.
//
// +kubebuilder:rbac:groups=storage.plinth.dev,resources=volumestates,verbs=get;list;watch
// +kubebuilder:rbac:groups=storage.plinth.dev,resources=volumestates/status,verbs=get;update

// PodUIDContext is the volume context key kubelet sets to the pod's UID at NodePublishVolume
// when the CSIDriver has podInfoOnMount.
const PodUIDContext = "csi.storage.k8s.io/pod.uid"

// Limits keeps the I/O limits of the volumes staged on this node in force: the VolumeState's
// spec.attributes written into the cgroups of the pods that consume the volume
// (csi/iolimit), for the volume's block device as staged. It acts when a VolumeState changes
// (no pod restart: the cgroup files are rewritten in place), when NodePublishVolume nudges
// it, and every interval — which also covers a node plugin restart, a restage, and on
// cgroup v1 the cgroups of containers started after the last round. Each round reports its
// outcome as this node's entry in status.appliedAttributes, which ControllerModifyVolume
// waits for.
type Limits struct {
	s      *Service
	writer iolimit.Writer
	cache  cache.Cache
	nudge  chan struct{}
}

// NewLimits returns the limits keeper of s, reading VolumeStates with an informer of cfg and
// writing cgroups through w.
func (s *Service) NewLimits(cfg *rest.Config, scheme *runtime.Scheme, w iolimit.Writer) (*Limits, error) {
	ca, err := cache.New(cfg, cache.Options{Scheme: scheme, ByObject: map[client.Object]cache.ByObject{
		&storev1.VolumeState{}: {}}})
	if err != nil {
		return nil, fmt.Errorf("volumestate cache: %w", err)
	}
	l := &Limits{s: s, writer: w, cache: ca, nudge: make(chan struct{}, 1)}
	s.limits = l
	return l, nil
}

// Nudge asks for a round now (after a publish); it never blocks.
func (l *Limits) Nudge() {
	if l == nil {
		return
	}
	select {
	case l.nudge <- struct{}{}:
	default:
	}
}

// Run keeps the limits until ctx ends: a round at start, on every VolumeState event, on a
// nudge, and every interval.
func (l *Limits) Run(ctx context.Context, interval time.Duration) error {
	inf, err := l.cache.GetInformer(ctx, &storev1.VolumeState{})
	if err != nil {
		return err
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { l.Nudge() },
		UpdateFunc: func(any, any) { l.Nudge() },
	}); err != nil {
		return err
	}
	go func() {
		if err := l.cache.Start(ctx); err != nil {
			l.s.log.Error(err, "volumestate cache stopped")
		}
	}()
	if !l.cache.WaitForCacheSync(ctx) {
		return ctx.Err()
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		l.Round(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-l.nudge:
		}
	}
}

// Round applies the limits of every volume staged on this node and reports each outcome;
// it drops this node's entry from volumes no longer staged here.
func (l *Limits) Round(ctx context.Context) {
	recs, err := l.s.stages.List()
	if err != nil {
		l.s.log.Error(err, "limits: list stage records")
		return
	}
	staged := map[string]bool{}
	for _, rec := range recs {
		staged[rec.VolumeID] = true
		l.apply(ctx, rec.VolumeID)
	}
	var all storev1.VolumeStateList
	if err := l.cache.List(ctx, &all); err != nil {
		return
	}
	for i := range all.Items {
		vs := &all.Items[i]
		if !staged[vs.Name] && slices.ContainsFunc(vs.Status.AppliedAttributes, func(a storev1.AppliedAttributes) bool { return a.NodeName == l.s.nodeName }) {
			l.report(ctx, vs.Name, nil)
		}
	}
}

// apply writes the limits of volume id into the cgroups of its consumers on this node and
// reports the outcome. It takes no per-volume lock: the RPCs hold that lock and answer ABORTED
// to a second operation, so a round holding it every interval would make kubelet's stage and
// publish calls, and in --mode all the controller's, fail at random. The stage record is
// replaced atomically (csi/stage); a failure while a stage, publish or unpublish changed the
// record is not reported (the next round acts on the new record), so a consumer leaving is
// never reported as a limit that cannot be applied.
func (l *Limits) apply(ctx context.Context, id string) {
	rec, err := l.s.stages.Load(id)
	if err != nil {
		return // unstaged meanwhile
	}
	var vs storev1.VolumeState
	if err := l.cache.Get(ctx, client.ObjectKey{Name: id}, &vs); err != nil {
		return // not Plinth's, or not seen yet
	}
	want := storev1.AppliedAttributes{NodeName: l.s.nodeName}
	var lim iolimit.Limits
	if a := vs.Spec.Attributes; a != nil {
		want.Generation = a.Generation
		lim = limitsOf(a)
	}
	if err := l.enforce(rec, lim, want.Generation); err != nil {
		if now, lerr := l.s.stages.Load(id); lerr != nil || !reflect.DeepEqual(now, rec) {
			return
		}
		want.Message = err.Error()
	}
	if cur := appliedOf(&vs, l.s.nodeName); cur == nil || !equality.Semantic.DeepEqual(*cur, want) {
		l.report(ctx, id, &want)
	}
}

// enforce writes lim (of spec.attributes generation gen) for rec's device into the cgroup of
// each pod rec is published to, logging each pod whose files it changed. A volume staged but
// not published has nothing to limit yet.
func (l *Limits) enforce(rec stage.Record, lim iolimit.Limits, gen int64) error {
	if len(rec.Targets) == 0 {
		return nil
	}
	dev, err := iolimit.DeviceOf(rec.Device)
	if err != nil {
		return err
	}
	var errs []error
	for _, target := range rec.Targets {
		uid := rec.PodUIDs[target]
		if uid == "" {
			uid = podUIDOfTarget(target)
		}
		n, err := l.writer.Apply(uid, dev, lim)
		if err != nil {
			errs = append(errs, fmt.Errorf("pod %s: %w", uid, err))
		}
		if n > 0 {
			l.s.log.Info("I/O limits written", "volume", rec.VolumeID, "generation", gen, "pod", uid, "device", dev.String(),
				"files", n, "writeBPS", lim.WriteBPS, "readBPS", lim.ReadBPS, "writeIOPS", lim.WriteIOPS, "readIOPS", lim.ReadIOPS)
		}
	}
	return errors.Join(errs...)
}

// report sets (want non-nil) or removes this node's entry of status.appliedAttributes of
// volume id, on the live object (a conflict is left to the next round).
func (l *Limits) report(ctx context.Context, id string, want *storev1.AppliedAttributes) {
	var vs storev1.VolumeState
	if err := l.s.kube.Get(ctx, client.ObjectKey{Name: id}, &vs); err != nil {
		return
	}
	list := slices.DeleteFunc(vs.Status.AppliedAttributes, func(a storev1.AppliedAttributes) bool { return a.NodeName == l.s.nodeName })
	if want != nil {
		list = append(list, *want)
	}
	vs.Status.AppliedAttributes = list
	if err := l.s.kube.Status().Update(ctx, &vs); err != nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
		l.s.log.Error(err, "limits: report", "volume", id)
	}
}

func appliedOf(vs *storev1.VolumeState, node string) *storev1.AppliedAttributes {
	for i := range vs.Status.AppliedAttributes {
		if vs.Status.AppliedAttributes[i].NodeName == node {
			return &vs.Status.AppliedAttributes[i]
		}
	}
	return nil
}

// limitsOf converts a tier's limits (bounded positive by the policy schema) to the writer's.
func limitsOf(a *storev1.VolumeAttributes) iolimit.Limits {
	u := func(p *int64) uint64 {
		if p == nil || *p <= 0 {
			return 0
		}
		return uint64(*p)
	}
	l := a.Limits
	return iolimit.Limits{ReadIOPS: u(l.ReadIOPS), WriteIOPS: u(l.WriteIOPS), ReadBPS: u(l.ReadBytesPerSecond), WriteBPS: u(l.WriteBytesPerSecond)}
}

// podUIDOfTarget reads the pod UID from a kubelet publish path, for records written without
// one: <kubelet>/pods/<uid>/volumes/kubernetes.io~csi/<pv>/mount for mount volumes,
// <kubelet>/plugins/kubernetes.io/csi/volumeDevices/publish/<pv>/<uid> for block volumes.
func podUIDOfTarget(target string) string {
	parts := strings.Split(filepath.Clean(target), string(filepath.Separator))
	for i := len(parts) - 2; i >= 0; i-- {
		if parts[i] == "pods" && i+2 < len(parts) && parts[i+2] == "volumes" {
			return parts[i+1]
		}
	}
	if slices.Contains(parts, "volumeDevices") {
		return parts[len(parts)-1]
	}
	return ""
}

// mapsWith is m with key set to value, m allocated when nil.
func mapsWith(m map[string]string, key, value string) map[string]string {
	if m == nil {
		m = map[string]string{}
	}
	m[key] = value
	return m
}
