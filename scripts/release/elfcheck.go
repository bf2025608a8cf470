//go:build ignore

// elfcheck verifies release binaries with the standard library only, so the
// release needs neither file(1) nor binutils:
//
//	go run scripts/release/elfcheck.go -module M -version V amd64=path arm64=path ...
//
// For each binary: a 64-bit little-endian ELF for the architecture's machine;
// static (no PT_INTERP, no PT_DYNAMIC, no DT_NEEDED); and the Go build info says
// linux/<arch>, CGO_ENABLED=0, -trimpath, main package M/cmd/nomad-bridge-cni;
// and the string variable M/pkg/skel.Version, read from the symbol table and
// the data it points to, is V (so the stamp is checked without running a
// binary built for another machine).
package main

import (
	"debug/buildinfo"
	"debug/elf"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
)

var machines = map[string]elf.Machine{
	"amd64": elf.EM_X86_64,
	"arm64": elf.EM_AARCH64,
}

func main() {
	module := flag.String("module", "", "module path of the plugin")
	version := flag.String("version", "", "version that must be stamped")
	flag.Parse()
	if *module == "" || *version == "" || flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: elfcheck -module M -version V arch=path...")
		os.Exit(2)
	}
	failed := false
	for _, arg := range flag.Args() {
		arch, path, ok := strings.Cut(arg, "=")
		if !ok {
			fmt.Fprintf(os.Stderr, "elfcheck: %q is not arch=path\n", arg)
			os.Exit(2)
		}
		summary, problems := check(arch, path, *module, *version)
		if len(problems) > 0 {
			failed = true
			for _, p := range problems {
				fmt.Fprintf(os.Stderr, "    FAIL %s %s: %s\n", arch, path, p)
			}
			continue
		}
		fmt.Printf("    ok   %s: %s\n", arch, summary)
	}
	if failed {
		os.Exit(1)
	}
}

func check(arch, path, module, version string) (string, []string) {
	var problems []string
	bad := func(format string, a ...any) { problems = append(problems, fmt.Sprintf(format, a...)) }

	want, known := machines[arch]
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
		switch p.Type {
		case elf.PT_INTERP:
			bad("has PT_INTERP (dynamically linked)")
		case elf.PT_DYNAMIC:
			bad("has PT_DYNAMIC (dynamically linked)")
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
	for _, s := range syms {
		if s.Name != sym {
			continue
		}
		hdr, err := readAt(f, s.Value, 16)
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
	return "", errors.New("symbol not found (stripped binary?)")
}

// readAt reads n bytes at virtual address addr from the section holding them.
func readAt(f *elf.File, addr, n uint64) ([]byte, error) {
	for _, sec := range f.Sections {
		if sec.Type == elf.SHT_NOBITS || addr < sec.Addr || addr+n > sec.Addr+sec.Size {
			continue
		}
		b := make([]byte, n)
		if _, err := sec.ReadAt(b, int64(addr-sec.Addr)); err != nil {
			return nil, err
		}
		return b, nil
	}
	return nil, fmt.Errorf("address %#x+%d is in no section with data", addr, n)
}
