package main

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// Every verb pays the init of every package the binary links. Some are
// kept out on purpose (see BENCHMARKS.md, "Decisions the numbers made"):
// knftables, whose init compiles a dozen regular expressions, came back
// once through host-local's config loader, linked for doctor's range
// sizes. google/nftables and mdlayher/netlink are linked (pkg/netfilter's
// rule dumps and deletions): their init is ≈ 0.06 ms and 43 allocations,
// and `CNI_COMMAND=VERSION` stayed within noise of the build without them
// (medians of 200 interleaved runs: 5.06–5.72 ms without, 5.27–5.53 ms
// with, 0.99–1.06× the do-nothing floor plugin built alike).
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
			if pkg == costly || strings.HasPrefix(pkg, costly+"/") {
				t.Errorf("the plugin links %s", pkg)
			}
		}
	}
}
