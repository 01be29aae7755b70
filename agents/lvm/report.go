package lvm

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Report fields requested from vgs and lvs (--reportformat json --units b
// --nosuffix: every size is a decimal byte count). Only LV-level fields: a
// segment field such as segtype makes lvs print one row per segment, so an
// LV extended into a second segment would appear twice.
const (
	vgFields = "vg_name,vg_uuid,vg_size,vg_free,vg_extent_size,vg_extent_count,vg_free_count,vg_tags,lv_count,pv_count"
	lvFields = "lv_name,vg_name,lv_uuid,lv_size,lv_attr,lv_tags,pool_lv,data_percent,metadata_percent,lv_metadata_size,lv_path,lv_dm_path,lv_active,lv_layout,lv_kernel_major,lv_kernel_minor"
)

// VG is one row of `vgs`. Sizes in bytes.
type VG struct {
	Name        string
	UUID        string
	SizeBytes   int64
	FreeBytes   int64
	ExtentBytes int64
	Tags        []string
	LVCount     int64
	PVCount     int64
}

// LV is one row of `lvs`. Sizes in bytes; percentages 0..100.
type LV struct {
	Name      string
	VG        string
	UUID      string
	SizeBytes int64
	Attr      string
	Tags      []string
	// Pool is the thin pool of a thin LV, else "".
	Pool string
	// Layout is lvm's lv_layout: "linear", "thin,sparse" (thin LV),
	// "thin,pool" (thin pool), "striped", ...
	Layout string
	// DataPercent is a thin pool's (or thin LV's) data use; MetadataPercent a
	// thin pool's metadata use.
	DataPercent       float64
	MetadataPercent   float64
	MetadataSizeBytes int64
	Path              string
	DMPath            string
	Active            bool
	// KernelMajor and KernelMinor are the device numbers of an active LV (-1 when inactive):
	// the key into /sys/dev/block/<major>:<minor> (the bcache cache finds its devices there).
	KernelMajor, KernelMinor int64
}

// IsThin reports whether the LV is a thin LV (not a pool).
func (l LV) IsThin() bool { return l.hasLayout("thin") && !l.hasLayout("pool") }

// IsThinPool reports whether the LV is a thin pool.
func (l LV) IsThinPool() bool { return l.hasLayout("thin") && l.hasLayout("pool") }

func (l LV) hasLayout(part string) bool {
	for _, p := range strings.Split(l.Layout, ",") {
		if p == part {
			return true
		}
	}
	return false
}

// HasTag reports whether the LV carries tag.
func (l LV) HasTag(tag string) bool {
	for _, t := range l.Tags {
		if t == tag {
			return true
		}
	}
	return false
}

type rawReport struct {
	Report []struct {
		VG []map[string]string `json:"vg"`
		LV []map[string]string `json:"lv"`
	} `json:"report"`
}

func decode(data []byte) (rawReport, error) {
	var r rawReport
	if err := json.Unmarshal(data, &r); err != nil {
		return r, fmt.Errorf("parse lvm json report: %w", err)
	}
	return r, nil
}

// fieldParser collects the first parse error of a row.
type fieldParser struct {
	row map[string]string
	err error
}

func (p *fieldParser) str(k string) string { return p.row[k] }

func (p *fieldParser) int(k string) int64 {
	s := strings.TrimSpace(p.row[k])
	if s == "" {
		return 0
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if (err != nil || v < 0) && p.err == nil {
		p.err = fmt.Errorf("field %s: bad byte count %q", k, s)
	}
	return v
}

// devnum parses a kernel device number: lvs reports -1 for an inactive LV (and "" where the
// field is not requested).
func (p *fieldParser) devnum(k string) int64 {
	s := strings.TrimSpace(p.row[k])
	if s == "" {
		return -1
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if (err != nil || v < -1) && p.err == nil {
		p.err = fmt.Errorf("field %s: bad device number %q", k, s)
	}
	return v
}

func (p *fieldParser) pct(k string) float64 {
	s := strings.TrimSpace(p.row[k])
	if s == "" {
		return 0
	}
	v, err := strconv.ParseFloat(s, 64)
	if (err != nil || v < 0 || v > 100 || math.IsNaN(v)) && p.err == nil {
		p.err = fmt.Errorf("field %s: bad percentage %q", k, s)
	}
	return v
}

func (p *fieldParser) tags(k string) []string {
	s := p.row[k]
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

// ParseVGs parses the JSON report of `vgs --reportformat json --units b --nosuffix`.
func ParseVGs(data []byte) ([]VG, error) {
	r, err := decode(data)
	if err != nil {
		return nil, err
	}
	var out []VG
	for _, rep := range r.Report {
		for _, row := range rep.VG {
			p := fieldParser{row: row}
			vg := VG{
				Name:        p.str("vg_name"),
				UUID:        p.str("vg_uuid"),
				SizeBytes:   p.int("vg_size"),
				FreeBytes:   p.int("vg_free"),
				ExtentBytes: p.int("vg_extent_size"),
				Tags:        p.tags("vg_tags"),
				LVCount:     p.int("lv_count"),
				PVCount:     p.int("pv_count"),
			}
			if p.err == nil && vg.Name == "" {
				p.err = fmt.Errorf("vg row without vg_name")
			}
			if p.err != nil {
				return nil, fmt.Errorf("parse vgs report: %w", p.err)
			}
			out = append(out, vg)
		}
	}
	return out, nil
}

// ParseLVs parses the JSON report of `lvs --reportformat json --units b --nosuffix`.
func ParseLVs(data []byte) ([]LV, error) {
	r, err := decode(data)
	if err != nil {
		return nil, err
	}
	var out []LV
	seen := map[string]bool{}
	for _, rep := range r.Report {
		for _, row := range rep.LV {
			p := fieldParser{row: row}
			lv := LV{
				Name:              p.str("lv_name"),
				VG:                p.str("vg_name"),
				UUID:              p.str("lv_uuid"),
				SizeBytes:         p.int("lv_size"),
				Attr:              p.str("lv_attr"),
				Tags:              p.tags("lv_tags"),
				Pool:              p.str("pool_lv"),
				Layout:            p.str("lv_layout"),
				DataPercent:       p.pct("data_percent"),
				MetadataPercent:   p.pct("metadata_percent"),
				MetadataSizeBytes: p.int("lv_metadata_size"),
				Path:              p.str("lv_path"),
				DMPath:            p.str("lv_dm_path"),
				Active:            p.str("lv_active") == "active",
				KernelMajor:       p.devnum("lv_kernel_major"),
				KernelMinor:       p.devnum("lv_kernel_minor"),
			}
			if p.err == nil && lv.Name == "" {
				p.err = fmt.Errorf("lv row without lv_name")
			}
			if p.err != nil {
				return nil, fmt.Errorf("parse lvs report: %w", p.err)
			}
			if !seen[lv.VG+"/"+lv.Name] {
				seen[lv.VG+"/"+lv.Name] = true
				out = append(out, lv)
			}
		}
	}
	return out, nil
}
