package lvm

import (
	"os"
	"path/filepath"
	"testing"
)

func readTestdata(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The testdata JSON was recorded in the kernel-test guest (lvm 2.03.16,
// Debian bookworm) with the backend's flags and a superset of its fields
// (lvs -a, so hidden sub-LVs appear too).
func TestParseRecordedReports(t *testing.T) {
	vgs, err := ParseVGs(readTestdata(t, "vgs-thin.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(vgs) != 1 {
		t.Fatalf("vgs rows = %d", len(vgs))
	}
	vg := vgs[0]
	if vg.Name != "plinthvg" || vg.SizeBytes != 4290772992 || vg.FreeBytes != 2063597568 || vg.ExtentBytes != 4194304 || vg.LVCount != 5 || vg.PVCount != 1 {
		t.Errorf("vg = %+v", vg)
	}
	lvs, err := ParseLVs(readTestdata(t, "lvs-thin.json"))
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]LV{}
	for _, lv := range lvs {
		byName[lv.Name] = lv
	}
	pool := byName["tpool"]
	if !pool.IsThinPool() || pool.SizeBytes != 2143289344 || pool.DataPercent != 0.98 || pool.MetadataPercent != 11.43 || pool.MetadataSizeBytes != 4194304 || !pool.Active {
		t.Errorf("pool = %+v", pool)
	}
	thin := byName["vol-fedcba9876543210fedcba9876543210fedcba98"]
	if !thin.IsThin() || thin.Pool != "tpool" || thin.SizeBytes != 104857600 || thin.DataPercent != 20 || !thin.HasTag(TagManaged) {
		t.Errorf("thin = %+v", thin)
	}
	lin := byName["vol-0123456789abcdef0123456789abcdef01234567"]
	if lin.Layout != "linear" || lin.SizeBytes != 67108864 || lin.Path != "/dev/plinthvg/vol-0123456789abcdef0123456789abcdef01234567" ||
		lin.DMPath != "/dev/mapper/plinthvg-vol--0123456789abcdef0123456789abcdef01234567" {
		t.Errorf("linear = %+v", lin)
	}
	if f := byName["foreign"]; f.HasTag(TagManaged) || len(f.Tags) != 0 {
		t.Errorf("foreign = %+v", f)
	}
	if _, ok := byName["[tpool_tdata]"]; !ok {
		t.Errorf("hidden LVs of lvs -a missing: %v", byName)
	}

	inactive, err := ParseLVs(readTestdata(t, "lvs-inactive.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, lv := range inactive {
		if lv.Name == "foreign" && lv.Active {
			t.Errorf("foreign should be inactive: %+v", lv)
		}
	}
	for _, f := range []string{"vgs-empty.json", "lvs-empty.json"} {
		if _, err := ParseVGs(readTestdata(t, f)); err != nil {
			t.Errorf("%s: %v", f, err)
		}
		if _, err := ParseLVs(readTestdata(t, f)); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}

// lvs with a segment field prints a row per segment; the parser keeps one.
func TestParseDedupesSegments(t *testing.T) {
	in := `{"report":[{"lv":[{"lv_name":"a","vg_name":"v","lv_size":"8"},{"lv_name":"a","vg_name":"v","lv_size":"8"},{"lv_name":"b","vg_name":"v"}]}]}`
	lvs, err := ParseLVs([]byte(in))
	if err != nil || len(lvs) != 2 {
		t.Fatalf("%+v %v", lvs, err)
	}
}

func TestParseBad(t *testing.T) {
	for _, in := range []string{
		``, `{`, `{"report":[{"vg":[{"vg_name":"a","vg_size":"12x"}]}]}`,
		`{"report":[{"vg":[{"vg_size":"1"}]}]}`,
		`{"report":[{"vg":[{"vg_name":"a","vg_free":"-1"}]}]}`,
		`{"report":[{"lv":[{"lv_name":"a","data_percent":"101"}]}]}`,
		`{"report":[{"lv":[{"lv_name":"a","lv_size":"99999999999999999999"}]}]}`,
	} {
		_, errV := ParseVGs([]byte(in))
		_, errL := ParseLVs([]byte(in))
		if errV == nil && errL == nil {
			t.Errorf("no error for %q", in)
		}
	}
}

func BenchmarkParseLVs(b *testing.B) {
	data := readTestdata(b, "lvs-thin.json")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseLVs(data); err != nil {
			b.Fatal(err)
		}
	}
}
