package lvm

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// encodeReport writes vgs and lvs back as lvm's JSON report (every field a string, as
// --reportformat json --units b --nosuffix prints them): the inverse of ParseVGs and ParseLVs.
func encodeReport(t *testing.T, vgs []VG, lvs []LV) []byte {
	t.Helper()
	i := func(v int64) string { return strconv.FormatInt(v, 10) }
	f := func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
	var vr, lr []map[string]string
	for _, vg := range vgs {
		vr = append(vr, map[string]string{
			"vg_name": vg.Name, "vg_uuid": vg.UUID, "vg_size": i(vg.SizeBytes), "vg_free": i(vg.FreeBytes),
			"vg_extent_size": i(vg.ExtentBytes), "vg_tags": strings.Join(vg.Tags, ","), "lv_count": i(vg.LVCount), "pv_count": i(vg.PVCount),
		})
	}
	for _, lv := range lvs {
		active := ""
		if lv.Active {
			active = "active"
		}
		lr = append(lr, map[string]string{
			"lv_name": lv.Name, "vg_name": lv.VG, "lv_uuid": lv.UUID, "lv_size": i(lv.SizeBytes), "lv_attr": lv.Attr,
			"lv_tags": strings.Join(lv.Tags, ","), "pool_lv": lv.Pool, "lv_layout": lv.Layout, "data_percent": f(lv.DataPercent),
			"metadata_percent": f(lv.MetadataPercent), "lv_metadata_size": i(lv.MetadataSizeBytes), "lv_path": lv.Path,
			"lv_dm_path": lv.DMPath, "lv_active": active, "lv_kernel_major": i(lv.KernelMajor), "lv_kernel_minor": i(lv.KernelMinor),
		})
	}
	type rep struct {
		VG []map[string]string `json:"vg,omitempty"`
		LV []map[string]string `json:"lv,omitempty"`
	}
	b, err := json.Marshal(map[string][]rep{"report": {{VG: vr, LV: lr}}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// FuzzParseReports feeds arbitrary vgs/lvs output (the recorded reports of the guest's lvm
// 2.03.16 as seeds) to ParseVGs and ParseLVs. Properties: no panic; an accepted row has a name,
// no negative byte count, percentages within 0..100 and device numbers of -1 (inactive) or
// more; each VG/LV appears once; and what was accepted, printed back as lvm prints it, parses
// to the same rows (so no field is half-read).
func FuzzParseReports(f *testing.F) {
	for _, n := range []string{"vgs-thin.json", "vgs-empty.json", "lvs-thin.json", "lvs-inactive.json", "lvs-empty.json"} {
		f.Add(readTestdata(f, n))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		vgs, errV := ParseVGs(data)
		lvs, errL := ParseLVs(data)
		if errV != nil {
			vgs = nil
		}
		if errL != nil {
			lvs = nil
		}
		for _, vg := range vgs {
			if vg.Name == "" || vg.SizeBytes < 0 || vg.FreeBytes < 0 || vg.ExtentBytes < 0 || vg.LVCount < 0 || vg.PVCount < 0 {
				t.Fatalf("accepted bad vg %+v", vg)
			}
		}
		seen := map[string]bool{}
		for _, lv := range lvs {
			if lv.Name == "" || lv.SizeBytes < 0 || lv.MetadataSizeBytes < 0 || lv.KernelMajor < -1 || lv.KernelMinor < -1 ||
				!(lv.DataPercent >= 0 && lv.DataPercent <= 100) || !(lv.MetadataPercent >= 0 && lv.MetadataPercent <= 100) {
				t.Fatalf("accepted bad lv %+v", lv)
			}
			if k := lv.VG + "/" + lv.Name; seen[k] {
				t.Fatalf("lv %s listed twice", k)
			} else {
				seen[k] = true
			}
		}
		enc := encodeReport(t, vgs, lvs)
		vgs2, err := ParseVGs(enc)
		if err != nil || !reflect.DeepEqual(vgs2, vgs) {
			t.Fatalf("vgs round trip through %s:\n got %+v, %v\nwant %+v", enc, vgs2, err, vgs)
		}
		lvs2, err := ParseLVs(enc)
		if err != nil || !reflect.DeepEqual(lvs2, lvs) {
			t.Fatalf("lvs round trip through %s:\n got %+v, %v\nwant %+v", enc, lvs2, err, lvs)
		}
	})
}

// FuzzParseThinPoolStatus feeds arbitrary thin-pool status lines (the kernel's, through
// DM_TABLE_STATUS) to parseThinPoolStatus. Properties: no panic; an accepted line with usage
// has 0 < total, used <= total and percentages within 0..100, and prints back (as the kernel
// prints it) to the same status; a lone word is the mode alone.
func FuzzParseThinPoolStatus(f *testing.F) {
	for _, s := range []string{
		"7 1089/2048 3277/13107 - rw no_discard_passdown queue_if_no_space - 1024",
		"0 10/1024 0/16384 - rw discard_passdown queue_if_no_space - 1024",
		"3 1024/1024 16384/16384 - out_of_data_space discard_passdown error_if_no_space needs_check 1024",
		"Fail", "Error", "", "1 2/0 3/4 - rw", "1 3/2 3/4 - rw", "x 1/2 3/4 - rw",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		st, err := parseThinPoolStatus(s)
		if err != nil {
			return
		}
		if len(strings.Fields(s)) == 1 {
			if st.mode != strings.TrimSpace(s) || st.totalData != 0 || st.totalMeta != 0 {
				t.Fatalf("one word %q parsed as %+v", s, st)
			}
			return
		}
		if st.totalData == 0 || st.totalMeta == 0 || st.usedData > st.totalData || st.usedMeta > st.totalMeta ||
			!(st.dataPercent >= 0 && st.dataPercent <= 100) || !(st.metaPercent >= 0 && st.metaPercent <= 100) || st.mode == "" {
			t.Fatalf("%q accepted as %+v", s, st)
		}
		line := fmt.Sprintf("%d %d/%d %d/%d - %s discard_passdown", st.transaction, st.usedMeta, st.totalMeta, st.usedData, st.totalData, st.mode)
		back, err := parseThinPoolStatus(line)
		if err != nil || back != st {
			t.Fatalf("round trip of %q through %q: %+v, %v", s, line, back, err)
		}
	})
}

// FuzzParseNameList feeds arbitrary DM_LIST_DEVICES buffers to parseNameList. Properties: no
// panic and no endless walk; an accepted list has names without NUL, its first device is not
// 0, and it encodes back (struct dm_name_list records) to a buffer that parses to the same list.
func FuzzParseNameList(f *testing.F) {
	f.Add(encodeNameList([]DMDevice{{Name: "vg0-pool0-tpool", Dev: 253<<8 | 3}, {Name: "vg0-vol--a", Dev: 253<<8 | 4}}))
	f.Add(make([]byte, 16))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		devs, err := parseNameList(data)
		if err != nil {
			return
		}
		for i, d := range devs {
			if strings.IndexByte(d.Name, 0) >= 0 || (i == 0 && d.Dev == 0) {
				t.Fatalf("accepted %+v", devs)
			}
		}
		back, err := parseNameList(encodeNameList(devs))
		if err != nil || !reflect.DeepEqual(back, devs) {
			t.Fatalf("round trip of %+v: %+v, %v", devs, back, err)
		}
	})
}

// encodeNameList writes devs as the kernel does (include/uapi/linux/dm-ioctl.h struct
// dm_name_list: u64 dev, u32 next, NUL-terminated name, records 8-byte aligned); none is one
// record with dev 0.
func encodeNameList(devs []DMDevice) []byte {
	if len(devs) == 0 {
		return make([]byte, 16)
	}
	var out []byte
	for i, d := range devs {
		rec := make([]byte, 12, 12+len(d.Name)+8)
		binary.NativeEndian.PutUint64(rec, d.Dev)
		rec = append(append(rec, d.Name...), 0)
		for len(rec)%8 != 0 {
			rec = append(rec, 0)
		}
		if i < len(devs)-1 {
			binary.NativeEndian.PutUint32(rec[8:], uint32(len(rec)))
		}
		out = append(out, rec...)
	}
	return out
}
