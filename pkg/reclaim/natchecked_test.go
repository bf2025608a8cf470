package reclaim

import (
	"testing"
	"time"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/netfilter"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/fakenat"
)

// A CHECK's sweep of an owned network lists its NAT rules for orphans
// unless the ruleset is the one in which an earlier sweep's listing found
// none; any commit since, an orphan found, a sweep that changed the rules,
// a listing that was not a CHECK's (gc) or another boot make it list.
func TestCheckSweepSkipsTheOrphanListingOfAnUnchangedRuleset(t *testing.T) {
	w := newWorld(t)
	w.markOwned()
	w.container("live", "10.0.0.2")
	state := netfilter.RulesetState{Cookie: 7, Gen: 100}
	w.env.Netfilter.StateFunc = func() netfilter.RulesetState { return state }
	w.sweeper.Env = w.env
	listings := func() int {
		n := 0
		for _, c := range w.nat.Calls {
			if c == "list nat" {
				n++
			}
		}
		w.nat.Calls = nil
		return n
	}
	check := Request{SkipUnchangedNAT: true}

	w.sweep(check)
	if n := listings(); n == 0 {
		t.Fatal("the first sweep did not list")
	}
	w.sweep(check)
	if n := listings(); n != 0 {
		t.Errorf("a sweep of the unchanged ruleset listed %d times", n)
	}
	// gc lists whatever the state.
	w.sweep(Request{})
	if n := listings(); n == 0 {
		t.Error("a sweep without SkipUnchangedNAT did not list")
	}
	// A commit (an orphan's rules made by bare bridge): listed, released.
	w.nat.AddContainer(net1, "orphan", "10.0.0.9", 0)
	state.Gen++
	rep := w.sweep(check)
	if n := listings(); n == 0 || len(rep.OrphanRules) != 1 {
		t.Fatalf("after a commit: %d listings, orphans %v", n, rep.OrphanRules)
	}
	// The release was a commit too; the fake's state does not move, so
	// the sweep that released noted nothing, and the next one lists.
	w.sweep(check)
	if n := listings(); n == 0 {
		t.Error("the sweep after one that released orphans did not list")
	}
	w.sweep(check)
	if n := listings(); n != 0 {
		t.Errorf("a sweep of the unchanged ruleset listed %d times", n)
	}
	// Another boot.
	w.host.ID = "boot-2"
	w.sweep(check)
	if n := listings(); n == 0 {
		t.Error("a sweep in another boot did not list")
	}
	// A host whose state cannot be told always lists.
	state = netfilter.RulesetState{}
	w.sweep(check)
	w.sweep(check)
	if n := listings(); n != 2 {
		t.Errorf("without a ruleset state: %d listings in two sweeps, want 2", n)
	}
}

// A CHECK that skips the orphan listing still lists to release a stale
// attachment, but that listing is no orphan listing: nftables owners are
// tracked only from a listing for orphans on, so the rules of a lease with
// no record judged before it (bare bridge's, say) were not seen, and would
// have gone as orphans.
func TestCheckSweepThatSkipsTheOrphanListingReleasesNoOrphan(t *testing.T) {
	w := newWorld(t)
	w.markOwned()
	nft := fakenat.NewNFT()
	state := netfilter.RulesetState{Cookie: 7, Gen: 100}
	w.sweeper.Netfilter = &netfilter.Cleaner{Tables: []netfilter.Table{w.nat}, NFTables: nft, StateFunc: func() netfilter.RulesetState { return state }}
	check := Request{SkipUnchangedNAT: true}
	w.sweep(check) // notes the ruleset checked

	w.lease("10.0.0.3", "bare\r\neth0", bootTime.Add(time.Minute)) // this boot, no record: unknown
	nft.Add(net1, "bare", "eth0")
	w.lease("10.0.0.4", "old\r\neth0", bootTime.Add(-time.Hour)) // another boot: stale
	rep := w.sweep(check)
	if len(rep.Releases) != 1 || rep.Releases[0].Key.ContainerID != "old" || !nft.Has(net1, "bare", "eth0") {
		t.Errorf("releases %v; rules of bare kept %v", rep.Releases, nft.Has(net1, "bare", "eth0"))
	}
}

// An orphan whose rules a sweep leaves to a running CNI command (its
// runtime's DEL) is still there: the ruleset was not found free of
// orphans, and the next CHECK lists it again. Regression: the sweep noted
// it checked, so a DEL that died before changing a rule left the orphan
// to the next commit or gc.
func TestCheckSweepThatKeptABusyOrphanNotesNothing(t *testing.T) {
	w := newWorld(t)
	w.markOwned()
	w.env.Netfilter.Running = w.host.CNIProcesses
	w.host.CNIRunning = map[string]int{"orphan": 4242}
	w.nat.AddPortmap(net1, "orphan", "10.0.0.9", 8080)
	w.nat.AddContainer(net1, "orphan", "10.0.0.9", 0)
	state := netfilter.RulesetState{Cookie: 7, Gen: 100}
	w.env.Netfilter.StateFunc = func() netfilter.RulesetState { return state }
	w.sweeper.Env = w.env
	check := Request{SkipUnchangedNAT: true}

	if rep := w.sweep(check); len(rep.OrphanRules) != 0 || !w.nat.Owns(net1, "orphan") {
		t.Fatalf("the busy orphan's rules went: orphans %v, chains %v", rep.OrphanRules, w.nat.Chains)
	}
	delete(w.host.CNIRunning, "orphan") // its DEL died, having changed nothing
	if rep := w.sweep(check); len(rep.OrphanRules) != 1 || w.nat.Owns(net1, "orphan") {
		t.Errorf("the next CHECK left the orphan: orphans %v, chains %v", rep.OrphanRules, w.nat.Chains)
	}
}
