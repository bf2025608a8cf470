package reclaim

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/netfilter"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/records"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/sysinfo"
)

// probeOf probes the fake table as the host's probe reads iptables-nft:
// the owners the listing would name, without listing (no "list nat" call).
func (w *world) probeOf(probes *int) func(string) ([]string, error) {
	return func(network string) ([]string, error) {
		*probes++
		var cids []string
		err := w.unrecorded(func(c *netfilter.Cleaner) error {
			snap, err := c.Snapshot(network)
			if err == nil {
				cids = snap.Containers()
			}
			return err
		})
		return cids, err
	}
}

// unrecorded runs fn on a cleaner of the world's table, leaving no trace
// in its calls: what the test does stands for what it fakes (a probe, a
// runtime's DEL), not for the sweep's own listings.
func (w *world) unrecorded(fn func(*netfilter.Cleaner) error) error {
	calls := w.nat.Calls
	defer func() { w.nat.Calls = calls }()
	return fn(&netfilter.Cleaner{Tables: []netfilter.Table{w.nat}})
}

func (w *world) listings() int {
	n := 0
	for _, c := range w.nat.Calls {
		if c == "list nat" {
			n++
		}
	}
	return n
}

// A sweep of an owned network whose probe finds only live owners lists
// nothing; once an orphan's rules are there, it lists and releases them,
// and the live ones stay.
func TestProbedSweepListsOnlyWhatItReleases(t *testing.T) {
	w := newWorld(t)
	w.markOwned()
	w.container("a", "10.0.0.2")
	w.container("b", "10.0.0.3")
	probes := 0
	w.env.Netfilter.ProbeFunc = w.probeOf(&probes)
	w.sweeper.Env = w.env

	rep := w.sweep(Request{})
	if probes != 1 || w.listings() != 0 || rep.Released != 0 {
		t.Fatalf("all live: %d probes, %d listings, %d released; want 1, 0, 0", probes, w.listings(), rep.Released)
	}

	w.nat.AddContainer(net1, "orphan", "10.0.0.9", 8080)
	rep = w.sweep(Request{})
	if w.listings() != 1 {
		t.Errorf("an orphan probed: %d listings, want 1", w.listings())
	}
	equal(t, "orphans", rep.OrphanRules, []string{"orphan"})
	if w.nat.Owns(net1, "orphan") || !w.nat.Owns(net1, "a") || !w.nat.Owns(net1, "b") {
		t.Errorf("after the sweep: %v", w.nat.Chains)
	}
}

// The orphan a probe found is judged again by the listing and by the
// records read after it: an ADD that began between the probe and the
// listing (its record written before its rules) keeps its rules, and an
// orphan whose rules went before the listing is not reported.
func TestProbedOrphanIsJudgedAgainAfterTheListing(t *testing.T) {
	w := newWorld(t)
	w.markOwned()
	w.container("live", "10.0.0.2")
	w.nat.AddContainer(net1, "went", "10.0.0.5", 0)
	w.nat.AddContainer(net1, "orphan", "10.0.0.9", 0)
	w.host.Namespaces["/run/netns/racer"] = sysinfo.NetnsID{Dev: 4, Ino: 77}
	probes := 0
	probe := w.probeOf(&probes)
	w.env.Netfilter.ProbeFunc = func(network string) ([]string, error) {
		owners, err := probe(network)
		// After the probe, a DEL takes "went"'s rules.
		if derr := w.unrecorded(func(c *netfilter.Cleaner) error {
			snap, err := c.Snapshot(network)
			if err == nil {
				_, err = c.Release(snap, "went")
			}
			return err
		}); derr != nil {
			t.Fatal(derr)
		}
		return owners, err
	}
	// Before the listing (after the probe's orphans were first checked
	// against the records): an ADD writes its record, then bridge makes
	// its rules.
	var add *PendingAdd
	w.env.Netfilter.Tables = []netfilter.Table{&racingTable{Table: w.nat, beforeList: func() {
		var err error
		if add, err = w.attach.BeginAdd(w.dir(), records.Key{ContainerID: "racer", IfName: "eth0"}, "/run/netns/racer"); err != nil {
			t.Fatal(err)
		}
		w.nat.AddContainer(net1, "racer", "10.0.0.4", 0)
	}}}
	w.sweeper.Env = w.env

	rep := w.sweep(Request{})
	if probes != 1 || add == nil {
		t.Fatalf("%d probes, listed: %v", probes, add != nil)
	}
	defer add.Close()
	equal(t, "orphans", rep.OrphanRules, []string{"orphan"})
	if !w.nat.Owns(net1, "racer") || !w.nat.Owns(net1, "live") || w.nat.Owns(net1, "orphan") {
		t.Errorf("after the sweep: %v", w.nat.Chains)
	}
}

// A probe that fails is a listing: the sweep is the same.
func TestFailedProbeIsAListing(t *testing.T) {
	w := newWorld(t)
	w.markOwned()
	w.container("live", "10.0.0.2")
	w.nat.AddContainer(net1, "orphan", "10.0.0.9", 0)
	w.env.Netfilter.ProbeFunc = func(string) ([]string, error) { return nil, errors.New("netlink: permission denied") }
	w.sweeper.Env = w.env

	rep := w.sweep(Request{})
	equal(t, "orphans", rep.OrphanRules, []string{"orphan"})
	if w.listings() != 1 || !w.nat.Owns(net1, "live") || w.nat.Owns(net1, "orphan") {
		t.Errorf("%d listings; after the sweep: %v", w.listings(), w.nat.Chains)
	}
}

// A stale attachment's release is made from a listing, never from a
// probe: its rules go before its files, as without a probe.
func TestStaleReleaseListsDespiteTheProbe(t *testing.T) {
	w := newWorld(t)
	w.markOwned()
	w.container("live", "10.0.0.2")
	w.container("gone", "10.0.0.3")
	delete(w.host.Namespaces, "/run/netns/gone")
	probes := 0
	w.env.Netfilter.ProbeFunc = w.probeOf(&probes)
	w.sweeper.Env = w.env

	rep := w.sweep(Request{})
	if rep.Released != 1 || w.listings() == 0 {
		t.Fatalf("released %d with %d listings", rep.Released, w.listings())
	}
	if w.nat.Owns(net1, "gone") || !w.nat.Owns(net1, "live") || w.hasRecord("gone") {
		t.Errorf("after the sweep: NAT %v, record of gone %v", w.nat.Chains, w.hasRecord("gone"))
	}
	if i := slices.IndexFunc(w.nat.Calls, func(c string) bool { return strings.HasPrefix(c, "delete") }); i < 0 {
		t.Errorf("no rule deleted: %v", w.nat.Calls)
	}
}
