package csi_test

import (
	"context"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// fakeAgent is a TEST DOUBLE of the node agent (agents/agent), used only for the controller
// tests here: it fills in VolumeState status on the real API server the way the contract in
// docs/design.md ("Contracts between the parts", VolumeState) says the agent does (finalizer,
// Ready with actualBytes at the current generation, export for NVMe-oF,
// observedPublicationGeneration, Failed/InsufficientCapacity when its own idea of free space is
// too small, finalizer released on delete). It touches no kernel. The csi-sanity and sidecar
// tests run the real agent instead.
type fakeAgent struct {
	c client.WithWatch

	mu   sync.Mutex
	free map[string]int64 // store name → bytes the "backend" really has; absent = unlimited
	// seen and done are when the fake saw a VolumeState first and when it reported it Ready:
	// done − seen is the agent's own work that CreateVolume waits for.
	seen, done map[string]time.Time
	// wrote holds, per VolumeState, the resourceVersions of the fake's own writes.
	wrote map[string]map[string]bool
}

// written records the resourceVersion of one of the fake's own writes of vs.
func (a *fakeAgent) written(vs *storev1.VolumeState) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.wrote[vs.Name] == nil {
		a.wrote[vs.Name] = map[string]bool{}
	}
	a.wrote[vs.Name][vs.ResourceVersion] = true
}

const fakeFinalizer = "test.plinth.dev/fake-agent"

// fakeIgnore labels VolumeStates the fake leaves alone (the benchmark's API baseline writes).
const fakeIgnore = "test.plinth.dev/fake-agent-ignore"

func startFakeAgent(t testing.TB, c client.WithWatch) *fakeAgent {
	t.Helper()
	a := &fakeAgent{c: c, free: map[string]int64{}, seen: map[string]time.Time{}, done: map[string]time.Time{}, wrote: map[string]map[string]bool{}}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		for ctx.Err() == nil {
			w, err := c.Watch(ctx, &storev1.VolumeStateList{})
			if err != nil {
				time.Sleep(100 * time.Millisecond)
				continue
			}
			for ev := range w.ResultChan() {
				if ev.Type == watch.Error {
					break
				}
				vs, ok := ev.Object.(*storev1.VolumeState)
				if !ok || ev.Type == watch.Deleted || vs.Labels[fakeIgnore] != "" {
					continue
				}
				a.mu.Lock()
				if _, ok := a.seen[vs.Name]; !ok {
					a.seen[vs.Name] = time.Now() // first sight: when the watch delivers it
				}
				echo := a.wrote[vs.Name][vs.ResourceVersion]
				a.mu.Unlock()
				// The echo of the fake's own write needs no work; skipping it keeps the
				// fake's serial loop from delaying the next volume's first sight (a real
				// agent reads its informer cache, where an echo costs no API round trip).
				if !echo {
					a.reconcile(ctx, vs.Name)
				}
			}
			w.Stop()
		}
	}()
	t.Cleanup(func() { cancel(); <-stopped })
	return a
}

func (a *fakeAgent) setFree(store string, bytes int64) {
	a.mu.Lock()
	a.free[store] = bytes
	a.mu.Unlock()
}

func (a *fakeAgent) work(name string) (time.Duration, bool) {
	s, d, ok := a.times(name)
	return d.Sub(s), ok
}

// times returns when the fake first saw the VolumeState name and when it reported it Ready.
func (a *fakeAgent) times(name string) (seen, done time.Time, ok bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	s, ok1 := a.seen[name]
	d, ok2 := a.done[name]
	return s, d, ok1 && ok2
}

func (a *fakeAgent) reconcile(ctx context.Context, name string) {
	vs := &storev1.VolumeState{}
	if err := a.c.Get(ctx, client.ObjectKey{Name: name}, vs); err != nil {
		return
	}
	if vs.DeletionTimestamp != nil {
		// its own finalizer, and the agent's that CreateVolume sets for the agent to release
		ownRemoved := controllerutil.RemoveFinalizer(vs, fakeFinalizer)
		if controllerutil.RemoveFinalizer(vs, storev1.FinalizerVolume) || ownRemoved {
			a.mu.Lock()
			if f, ok := a.free[vs.Spec.StoreName]; ok {
				a.free[vs.Spec.StoreName] = f + vs.Status.ActualBytes
			}
			delete(a.seen, name)
			delete(a.done, name)
			delete(a.wrote, name)
			a.mu.Unlock()
			_ = a.c.Update(ctx, vs)
		}
		return
	}
	if controllerutil.AddFinalizer(vs, fakeFinalizer) {
		if err := a.c.Update(ctx, vs); err != nil {
			return
		}
		a.written(vs)
	}
	st := &vs.Status
	if st.ObservedGeneration == vs.Generation && st.ObservedPublicationGeneration == vs.Spec.PublicationGeneration && st.Phase == storev1.VolumeReady {
		return
	}
	grow := vs.Spec.CapacityBytes - st.ActualBytes
	a.mu.Lock()
	f, limited := a.free[vs.Spec.StoreName]
	enough := !limited || f >= grow
	if enough && limited && grow > 0 {
		a.free[vs.Spec.StoreName] = f - grow
	}
	a.mu.Unlock()
	if !enough {
		if st.ActualBytes == 0 {
			st.Phase = storev1.VolumeFailed
		}
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: "Ready", Status: metav1.ConditionFalse, Reason: storev1.ReasonInsufficientCapacity,
			Message: "fake agent: no room", ObservedGeneration: vs.Generation})
		_ = a.c.Status().Update(ctx, vs)
		return
	}
	if grow > 0 {
		st.ActualBytes = vs.Spec.CapacityBytes
	}
	st.DevicePath = "/dev/fake/" + vs.Name
	if vs.Spec.Policy.ProtocolSpec.NVMeoFTCP != nil {
		st.Export = &storev1.Export{NQN: "nqn.2014-08.dev.plinth:" + vs.Name, Address: "127.0.0.1", Port: 4420}
	}
	st.Phase = storev1.VolumeReady
	st.ObservedGeneration = vs.Generation
	st.ObservedPublicationGeneration = vs.Spec.PublicationGeneration
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: "Ready", Status: metav1.ConditionTrue, Reason: "Ready", Message: "fake agent", ObservedGeneration: vs.Generation})
	if err := a.c.Status().Update(ctx, vs); err != nil {
		if !apierrors.IsConflict(err) {
			return
		}
	} else {
		a.written(vs)
	}
	a.mu.Lock()
	if _, ok := a.done[name]; !ok {
		a.done[name] = time.Now()
	}
	a.mu.Unlock()
}
