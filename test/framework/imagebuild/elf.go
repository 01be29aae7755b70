package imagebuild

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"fmt"
	"path"
	"strings"
)

// libDirs are the folders the dynamic loader of Debian amd64 searches (ld.so.conf.d's
// x86_64-linux-gnu.conf and the defaults), as paths in the image.
var libDirs = []string{"usr/local/lib/x86_64-linux-gnu", "lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu", "lib", "usr/lib", "lib64", "usr/lib64"}

// Interpreter returns the ELF program interpreter (PT_INTERP) of data, "" for a statically
// linked executable; ok is false when data is not ELF.
func Interpreter(data []byte) (interp string, ok bool) {
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		return "", false
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b := make([]byte, p.Filesz)
			if _, err := p.ReadAt(b, 0); err != nil {
				return "", true
			}
			return strings.TrimRight(string(b), "\x00"), true
		}
	}
	return "", true
}

// CheckLibraries checks that every ELF file in the tree finds its interpreter and every
// shared library it needs (DT_NEEDED) in the tree, through the loader's default folders and
// the file's RUNPATH/RPATH. It returns one line per problem ("usr/sbin/lvm: needs libaio.so.1,
// which the image lacks"), nil when every binary can load.
func (t *Tree) CheckLibraries() []string {
	var problems []string
	for _, p := range t.Paths() {
		e := t.entries[p]
		if e.typ != tar.TypeReg || len(e.data) < 4 || string(e.data[:4]) != "\x7fELF" {
			continue
		}
		f, err := elf.NewFile(bytes.NewReader(e.data))
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: not a readable ELF file: %v", p, err))
			continue
		}
		if interp, _ := Interpreter(e.data); interp != "" && t.resolve(interp) == "" {
			problems = append(problems, fmt.Sprintf("%s: needs the loader %s, which the image lacks", p, interp))
		}
		needed, _ := f.ImportedLibraries()
		var extra []string
		for _, tag := range []elf.DynTag{elf.DT_RUNPATH, elf.DT_RPATH} {
			vals, _ := f.DynString(tag)
			for _, v := range vals {
				for _, d := range strings.Split(v, ":") {
					extra = append(extra, strings.ReplaceAll(d, "$ORIGIN", "/"+path.Dir(p)))
				}
			}
		}
		f.Close()
		for _, lib := range needed {
			found := false
			for _, d := range append(extra, libDirs...) {
				if r := t.resolve(path.Join(d, lib)); r != "" {
					found = true
					break
				}
			}
			if !found {
				problems = append(problems, fmt.Sprintf("%s (from %s): needs %s, which the image lacks", p, e.origin, lib))
			}
		}
	}
	return problems
}
