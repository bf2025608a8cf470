package reclaim

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/plugins/ipam/host-local/backend/disk"

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

// A DEL that does not run host-local (planted files) and an Abort release
// what host-local's DEL would: disk.Store.ReleaseByID takes the leases of
// "<id>\r\n<ifname>" and, only if none, those of the container ID alone (a
// lease written before host-local recorded ifnames). host-local itself
// is the oracle.
func TestReleaseLeasesOfReleasesWhatHostLocalsDELWould(t *testing.T) {
	key := records.Key{ContainerID: "k", IfName: "eth0"}
	for _, tc := range []struct {
		name   string
		leases map[string]string
		left   []string
	}{{
		name:   "only an ID-only lease of the container",
		leases: map[string]string{"10.0.0.2": "k", "10.0.0.3": "k\r\neth1", "10.0.0.4": "j"},
		left:   []string{"10.0.0.3", "10.0.0.4"},
	}, {
		name:   "a lease of the key and an ID-only one",
		leases: map[string]string{"10.0.0.2": "k", "10.0.0.3": "k\r\neth1", "10.0.0.4": "j", "10.0.0.5": "k\r\neth0"},
		left:   []string{"10.0.0.2", "10.0.0.3", "10.0.0.4"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			ours, hostLocal := newWorld(t), newWorld(t)
			for ip, content := range tc.leases {
				ours.lease(ip, content, bootTime.Add(time.Minute))
				hostLocal.lease(ip, content, bootTime.Add(time.Minute))
			}
			if err := ours.attach.ReleaseLeasesOf(ours.dir(), key); err != nil {
				t.Fatal(err)
			}
			store, err := disk.New(net1, hostLocal.dataDir)
			if err != nil {
				t.Fatal(err)
			}
			if err := store.ReleaseByID(key.ContainerID, key.IfName); err != nil {
				t.Fatal(err)
			}
			equal(t, "leases host-local's DEL leaves", hostLocal.leases(), tc.left)
			equal(t, "leases ReleaseLeasesOf leaves", ours.leases(), tc.left)
		})
	}
}
