package render

import (
	"reflect"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
)

func TestAttributesClassesCarryTheirPlacementAndLimits(t *testing.T) {
	n := func(v int64) *int64 { return &v }
	pl := policyv1.Placement{ObjectMeta: metav1.ObjectMeta{Name: "fast"}, Spec: policyv1.PlacementSpec{
		AttributesClasses: []policyv1.AttributesClassTemplate{
			{Name: "gold", Limits: policyv1.IOLimits{ReadIOPS: n(2000), WriteBytesPerSecond: n(8 << 20)}},
			{Name: "bronze", Limits: policyv1.IOLimits{WriteIOPS: n(100)}},
		}}}
	got := attributesClasses(&pl)
	if len(got) != 2 || got[0].Name != "gold" || got[1].Name != "bronze" {
		t.Fatalf("classes %+v, want gold then bronze", got)
	}
	if got[0].DriverName != policyv1.DriverName || got[0].Labels[policyv1.LabelPlacement] != "fast" {
		t.Errorf("gold: driver %q, labels %v", got[0].DriverName, got[0].Labels)
	}
	want := map[string]string{
		policyv1.AttributesClassPlacement: "fast", policyv1.AttributesClassName: "gold",
		policyv1.ParamReadIOPS: "2000", policyv1.ParamWriteBytesPerSecond: "8388608",
	}
	if !reflect.DeepEqual(got[0].Parameters, want) {
		t.Errorf("gold parameters %v, want %v", got[0].Parameters, want)
	}
	// What the CSI driver reads back is what the policy declared.
	ref, err := policyv1.ParseAttributesClassParameters(got[0].Parameters)
	if err != nil || ref.Class != "gold" || ref.Placement != "fast" || !ref.Limits.Equal(&pl.Spec.AttributesClasses[0].Limits) {
		t.Errorf("parsed %+v, %v", ref, err)
	}
	// Render lists them sorted, sourced from their Placement.
	out, err := Render(Input{Placements: []policyv1.Placement{pl}})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.VolumeAttributesClasses) != 2 || out.VolumeAttributesClasses[0].Name != "bronze" {
		t.Errorf("rendered %d classes, first %q", len(out.VolumeAttributesClasses), out.VolumeAttributesClasses[0].Name)
	}
	if src := out.Sources["VolumeAttributesClass/gold"]; !reflect.DeepEqual(src, []string{"Placement/fast"}) {
		t.Errorf("sources %v", src)
	}
}

func TestParseAttributesClassParametersRefusesWhatPlinthDoesNotRender(t *testing.T) {
	base := func() map[string]string {
		return map[string]string{policyv1.AttributesClassPlacement: "fast", policyv1.AttributesClassName: "gold"}
	}
	for name, tc := range map[string]struct {
		key, value string
		drop       string
	}{
		"unknown key":       {key: "plinth.dev/compression", value: "lz4"},
		"zero IOPS":         {key: policyv1.ParamWriteIOPS, value: "0"},
		"negative rate":     {key: policyv1.ParamReadBytesPerSecond, value: "-1"},
		"quantity":          {key: policyv1.ParamReadBytesPerSecond, value: "10Mi"},
		"beyond bound":      {key: policyv1.ParamReadIOPS, value: "100000001"},
		"missing placement": {drop: policyv1.AttributesClassPlacement},
		"missing class":     {drop: policyv1.AttributesClassName},
	} {
		t.Run(name, func(t *testing.T) {
			p := base()
			if tc.key != "" {
				p[tc.key] = tc.value
			}
			delete(p, tc.drop)
			if _, err := policyv1.ParseAttributesClassParameters(p); err == nil {
				t.Errorf("accepted %v", p)
			}
		})
	}
}
