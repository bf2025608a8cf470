package reclaim

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/records"
)

// After a sweep that saw the container and its DEL, no file in the data
// dir names the container.
func TestDELLeavesNoFileNamingTheContainer(t *testing.T) {
	w := newWorld(t)
	w.container("keep", "10.0.0.2")
	w.container("gone", "10.0.0.3")
	w.sweep(Request{})
	// bridge's DEL released the lease (host-local); the plugin ends the DEL.
	if err := os.Remove(filepath.Join(w.dataDir, net1, "10.0.0.3")); err != nil {
		t.Fatal(err)
	}
	if err := w.attach.EndDel(w.dir(), records.Key{ContainerID: "gone", IfName: "eth0"}); err != nil {
		t.Fatal(err)
	}
	err := filepath.WalkDir(w.dataDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if b, err := os.ReadFile(p); err == nil && strings.Contains(string(b), "gone") {
			t.Errorf("after the DEL, %s still names the container", p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
