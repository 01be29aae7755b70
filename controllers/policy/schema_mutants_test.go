package policy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/controllers/policy"
	cueschema "github.com/plinth-storage/plinth/schema/cue"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	"github.com/plinth-storage/plinth/schema/vet"
	"github.com/plinth-storage/plinth/schema/vet/vettest"
)

// mutantResource is where each policy kind is applied.
var mutantResource = map[string]schema.GroupVersionResource{
	"StoragePool": policyv1.GroupVersion.WithResource("storagepools"),
	"Protocol":    policyv1.GroupVersion.WithResource("protocols"),
	"Placement":   policyv1.GroupVersion.WithResource("placements"),
}

// TestMisspelledUnknownOrMistypedFieldsAreRefusedByTheAPIServerAndTheController applies the
// mutants the CUE schema generates (schema/vet/vettest: every field of every policy kind
// misspelled, with an unknown sibling, with a value of the wrong type) to the real
// kube-apiserver with Plinth's CRDs, by server-side apply with fieldValidation=Strict (dry
// run), as Flux applies them, and wants plinth vet's verdict on each. Metadata is no
// exception: server-side apply refuses a metadata key ObjectMeta does not declare (it cannot
// build the typed patch), so the schema's metadata is closed too. The name an apply targets is
// the document's metadata.name, as for kubectl and Flux: a document without a string name is
// refused before any request.
//
// The controller's vet (KeptVetter, the reconciler's path with its verdicts kept by
// resourceVersion) judges what the API server stored: the base documents are applied, read
// back through a client as the reconciler reads them and judged twice (anew, then kept), and
// so is each mutant the API server accepts (none while every layer refuses them all). A mutant
// the API server refuses never reaches the controller. schema/vet's test holds plinth vet and
// `cue vet` to the same verdicts.
func TestMisspelledUnknownOrMistypedFieldsAreRefusedByTheAPIServerAndTheController(t *testing.T) {
	c := env(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dyn, err := dynamic.NewForConfig(suite.cp.Admin.Config)
	if err != nil {
		t.Fatal(err)
	}
	s, err := cueschema.Compile()
	if err != nil {
		t.Fatal(err)
	}
	mutants, err := vettest.Mutants(s)
	if err != nil {
		t.Fatal(err)
	}
	v, err := vet.NewVetter()
	if err != nil {
		t.Fatal(err)
	}
	bases, err := vettest.Bases()
	if err != nil {
		t.Fatal(err)
	}
	// The base documents pass every layer: the API server, and the controller's vet on the
	// objects the API server stored.
	var pools []policyv1.StoragePool
	var protos []policyv1.Protocol
	var places []policyv1.Placement
	for _, b := range bases {
		data, _ := json.Marshal(b.Tree)
		if err := apply(ctx, dyn, b.Kind, b.Tree, data, false); err != nil {
			t.Fatalf("the API server refuses base %s/%s: %v", b.Kind, b.Name, err)
		}
		switch b.Kind {
		case "StoragePool":
			_, pools = readBack(t, ctx, c, b.Name, append(pools, policyv1.StoragePool{ObjectMeta: metav1.ObjectMeta{Name: b.Name}}))
		case "Protocol":
			_, protos = readBack(t, ctx, c, b.Name, append(protos, policyv1.Protocol{ObjectMeta: metav1.ObjectMeta{Name: b.Name}}))
		case "Placement":
			_, places = readBack(t, ctx, c, b.Name, append(places, policyv1.Placement{ObjectMeta: metav1.ObjectMeta{Name: b.Name}}))
		}
	}
	defer func() {
		for _, b := range bases {
			u := &unstructured.Unstructured{}
			u.SetGroupVersionKind(policyv1.GroupVersion.WithKind(b.Kind))
			u.SetName(b.Name)
			if err := c.Delete(context.Background(), u); err != nil && !apierrors.IsNotFound(err) {
				t.Error(err)
			}
		}
	}()
	kv := policy.NewKeptVetter(v)
	for _, how := range []string{"anew", "kept"} {
		if _, problems := kv.VetObjects(pools, protos, places); len(problems) > 0 {
			t.Fatalf("the controller's vet (%s) refuses the base documents: %v", how, problems)
		}
	}
	if n := policy.KeptJudged(kv); n != len(bases) {
		t.Errorf("the controller's vet judged %d objects over two passes, want %d (the second pass kept)", n, len(bases))
	}

	var refusedByServer, reachedController int
	for _, m := range mutants {
		vetRefuses := len(v.Judge(vet.LoadBytes("mutant.yaml", m.YAML).Documents[0]).Problems) > 0
		if vetRefuses != m.SchemaRefuses {
			t.Errorf("%s: plinth vet refused=%v, the schema's verdict is refused=%v", m, vetRefuses, m.SchemaRefuses)
		}
		var tree map[string]any
		if err := json.Unmarshal(m.JSON, &tree); err != nil {
			t.Fatal(err)
		}
		serverErr := apply(ctx, dyn, m.Field.Kind, tree, m.JSON, true)
		if (serverErr != nil) != vetRefuses {
			t.Errorf("%s: API server error %v, plinth vet refused=%v\n%s", m, serverErr, vetRefuses, m.YAML)
			continue
		}
		if serverErr != nil {
			refusedByServer++
			continue
		}
		// Accepted by the API server: the controller reads what it stored.
		reachedController++
		if err := apply(ctx, dyn, m.Field.Kind, tree, m.JSON, false); err != nil {
			t.Fatalf("%s: the dry run passed, the apply fails: %v", m, err)
		}
		got := controllerVerdict(t, ctx, c, v, m, pools, protos, places)
		if got != vetRefuses {
			t.Errorf("%s: the controller's vet refused=%v, plinth vet refused=%v", m, got, vetRefuses)
		}
	}
	var schemaAccepts int
	for _, m := range mutants {
		if !m.SchemaRefuses {
			schemaAccepts++
		}
	}
	t.Logf("%d mutants: %d refused by the API server, %d accepted and judged by the controller's vet",
		len(mutants), refusedByServer, reachedController)
	if refusedByServer+reachedController != len(mutants) || reachedController != schemaAccepts {
		t.Errorf("%d refused by the API server and %d judged by the controller, want %d and %d",
			refusedByServer, reachedController, len(mutants)-schemaAccepts, schemaAccepts)
	}
}

// apply server-side applies data (tree, as JSON) as the policy kind's resource named by
// tree's metadata.name, with strict field validation; dryRun leaves nothing behind.
func apply(ctx context.Context, dyn dynamic.Interface, kind string, tree map[string]any, data []byte, dryRun bool) error {
	md, _ := tree["metadata"].(map[string]any)
	name, _ := md["name"].(string)
	if name == "" {
		return fmt.Errorf("the document has no metadata.name: kubectl and Flux cannot name the object")
	}
	o := metav1.PatchOptions{FieldManager: "plinth-schema-mutants", Force: new(bool), FieldValidation: metav1.FieldValidationStrict}
	*o.Force = true
	if dryRun {
		o.DryRun = []string{metav1.DryRunAll}
	}
	_, err := dyn.Resource(mutantResource[kind]).Patch(ctx, name, types.ApplyPatchType, data, o)
	return err
}

// controllerVerdict reads the object m's apply stored as the controller does (a typed client),
// judges it with the base set by a KeptVetter twice (anew, then kept), deletes it, and reports
// whether the controller's vet refuses it.
func controllerVerdict(t *testing.T, ctx context.Context, c client.Client, v *vet.Vetter, m vettest.Mutant,
	pools []policyv1.StoragePool, protos []policyv1.Protocol, places []policyv1.Placement) bool {
	t.Helper()
	var obj client.Object
	switch m.Field.Kind {
	case "StoragePool":
		obj, pools = readBack(t, ctx, c, m.Name, pools)
	case "Protocol":
		obj, protos = readBack(t, ctx, c, m.Name, protos)
	case "Placement":
		obj, places = readBack(t, ctx, c, m.Name, places)
	}
	defer func() {
		if err := c.Delete(ctx, obj); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
	}()
	kv := policy.NewKeptVetter(v)
	var verdicts [2]bool
	for i := range verdicts {
		_, problems := kv.VetObjects(pools, protos, places)
		for _, p := range problems {
			if p.Kind == m.Field.Kind && p.Name == m.Name {
				verdicts[i] = true
			}
		}
		if len(problems) > 0 && !verdicts[i] {
			t.Errorf("%s: the controller's vet finds problems in other objects: %v", m, problems)
		}
	}
	if verdicts[0] != verdicts[1] {
		t.Errorf("%s: the controller's vet refused=%v anew and %v kept", m, verdicts[0], verdicts[1])
	}
	return verdicts[0]
}

// readBack reads the object named name through c and returns it with list, a copy where it
// replaces the element of the same name.
func readBack[T any, P interface {
	*T
	client.Object
}](t *testing.T, ctx context.Context, c client.Client, name string, list []T) (client.Object, []T) {
	t.Helper()
	o := P(new(T))
	if err := c.Get(ctx, client.ObjectKey{Name: name}, o); err != nil {
		t.Fatal(err)
	}
	out := append([]T(nil), list...)
	for i := range out {
		if P(&out[i]).GetName() == name {
			out[i] = *o
		}
	}
	return o, out
}
