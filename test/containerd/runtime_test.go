package containerd

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
)

// gc --runtime cri against a real containerd, through crictl as an
// operator runs it (the endpoint from CONTAINER_RUNTIME_ENDPOINT): the
// sandbox ID crictl lists is the container ID containerd gives CNI, so a
// ready pod's attachment is listed, never counted as missing, and keeps
// its leases.
func TestGCRuntimeCRIListsAReadyPod(t *testing.T) {
	e := newEnv(t, false)
	p := e.runPod(t, "a")
	operator := func(args ...string) string {
		t.Helper()
		out, err := e.runWithEnv(filepath.Join(e.bin, pluginType), []string{
			"PATH=" + e.bin + string(os.PathListSeparator) + os.Getenv("PATH"),
			"CONTAINER_RUNTIME_ENDPOINT=unix://" + e.sock,
			"CRI_CONFIG_FILE=" + e.crictlConfig,
		}, args...)
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		return out
	}

	var doc struct {
		Leases []struct {
			ContainerID string `json:"containerID"`
			Runtime     string `json:"runtime"`
		} `json:"leases"`
	}
	out := operator("leases", "--runtime", "cri", "--data-dir", e.dataDir, "--network", e.net, "--json")
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("leases --json: %v\n%s", err, out)
	}
	rows := 0
	for _, r := range doc.Leases {
		if r.ContainerID == p.id {
			rows++
		}
		if r.Runtime != "listed" {
			t.Errorf("leases --runtime cri: %s is %q, want listed", r.ContainerID, r.Runtime)
		}
	}
	if rows != 2 {
		t.Errorf("leases --runtime cri: %d rows of the pod %s, want 2 (one per family):\n%s", rows, p.id, out)
	}
	if out := operator("gc", "--runtime", "cri", "--grace", "1m", "--data-dir", e.dataDir, "--network", e.net); strings.Contains(out, "released") {
		t.Errorf("gc --runtime cri released something of a ready pod:\n%s", out)
	}
	if b, err := os.ReadFile(ipamdir.New(e.dataDir, e.net).Marker(ipamdir.UnlistedMarker)); err == nil && strings.Contains(string(b), p.id) {
		t.Errorf("gc --runtime cri remembered the ready pod as missing: %s", b)
	}
	e.assertAttached(t, p)
	e.stopAndRemove(t, p)
	e.assertNothingLeft(t)
}
