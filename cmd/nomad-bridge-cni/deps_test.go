package main

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// Every verb pays the init of every package the binary links. Some are
// kept out on purpose (see BENCHMARKS.md, "Start-up"): knftables, whose
// init compiles a dozen regular expressions, came back once through
// host-local's config loader, linked for doctor's range sizes.
func TestBinaryLinksNoCostlyInit(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		gobin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	out, err := exec.Command(gobin, "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, pkg := range strings.Fields(string(out)) {
		for _, costly := range []string{"sigs.k8s.io/knftables", "github.com/containernetworking/plugins/pkg/ip"} {
			if pkg == costly {
				t.Errorf("the plugin links %s", pkg)
			}
		}
	}
}
