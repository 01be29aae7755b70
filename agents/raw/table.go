package raw

import (
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/plinth-storage/plinth/agents/backend"
)

// TypeGUID is the GPT partition type of Plinth's volumes: a type of Plinth's own, so that no
// operating system mounts or assembles them by type, and partitions of others are never taken
// for volumes.
const TypeGUID = "577C3C02-7A9A-4B77-A524-387562AF5D15"

// AlignBytes is where partitions start and the unit their sizes are rounded up to: 1 MiB,
// the alignment of fdisk and parted, a multiple of every sector and erase-block size.
const AlignBytes = 1 << 20

var (
	nameRe = regexp.MustCompile(`^vol-[0-9a-f]{32}$`)
	hexRe  = regexp.MustCompile(`^[0-9a-f]{32}$`)
)

// PartitionName is the GPT partition name of volume id: its first 36 bytes ("vol-" and 32
// hex digits), since GPT names hold 36 UTF-16 units. ErrInvalidArgument for a malformed id.
func PartitionName(id string) (string, error) {
	if err := backend.ValidateVolumeID(id); err != nil {
		return "", err
	}
	return id[:36], nil
}

// PartitionGUID is the GPT unique partition GUID of volume id: the last 32 of its 40 hex
// digits, upper case in the 8-4-4-4-12 form sfdisk prints. ErrInvalidArgument for a
// malformed id.
func PartitionGUID(id string) (string, error) {
	if err := backend.ValidateVolumeID(id); err != nil {
		return "", err
	}
	h := strings.ToUpper(id[12:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32], nil
}

// VolumeIDOf returns the volume id a partition's name and unique GUID carry, and false when
// they are not the pair PartitionName and PartitionGUID make (the 24 hex digits both hold
// must agree).
func VolumeIDOf(name, guid string) (string, bool) {
	if !nameRe.MatchString(name) {
		return "", false
	}
	g := strings.ToLower(strings.ReplaceAll(guid, "-", ""))
	if !hexRe.MatchString(g) || g[:24] != name[12:36] {
		return "", false
	}
	return name + g[24:], true
}

// table is a disk's partition table as `sfdisk --json` reports it; sizes in sectors.
type table struct {
	Label      string      `json:"label"`
	Device     string      `json:"device"`
	Unit       string      `json:"unit"`
	FirstLBA   int64       `json:"firstlba"`
	LastLBA    int64       `json:"lastlba"`
	SectorSize int64       `json:"sectorsize"`
	Partitions []partition `json:"partitions"`
}

type partition struct {
	Node  string `json:"node"`
	Start int64  `json:"start"`
	Size  int64  `json:"size"`
	Type  string `json:"type"`
	UUID  string `json:"uuid"`
	Name  string `json:"name"`
	// Number is the partition's entry number (from the trailing digits of Node: sfdisk's
	// JSON has no number field).
	Number int `json:"-"`
}

var trailingDigits = regexp.MustCompile(`([0-9]+)$`)

// parseTable parses the output of `sfdisk --json <disk>` (util-linux 2.38: sectors, GPT
// with name and uuid per partition). A dump without a partition number, a unit other than
// sectors or a non-positive sector size is an error.
func parseTable(out []byte) (table, error) {
	var doc struct {
		PartitionTable *table `json:"partitiontable"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		return table{}, fmt.Errorf("parse sfdisk --json: %w", err)
	}
	t := doc.PartitionTable
	if t == nil {
		return table{}, fmt.Errorf("parse sfdisk --json: no partitiontable")
	}
	if t.Unit != "" && t.Unit != "sectors" {
		return table{}, fmt.Errorf("parse sfdisk --json: unit %q, want sectors", t.Unit)
	}
	if t.SectorSize <= 0 {
		t.SectorSize = 512 // sfdisk omits it for 512-byte sectors in some versions
	}
	for i := range t.Partitions {
		p := &t.Partitions[i]
		m := trailingDigits.FindString(p.Node)
		n, err := strconv.Atoi(m)
		if err != nil || n <= 0 {
			return table{}, fmt.Errorf("parse sfdisk --json: partition node %q has no number", p.Node)
		}
		p.Number = n
	}
	sort.Slice(t.Partitions, func(i, j int) bool { return t.Partitions[i].Start < t.Partitions[j].Start })
	return *t, nil
}

// mine reports whether p is a Plinth volume, and its id.
func (p partition) mine() (string, bool) {
	if !strings.EqualFold(p.Type, TypeGUID) {
		return "", false
	}
	return VolumeIDOf(p.Name, p.UUID)
}

// gap is a free region of a disk in sectors, [Start, Start+Size), already aligned.
type gap struct{ Start, Size int64 }

// gaps returns t's free regions between FirstLBA and LastLBA, each trimmed to AlignBytes
// (its start rounded up, its size rounded down; regions smaller than that are dropped), in
// disk order.
func (t table) gaps() []gap {
	align := AlignBytes / t.SectorSize
	var out []gap
	add := func(from, to int64) { // [from, to) in sectors
		// never past the usable area: a partition listed beyond lastlba (a table sfdisk read
		// from another disk's image, or a lastlba missing) is no licence to allocate there
		to = min(to, t.LastLBA+1)
		s := (from + align - 1) / align * align
		n := (to - s) / align * align
		if n > 0 {
			out = append(out, gap{s, n})
		}
	}
	cur := t.FirstLBA
	for _, p := range t.Partitions {
		add(cur, p.Start)
		cur = max(cur, p.Start+p.Size)
	}
	add(cur, t.LastLBA+1)
	return out
}

// usable is the aligned size in sectors of the whole usable area: what an empty disk offers.
func (t table) usable() int64 {
	return table{FirstLBA: t.FirstLBA, LastLBA: t.LastLBA, SectorSize: t.SectorSize}.gapsTotal()
}

func (t table) gapsTotal() int64 {
	var n int64
	for _, g := range t.gaps() {
		n += g.Size
	}
	return n
}

// after returns the sectors from the end of partition p to the next partition's start or
// the end of the usable area: the room p can grow into.
func (t table) after(p partition) int64 {
	end := p.Start + p.Size
	next := t.LastLBA + 1
	for _, q := range t.Partitions {
		if q.Start >= end && q.Start < next {
			next = q.Start
		}
	}
	return next - end
}
