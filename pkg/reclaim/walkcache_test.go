package reclaim

import (
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/records"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/sysinfo"
)

// The walk cache gives a sweep the bytes a record had when an earlier
// walk read it (records' walkcache.go). It may be wrong (a record changed
// in place by hand, a cache planted): a sweep must then never release on
// its word. A record from the cache that is not judged live is judged
// again on its file.
func TestSweepJudgesACachedRecordAgainOnItsFileBeforeReleasing(t *testing.T) {
	w := newWorld(t)
	w.container("c", "10.0.0.2")
	if rep := w.sweep(Request{}); rep.Released != 0 {
		t.Fatalf("first sweep released %v", rep.Releases)
	}
	// The record changed in place (same inode, so the cache still gives
	// the old bytes): it now names another namespace, which is alive,
	// while the one the cached bytes name is gone.
	store := records.NewStore(w.dir())
	k := records.Key{ContainerID: "c", IfName: "eth0"}
	r, err := store.Read(k)
	if err != nil || r == nil {
		t.Fatalf("read record: %v, %v", r, err)
	}
	delete(w.host.Namespaces, r.Netns)
	r.Netns = "/run/netns/c-moved"
	w.nextIno++
	w.host.Namespaces[r.Netns] = sysinfo.NetnsID{Dev: 4, Ino: w.nextIno}
	r.NetnsID = w.host.Namespaces[r.Netns]
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(store.PathOf(k), b, 0o600); err != nil {
		t.Fatal(err)
	}

	rep := w.sweep(Request{})
	if rep.Released != 0 || verdicts(rep)["c"] != Live {
		t.Errorf("sweep released %v, verdict %v: it acted on the cached bytes, not the record", rep.Releases, verdicts(rep))
	}
	equal(t, "leases left", w.leases(), []string{"10.0.0.2"})
	if !w.hasRecord("c") || !w.nat.Owns(net1, "c") {
		t.Error("the live attachment lost its record or rules")
	}

	// When the namespace the file names goes, the release is made.
	delete(w.host.Namespaces, r.Netns)
	rep = w.sweep(Request{})
	if rep.Released != 1 || w.hasRecord("c") || len(w.leases()) != 0 {
		t.Errorf("stale attachment not released: %v, leases %v", rep.Releases, w.leases())
	}
	if _, err := os.Lstat(filepath.Join(store.Dir(), ".walk-cache")); !os.IsNotExist(err) {
		t.Errorf("the walk cache outlived the network's last record (lstat: %v)", err)
	}
}

// A healthy sweep takes its records from the cache the sweep before it
// wrote: what makes a CHECK's sweep of a full bridge cheap.
func TestSecondSweepTakesLiveRecordsFromTheWalkCache(t *testing.T) {
	w := newWorld(t)
	for i, cid := range []string{"a", "b", "c"} {
		w.container(cid, "10.0.0."+string(rune('2'+i)))
	}
	fromCache := func() int {
		n := 0
		req := Request{Dir: w.dir()}
		req.Visit = func(a *Attachment) {
			if a.Record != nil && a.Record.FromCache() {
				n++
			}
		}
		if _, err := w.sweeper.Sweep(req); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := fromCache(); n != 0 {
		t.Errorf("first sweep took %d records from the cache", n)
	}
	if n := fromCache(); n != 3 {
		t.Errorf("second sweep took %d records from the cache, want 3", n)
	}
}

// After a DEL, or an ADD that failed, no file in the data dir names the
// container: the walk cache holding its record's bytes goes with the
// record (the next sweep writes it anew).
func TestDELLeavesNoWalkCacheNamingTheContainer(t *testing.T) {
	w := newWorld(t)
	w.container("keep", "10.0.0.2")
	w.container("gone", "10.0.0.3")
	w.sweep(Request{})
	cache := filepath.Join(records.NewStore(w.dir()).Dir(), ".walk-cache")
	if b, err := os.ReadFile(cache); err != nil || !strings.Contains(string(b), "gone") {
		t.Fatalf("the sweep wrote no cache naming the container (%v)", err)
	}
	// A sweep's probe kept the container among the owners of NAT rules.
	records.NewStore(w.dir()).SaveNATCache("key", []string{"keep", "gone"})
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
	// The next sweep writes the cache again, of what is there.
	w.sweep(Request{})
	if b, err := os.ReadFile(cache); err != nil || !strings.Contains(string(b), "keep") {
		t.Errorf("the sweep after the DEL wrote no cache (%v)", err)
	}
}
