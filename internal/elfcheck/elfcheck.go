// Package elfcheck verifies release binaries with the standard library
// only, so the release needs neither file(1) nor binutils, and a binary
// built for another machine is checked without running it: a 64-bit
// little-endian ELF for the architecture's machine; static (no PT_INTERP,
// no PT_DYNAMIC, no DT_NEEDED); Go build info saying linux/<arch>,
// CGO_ENABLED=0, -trimpath, main package <module>/cmd/nomad-bridge-cni; and
// the string variable <module>/pkg/skel.Version, read from the symbol table
// and the data it points to, equal to the version. scripts/release/elfcheck.go
// runs it for the release; test/release checks the artifacts with it.
package elfcheck

import (
	"debug/buildinfo"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
)

// Machines maps the release architectures to their ELF machines.
var Machines = map[string]elf.Machine{
	"amd64": elf.EM_X86_64,
	"arm64": elf.EM_AARCH64,
}

// Check inspects the binary at path and returns a one-line summary, or the
// problems found.
func Check(arch, path, module, version string) (string, []string) {
	var problems []string
	bad := func(format string, a ...any) { problems = append(problems, fmt.Sprintf(format, a...)) }

	want, known := Machines[arch]
	if !known {
		return "", []string{"unknown arch " + arch}
	}
	f, err := elf.Open(path)
	if err != nil {
		return "", []string{err.Error()}
	}
	defer f.Close()
	if f.Class != elf.ELFCLASS64 || f.Data != elf.ELFDATA2LSB {
		bad("ELF %v %v, want ELFCLASS64 ELFDATA2LSB", f.Class, f.Data)
	}
	if f.Machine != want {
		bad("machine %v, want %v", f.Machine, want)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			bad("has %v (dynamically linked)", p.Type)
		}
	}
	if libs, err := f.ImportedLibraries(); err == nil && len(libs) > 0 {
		bad("needs shared libraries %v", libs)
	}

	bi, err := buildinfo.ReadFile(path)
	if err != nil {
		bad("no Go build info: %v", err)
		return "", problems
	}
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	for k, v := range map[string]string{"GOOS": "linux", "GOARCH": arch, "CGO_ENABLED": "0", "-trimpath": "true"} {
		if settings[k] != v {
			bad("build setting %s=%q, want %q", k, settings[k], v)
		}
	}
	if want := module + "/cmd/nomad-bridge-cni"; bi.Path != want {
		bad("main package %q, want %q", bi.Path, want)
	}
	// -trimpath keeps -ldflags out of the build info: read the variable.
	if got, err := stringVar(f, module+"/pkg/skel.Version"); err != nil {
		bad("reading pkg/skel.Version: %v", err)
	} else if got != version {
		bad("pkg/skel.Version = %q, want %q", got, version)
	}
	return fmt.Sprintf("ELF64 %v %v, static (no PT_INTERP/PT_DYNAMIC/DT_NEEDED), %s, linux/%s CGO_ENABLED=0, Version=%s",
		f.Machine, f.Type, bi.GoVersion, arch, version), problems
}

// stringVar returns the value of the Go string variable sym: its header
// (pointer, length: two little-endian words on amd64 and arm64) lives at the
// symbol's address, the bytes wherever the pointer says.
func stringVar(f *elf.File, sym string) (string, error) {
	syms, err := f.Symbols()
	if err != nil {
		return "", err
	}
	i := slices.IndexFunc(syms, func(s elf.Symbol) bool { return s.Name == sym })
	if i < 0 {
		return "", errors.New("symbol not found (stripped binary?)")
	}
	hdr, err := readAt(f, syms[i].Value, 16)
	if err != nil {
		return "", err
	}
	ptr, n := binary.LittleEndian.Uint64(hdr[:8]), binary.LittleEndian.Uint64(hdr[8:])
	if n > 1<<10 {
		return "", fmt.Errorf("implausible length %d", n)
	}
	b, err := readAt(f, ptr, n)
	return string(b), err
}

// readAt reads n bytes at virtual address addr from the loaded segment
// holding them in the file.
func readAt(f *elf.File, addr, n uint64) ([]byte, error) {
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD && addr >= p.Vaddr && addr+n <= p.Vaddr+p.Filesz {
			b := make([]byte, n)
			_, err := p.ReadAt(b, int64(addr-p.Vaddr))
			return b, err
		}
	}
	return nil, fmt.Errorf("address %#x+%d is in no loaded segment with data", addr, n)
}
