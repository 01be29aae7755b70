package render_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/fluxcd/pkg/ssa"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/plinth-storage/plinth/controllers/inventory"
	"github.com/plinth-storage/plinth/controllers/plan"
	"github.com/plinth-storage/plinth/controllers/render"
)

// jsonCluster is a cluster of the objects last applied, by "Kind/name", as their JSON: its
// cache holds an object when the JSON is the render's. Each write is delivered to events, as
// the informers' handlers do.
type jsonCluster struct {
	live   map[string]string
	events *plan.Events
}

func (c *jsonCluster) write(key, doc string) {
	c.live[key] = doc
	kind, name, _ := strings.Cut(key, "/")
	c.events.Changed(kind, name)
}

func (c *jsonCluster) Get(_ context.Context, gvk schema.GroupVersionKind, name string) (*unstructured.Unstructured, error) {
	doc, ok := c.live[gvk.Kind+"/"+name]
	if !ok {
		return nil, nil
	}
	u := &unstructured.Unstructured{}
	return u, json.Unmarshal([]byte(doc), &u.Object)
}

func (c *jsonCluster) state(u *unstructured.Unstructured) plan.CacheState {
	doc, ok := c.live[u.GetKind()+"/"+u.GetName()]
	if !ok {
		return plan.CacheAbsent
	}
	if b, _ := json.Marshal(u.Object); string(b) == doc {
		return plan.CacheHolds
	}
	return plan.CacheDiffers
}

func (c *jsonCluster) Cached(_ context.Context, u *unstructured.Unstructured) plan.CacheState {
	return c.state(u)
}

func (c *jsonCluster) DryRun(_ context.Context, objs []*unstructured.Unstructured) ([]plan.DryRun, error) {
	out := make([]plan.DryRun, len(objs))
	for i, u := range objs {
		switch c.state(u) {
		case plan.CacheAbsent:
			out[i].Action = ssa.CreatedAction
		case plan.CacheHolds:
			out[i].Action = ssa.UnchangedAction
		default:
			out[i] = plan.DryRun{Action: ssa.ConfiguredAction, Fields: []string{"spec"}}
		}
	}
	return out, nil
}

func (c *jsonCluster) ClassUsage(context.Context, string) (plan.Usage, error) {
	return plan.Usage{Known: true}, nil
}

func (c *jsonCluster) StoreUsage(context.Context, string) (plan.Usage, error) {
	return plan.Usage{Known: true}, nil
}

// TestRendererPlanMatchesCold: the Renderer's kept objects (Renderer.Unstructured) planned with
// plan.Kept and plan.Events give at every step of TestRendererMatchesRender's random sequences
// the plan a cold render planned with nothing kept gives — so an object the Renderer rendered
// anew but handed out under a kept pointer (whose kept digest and verdict the plan would
// trust) fails here. Between steps the plan is carried out, and now and then a live object is
// changed or deleted by someone else; the plan must catch that too.
func TestRendererPlanMatchesCold(t *testing.T) {
	ctx := context.Background()
	for _, seed := range []uint64{1, 2} {
		t.Run(fmt.Sprintf("seed%d", seed), func(t *testing.T) {
			in, next := render.RandomSets(seed)
			c := &jsonCluster{live: map[string]string{}, events: plan.NewEvents("StorageClass", "Agent", "Store")}
			kept := plan.Kept{Events: c.events}
			var r render.Renderer
			prev := inventory.New()
			planned, drifted := 0, 0
			for step := 0; step < 300; step++ {
				op := "initial"
				if step > 0 {
					in, op = next()
				}
				out, err := r.Render(in)
				cold, cerr := render.Render(in)
				if err != nil || cerr != nil {
					continue // TestRendererMatchesRender holds the errors equal
				}
				desired, err := r.Unstructured(out)
				if err != nil {
					t.Fatal(err)
				}
				coldDesired, err := cold.Unstructured()
				if err != nil {
					t.Fatal(err)
				}
				p, err := plan.Make(ctx, plan.Input{Desired: desired, Sources: out.Sources, Previous: prev, Kept: &kept}, c)
				if err != nil {
					t.Fatal(err)
				}
				cp, err := plan.Make(ctx, plan.Input{Desired: coldDesired, Sources: cold.Sources, Previous: prev}, c)
				if err != nil {
					t.Fatal(err)
				}
				if got, want := planString(p), planString(cp); got != want {
					t.Fatalf("step %d (%s): the kept plan differs from the cold one:\n%s\ncold:\n%s", step, op, got, want)
				}
				planned++
				prev = p.Inventory()
				for i := range p.Objects {
					if o := &p.Objects[i]; o.Apply() {
						b, err := json.Marshal(o.Object.Object)
						if err != nil {
							t.Fatal(err)
						}
						c.write(o.Key(), string(b))
					}
				}
				for _, pr := range p.Prunes {
					delete(c.live, pr.Entry.String())
					c.events.Changed(pr.Entry.Kind, pr.Entry.Name)
				}
				// Someone else changes a live Agent (always corrected) now and then.
				if step%7 == 3 && len(out.Agents) > 0 {
					key := "Agent/" + out.Agents[step%len(out.Agents)].Name
					if step%2 == 0 {
						c.write(key, `{"apiVersion":"storage.plinth.dev/v1alpha1","kind":"Agent","metadata":{"name":"x"}}`)
					} else {
						delete(c.live, key)
						kind, name, _ := strings.Cut(key, "/")
						c.events.Changed(kind, name)
					}
					drifted++
				}
			}
			if planned < 100 || drifted < 20 {
				t.Errorf("%d steps planned, %d with a live Agent changed: too few to tell", planned, drifted)
			}
		})
	}
}

// planString is a plan as comparable text.
func planString(p *plan.Plan) string {
	var b strings.Builder
	for i := range p.Objects {
		o := &p.Objects[i]
		fmt.Fprintf(&b, "%s %s %+v owners=%v correct=%v immutable=%v fields=%v\n", o.Key(), o.Action, o.Entry, o.Owners, o.Correct, o.KeptImmutable, o.Fields)
	}
	for i := range p.Classes {
		fmt.Fprintf(&b, "class %s %v %v\n", p.Classes[i].Desired.Name, p.Classes[i].Allowed, p.Classes[i].Immutable)
	}
	for i := range p.Prunes {
		fmt.Fprintf(&b, "prune %s %s\n", p.Prunes[i].Entry, p.Prunes[i].Verdict)
	}
	b.WriteString(p.Rendered.Encode())
	return b.String()
}
