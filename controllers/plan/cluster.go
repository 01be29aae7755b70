package plan

import (
	"context"
	"errors"

	"github.com/fluxcd/pkg/ssa"
	"golang.org/x/sync/errgroup"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/controllers/drift"
)

// Counter counts what uses a StorageClass, a VolumeAttributesClass or a Store: the controller from its informer
// cache's field indexes, `plinth diff` from lists it read once.
type Counter interface {
	ClassUsage(ctx context.Context, name string) (Usage, error)
	AttributesClassUsage(ctx context.Context, name string) (Usage, error)
	StoreUsage(ctx context.Context, name string) (Usage, error)
}

// Cluster is the Source of a live cluster, shared by the controller and `plinth diff` so both
// plan through the same reads and the same dry-run.
type Cluster struct {
	Counter
	// Reader reads live objects from the API server (not a cache: a replacement or prune
	// must see the object as it is now).
	Reader client.Reader
	// Cache, when set, answers Cached from an informer cache; nil sends every object
	// through the dry-run.
	Cache client.Client
	// Manager runs the dry-runs under the controller's field manager.
	Manager *ssa.ResourceManager
	// Concurrency bounds the dry-runs in flight (default 4): the API server serves them in
	// parallel, and a no-op reconcile of 1,000 objects is 2,000 reads and dry-runs.
	Concurrency int
	// Kept, when set, is the Kept of the Input planned with this Cluster: Cached keeps its
	// answer per rendered object and live resourceVersion there.
	Kept *Kept

	// scratch holds one typed object per kind that Cached reads the cache into: a plan reads
	// tens of thousands of objects and keeps none of them. Cached is not safe for concurrent
	// use (Make calls it from one goroutine).
	scratch map[schema.GroupVersionKind]client.Object
}

// Get implements Source.
func (c *Cluster) Get(ctx context.Context, gvk schema.GroupVersionKind, name string) (*unstructured.Unstructured, error) {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(gvk)
	err := c.Reader.Get(ctx, types.NamespacedName{Name: name}, u)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return u, nil
}

// Cached implements Source from the informer cache (Cache); CacheUnknown without one, for a
// kind the scheme does not know, or on a read error other than not found.
func (c *Cluster) Cached(ctx context.Context, u *unstructured.Unstructured) CacheState {
	obj, err := c.cachedObject(ctx, u)
	if err != nil {
		if apierrors.IsNotFound(err) {
			return CacheAbsent
		}
		return CacheUnknown
	}
	k, lv := c.Kept.of(u), versionOfLive(obj.GetUID(), obj.GetResourceVersion())
	if k != nil && k.cache.is(lv) {
		return k.cacheState
	}
	obj.GetObjectKind().SetGroupVersionKind(u.GroupVersionKind()) // typed cache objects carry no TypeMeta
	live, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return CacheUnknown
	}
	st := CacheDiffers
	if drift.Subset(u.Object, live) {
		st = CacheHolds
	}
	if k != nil {
		k.cache, k.cacheState = lv, st
	}
	return st
}

// cachedVersion returns the UID and resourceVersion of the informer cache's copy of u's live
// object; false without a cache, for a kind it does not hold, or an object it does not have.
func (c *Cluster) cachedVersion(ctx context.Context, u *unstructured.Unstructured) (liveVersion, bool) {
	obj, err := c.cachedObject(ctx, u)
	if err != nil {
		return liveVersion{}, false
	}
	return versionOfLive(obj.GetUID(), obj.GetResourceVersion()), true
}

// errNoCache says the informer cache cannot answer for an object: there is none, or the
// scheme does not know its kind.
var errNoCache = errors.New("no informer cache for this kind")

// cachedObject is a shallow copy of the informer cache's copy of u's live object (its maps and
// slices are the cache's: read it, never modify it; its TypeMeta is its own), valid until the
// next call: it is this Cluster's scratch object of u's kind. The error is the cache's (not
// found included), or errNoCache.
func (c *Cluster) cachedObject(ctx context.Context, u *unstructured.Unstructured) (client.Object, error) {
	if c.Cache == nil {
		return nil, errNoCache
	}
	gvk := u.GroupVersionKind()
	obj := c.scratch[gvk]
	if obj == nil {
		o, err := c.Cache.Scheme().New(gvk)
		if err != nil {
			return nil, errNoCache
		}
		var ok bool
		if obj, ok = o.(client.Object); !ok {
			return nil, errNoCache
		}
		if c.scratch == nil {
			c.scratch = map[schema.GroupVersionKind]client.Object{}
		}
		c.scratch[gvk] = obj
	}
	if err := c.Cache.Get(ctx, types.NamespacedName{Name: u.GetName()}, obj, client.UnsafeDisableDeepCopy); err != nil {
		return nil, err
	}
	return obj, nil
}

// DryRun implements Source with fluxcd/pkg/ssa's server-side dry-run diff.
func (c *Cluster) DryRun(ctx context.Context, objs []*unstructured.Unstructured) ([]DryRun, error) {
	out := make([]DryRun, len(objs))
	g, gctx := errgroup.WithContext(ctx)
	n := c.Concurrency
	if n <= 0 {
		n = 4
	}
	g.SetLimit(n)
	for i, u := range objs {
		g.Go(func() error {
			cse, live, merged, err := c.Manager.Diff(gctx, u, ssa.DefaultDiffOptions())
			switch {
			case err != nil:
				out[i] = DryRun{Err: err}
			case cse.Action == ssa.ConfiguredAction:
				out[i] = DryRun{Action: cse.Action, Fields: drift.Paths(live, merged)}
			default:
				out[i] = DryRun{Action: cse.Action}
			}
			return gctx.Err()
		})
	}
	return out, g.Wait()
}
