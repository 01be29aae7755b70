package adopt

import (
	"context"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"sigs.k8s.io/controller-runtime/pkg/client"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/schema/vet"
)

// Scheme holds the kinds adopt reads and writes: core, apps, Plinth's policy and runtime APIs.
func Scheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme, policyv1.AddToScheme, storev1.AddToScheme} {
		if err := add(s); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Git is what the checkout declares: its Placements and its claims (PVCs, and the claims of
// StatefulSets' volumeClaimTemplates, <template>-<set>-<ordinal> for each replica).
type Git struct {
	Placements map[string]bool
	Claims     []*Claim
}

// LoadGit reads the checkout at paths with the code of `plinth vet` (kustomize overlays built
// as Flux would). Errors: I/O, a policy set with problems (each with file:line), a PVC or
// StatefulSet that does not decode.
func LoadGit(paths []string) (*Git, error) {
	set, err := vet.Load(paths...)
	if err != nil {
		return nil, err
	}
	v, err := vet.NewVetter()
	if err != nil {
		return nil, err
	}
	pol, problems := v.Vet(set)
	if len(problems) > 0 {
		return nil, fmt.Errorf("the checkout's policy does not vet (plinth vet %v): %s", paths, problems[0].String())
	}
	g := &Git{Placements: map[string]bool{}}
	for _, pl := range pol.Placements {
		g.Placements[pl.Name] = true
	}
	scheme, err := Scheme()
	if err != nil {
		return nil, err
	}
	dec := serializer.NewCodecFactory(scheme).UniversalDeserializer()
	for _, d := range pol.Others {
		switch d.Kind {
		case "PersistentVolumeClaim":
			var pvc corev1.PersistentVolumeClaim
			if _, _, err := dec.Decode(d.YAML, nil, &pvc); err != nil {
				return nil, fmt.Errorf("%s:%d: PersistentVolumeClaim: %w", d.File, d.Line, err)
			}
			c := claimOf(&pvc.ObjectMeta, pvc.Spec)
			c.InGit, c.File, c.Line = true, d.File, d.Line
			g.Claims = append(g.Claims, c)
		case "StatefulSet":
			var sts appsv1.StatefulSet
			if _, _, err := dec.Decode(d.YAML, nil, &sts); err != nil {
				return nil, fmt.Errorf("%s:%d: StatefulSet: %w", d.File, d.Line, err)
			}
			replicas := int32(1)
			if sts.Spec.Replicas != nil {
				replicas = *sts.Spec.Replicas
			}
			for _, t := range sts.Spec.VolumeClaimTemplates {
				for i := int32(0); i < replicas; i++ {
					meta := t.ObjectMeta
					meta.Name = fmt.Sprintf("%s-%s-%d", t.Name, sts.Name, i)
					meta.Namespace = sts.Namespace
					c := claimOf(&meta, t.Spec)
					c.InGit, c.File, c.Line = true, d.File, d.Line
					g.Claims = append(g.Claims, c)
				}
			}
		}
	}
	return g, nil
}

func claimOf(meta interface {
	GetNamespace() string
	GetName() string
	GetAnnotations() map[string]string
}, spec corev1.PersistentVolumeClaimSpec) *Claim {
	ns := meta.GetNamespace()
	if ns == "" {
		ns = corev1.NamespaceDefault
	}
	c := &Claim{Namespace: ns, Name: meta.GetName(), AccessModes: spec.AccessModes, Annotations: meta.GetAnnotations()}
	if spec.StorageClassName != nil {
		c.StorageClass = *spec.StorageClassName
	}
	if spec.VolumeMode != nil {
		c.VolumeMode = string(*spec.VolumeMode)
	}
	if q, ok := spec.Resources.Requests[corev1.ResourceStorage]; ok {
		c.RequestBytes = q.Value()
	}
	return c
}

// LoadInput reads the live cluster (policies, Stores' unclaimed lists, VolumeState names,
// PVCs, PVs) and merges git into it: a claim in both takes the cluster's UID, phase and
// volume and the checkout's position. Only reads.
func LoadInput(ctx context.Context, c client.Reader, git *Git) (Input, error) {
	in := Input{Placements: map[string]*policyv1.Placement{}, Pools: map[string]*policyv1.StoragePool{},
		Protocols: map[string]*policyv1.Protocol{}, GitPlacements: git.Placements, Claims: map[string]*Claim{},
		VolumeStates: map[string]bool{}, PVs: map[string]*corev1.PersistentVolume{}, Omitted: map[string]int32{}}
	var pls policyv1.PlacementList
	var pools policyv1.StoragePoolList
	var protos policyv1.ProtocolList
	var stores storev1.StoreList
	var vss storev1.VolumeStateList
	var pvcs corev1.PersistentVolumeClaimList
	var pvs corev1.PersistentVolumeList
	for _, l := range []client.ObjectList{&pls, &pools, &protos, &stores, &vss, &pvcs, &pvs} {
		if err := c.List(ctx, l); err != nil {
			return in, fmt.Errorf("list %T: %w", l, err)
		}
	}
	for i := range pls.Items {
		in.Placements[pls.Items[i].Name] = &pls.Items[i]
	}
	for i := range pools.Items {
		in.Pools[pools.Items[i].Name] = &pools.Items[i]
	}
	for i := range protos.Items {
		in.Protocols[protos.Items[i].Name] = &protos.Items[i]
	}
	for _, s := range stores.Items {
		for _, u := range s.Status.Unclaimed {
			in.Candidates = append(in.Candidates, Candidate{Store: s.Name, Node: s.Spec.NodeName, Pool: s.Spec.Pool, StoreUID: string(s.UID), Volume: u})
		}
		if s.Status.UnclaimedOmitted > 0 {
			in.Omitted[s.Name] = s.Status.UnclaimedOmitted
		}
	}
	for _, vs := range vss.Items {
		in.VolumeStates[vs.Name] = true
	}
	for i := range pvs.Items {
		in.PVs[pvs.Items[i].Name] = &pvs.Items[i]
	}
	for i := range pvcs.Items {
		p := &pvcs.Items[i]
		cl := claimOf(p, p.Spec)
		cl.UID, cl.Phase, cl.VolumeName = p.UID, p.Status.Phase, p.Spec.VolumeName
		in.Claims[cl.Key()] = cl
	}
	for _, g := range git.Claims {
		if live := in.Claims[g.Key()]; live != nil {
			live.InGit, live.File, live.Line = true, g.File, g.Line
			continue
		}
		in.Claims[g.Key()] = g
	}
	return in, nil
}
