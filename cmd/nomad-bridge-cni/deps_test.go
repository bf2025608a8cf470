package main

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// Every verb pays the init of every package the binary links. Some are
// kept out on purpose (see BENCHMARKS.md, "Start-up" and "Cold start"):
// knftables, whose init compiles a dozen regular expressions, came back
// once through host-local's config loader, linked for doctor's range
// sizes; google/nftables and the netlink packages under it were a general
// client linked for a rule dump and a delete (pkg/netfilter/nftnetlink.go
// does both), a few percent of every verb's start-up.
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
		for _, costly := range []string{"sigs.k8s.io/knftables", "github.com/containernetworking/plugins/pkg/ip", "github.com/google/nftables", "github.com/mdlayher/netlink"} {
			if pkg == costly || strings.HasPrefix(pkg, costly+"/") {
				t.Errorf("the plugin links %s", pkg)
			}
		}
	}
}
