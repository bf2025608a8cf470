//go:build ignore

// elfcheck verifies release binaries (see internal/elfcheck for what it
// checks) with the standard library only:
//
//	go run scripts/release/elfcheck.go -module M -version V amd64=path arm64=path ...
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/internal/elfcheck"
)

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
		summary, problems := elfcheck.Check(arch, path, *module, *version)
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
