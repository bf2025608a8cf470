package main

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// The operator's commands ask runtimes through their CLIs: an HTTP client
// (net/http's Client and Transport) linked in made every CNI verb's start
// 1 ms slower, for a command the verbs never run.
func TestBinaryLinksNoHTTPClient(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		gobin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	bin := filepath.Join(t.TempDir(), "nomad-bridge-cni")
	if out, err := exec.Command(gobin, "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(gobin, "tool", "nm", bin).Output()
	if err != nil {
		t.Fatalf("go tool nm: %v", err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, "net/http.(*Client)") || strings.Contains(line, "net/http.(*Transport).roundTrip") {
			t.Fatalf("the plugin links an HTTP client: %s", strings.TrimSpace(line))
		}
	}
}
