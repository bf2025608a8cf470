package reclaim

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/utils"
)

// busyWorld is a world whose sweeps ask the fake host which containers a
// CNI command runs for, with two stale containers that map a port: "dead"
// (its runtime's DEL may be running) and "other".
func busyWorld(t *testing.T) *world {
	t.Helper()
	w := newWorld(t)
	w.env.Netfilter.Running = w.host.CNIProcesses
	w.host.CNIRunning = map[string]int{}
	for i, cid := range []string{"dead", "other"} {
		ip := fmt.Sprintf("10.0.0.%d", i+2)
		w.container(cid, ip)
		w.nat.AddPortmap(net1, cid, ip, 8080+i)
		delete(w.host.Namespaces, "/run/netns/"+cid)
	}
	return w
}

// keptLines are the report's problems that say a release was left to a
// running CNI command.
func keptLines(rep *swept) []string {
	var out []string
	for _, p := range rep.Problems {
		if strings.Contains(p.Error(), "for now") {
			out = append(out, p.Error())
		}
	}
	return out
}

// TestSweepLeavesAStaleAttachmentToItsRunningCommand: a stale container a
// CNI command runs for (its runtime's DEL, in portmap) keeps everything:
// NAT rules, lease and record, with no error and a line that says why;
// the other stale container goes. Once nothing runs for it, the next
// sweep releases it all.
func TestSweepLeavesAStaleAttachmentToItsRunningCommand(t *testing.T) {
	w := busyWorld(t)
	w.host.CNIRunning["dead"] = 4242

	rep := w.sweep(Request{})
	if len(rep.Releases) != 1 || rep.Releases[0].Key.ContainerID != "other" {
		t.Fatalf("releases %v, want only other's", rep.Releases)
	}
	kept := keptLines(rep)
	if len(kept) != 1 || !strings.Contains(kept[0], "kept dead/eth0 for now") || !strings.Contains(kept[0], "pid 4242") {
		t.Errorf("kept lines %q, want one for dead naming pid 4242", kept)
	}
	equal(t, "leases left", w.leases(), []string{"10.0.0.2"})
	if !w.hasRecord("dead") || !w.nat.Owns(net1, "dead") || len(w.nat.Chains[utils.MustFormatChainNameWithPrefix(net1, "dead", "DN-")]) == 0 {
		t.Fatalf("dead's record or NAT rules went: record %v, chains %v", w.hasRecord("dead"), w.nat.Chains)
	}

	delete(w.host.CNIRunning, "dead")
	rep = w.sweep(Request{})
	if len(rep.Releases) != 1 || rep.Releases[0].Key.ContainerID != "dead" || !slices.Contains(rep.Releases[0].What, "record") {
		t.Fatalf("releases %v, want dead's, record included", rep.Releases)
	}
	equal(t, "leases left", w.leases(), nil)
	if w.hasRecord("dead") || w.nat.Owns(net1, "dead") || len(keptLines(rep)) > 0 {
		t.Errorf("dead not released whole: record %v, chains %v, kept %q", w.hasRecord("dead"), w.nat.Chains, keptLines(rep))
	}
}

// TestSweepKeepsTheRecordOfAChainLeftEmptied: the command began while the
// sweep released the container's rules, after the first question: the
// jump to portmap's chain went and the chain is left emptied; bridge's
// jump and chain, the lease and the record stay. If the command dies
// before deleting the chain, the next sweep finds it through the record.
func TestSweepKeepsTheRecordOfAChainLeftEmptied(t *testing.T) {
	w := busyWorld(t)
	dn := utils.MustFormatChainNameWithPrefix(net1, "dead", "DN-")
	w.host.OnCNIScan = func() {
		if w.host.CNIScans == 2 {
			w.host.CNIRunning["dead"] = 77
		}
	}

	rep := w.sweep(Request{})
	kept := keptLines(rep)
	if len(kept) != 1 || !strings.Contains(kept[0], "emptied") || !strings.Contains(kept[0], "removed jump in CNI-HOSTPORT-DNAT") {
		t.Errorf("kept lines %q, want dead's, emptied, with what went", kept)
	}
	// Bridge's jump and chain go after portmap's chain: they stay.
	rules, ok := w.nat.Chains[dn]
	if !ok || len(rules) != 0 || !w.nat.Has(utils.FormatChainName(net1, "dead")) || len(w.nat.Chains["POSTROUTING"]) != 1 {
		t.Fatalf("portmap's chain: there %v, rules %q; bridge's chain there %v, POSTROUTING %q", ok, rules, w.nat.Has(utils.FormatChainName(net1, "dead")), w.nat.Chains["POSTROUTING"])
	}
	if !w.hasRecord("dead") || !slices.Contains(w.leases(), "10.0.0.2") {
		t.Fatalf("dead's record or lease went with its chain left: leases %v", w.leases())
	}

	// The command was killed: the chain is still there, and nothing runs.
	w.host.OnCNIScan, w.host.CNIRunning = nil, map[string]int{}
	rep = w.sweep(Request{})
	if len(rep.Releases) != 1 || !slices.Contains(rep.Releases[0].What, "chain "+dn) || !slices.Contains(rep.Releases[0].What, "record") {
		t.Fatalf("releases %v, want dead's with its chain and record", rep.Releases)
	}
	if w.nat.Has(dn) || w.hasRecord("dead") || len(w.leases()) != 0 {
		t.Errorf("left: chain %v, record %v, leases %v", w.nat.Has(dn), w.hasRecord("dead"), w.leases())
	}
}

// TestOrphanRulesOfARunningCommandAreLeft: NAT rules with no record and no
// lease are orphans, unless a CNI command of their container runs: a
// runtime's DEL of it, which tears them down itself.
func TestOrphanRulesOfARunningCommandAreLeft(t *testing.T) {
	w := newWorld(t)
	w.env.Netfilter.Running = w.host.CNIProcesses
	w.nat.AddContainer(net1, "orphan", "10.0.0.3", 8080)
	w.host.CNIRunning = map[string]int{"orphan": 5}

	rep := w.sweep(Request{Orphans: true})
	if len(rep.OrphanRules) != 0 || !w.nat.Owns(net1, "orphan") || len(keptLines(rep)) != 1 {
		t.Fatalf("orphans released %v, owns %v, kept %q", rep.OrphanRules, w.nat.Owns(net1, "orphan"), keptLines(rep))
	}
	w.host.CNIRunning = nil
	rep = w.sweep(Request{Orphans: true})
	if len(rep.OrphanRules) != 1 || w.nat.Owns(net1, "orphan") {
		t.Fatalf("orphans released %v, owns %v", rep.OrphanRules, w.nat.Owns(net1, "orphan"))
	}
}

// TestOrphanChainLeftEmptiedIsFoundAgain: an orphan's command began after
// the first question: portmap's chain is left emptied, and bridge's
// commented jump with it, which is what names the orphan to the next
// sweep (an orphan has no record), and that sweep releases it all.
func TestOrphanChainLeftEmptiedIsFoundAgain(t *testing.T) {
	w := newWorld(t)
	w.env.Netfilter.Running = w.host.CNIProcesses
	w.nat.AddContainer(net1, "orphan", "10.0.0.3", 8080)
	dn := utils.MustFormatChainNameWithPrefix(net1, "orphan", "DN-")
	w.host.CNIRunning = map[string]int{}
	w.host.OnCNIScan = func() {
		if w.host.CNIScans == 2 {
			w.host.CNIRunning["orphan"] = 9
		}
	}
	rep := w.sweep(Request{Orphans: true})
	if len(rep.OrphanRules) != 0 || len(keptLines(rep)) != 1 || !w.nat.Has(dn) || len(w.nat.Chains["POSTROUTING"]) != 1 {
		t.Fatalf("orphans %v, kept %q, chains %v", rep.OrphanRules, keptLines(rep), w.nat.Chains)
	}
	w.host.OnCNIScan, w.host.CNIRunning = nil, nil
	rep = w.sweep(Request{Orphans: true})
	if len(rep.OrphanRules) != 1 || w.nat.Owns(net1, "orphan") {
		t.Fatalf("the next sweep: orphans %v, chains %v", rep.OrphanRules, w.nat.Chains)
	}
}

// A running CNI command of a stale container keeps only what portmap's
// teardown could trip over: a container that maps no port (no portmap
// chain, no portmap nftables rule) is released whole at once, whatever
// runs for it.
func TestARunningCommandKeepsNothingOfAContainerWithoutPortmapRules(t *testing.T) {
	w := newWorld(t)
	w.env.Netfilter.Running = w.host.CNIProcesses
	w.host.CNIRunning = map[string]int{"dead": 4242}
	w.container("dead", "10.0.0.2")
	delete(w.host.Namespaces, "/run/netns/dead")

	rep := w.sweep(Request{})
	if len(rep.Releases) != 1 || rep.Releases[0].Key.ContainerID != "dead" || !slices.Contains(rep.Releases[0].What, "record") {
		t.Fatalf("releases %v, want dead's, record included (kept %q)", rep.Releases, keptLines(rep))
	}
	equal(t, "leases left", w.leases(), nil)
	if w.hasRecord("dead") || w.nat.Owns(net1, "dead") {
		t.Errorf("dead not released whole: record %v, chains %v", w.hasRecord("dead"), w.nat.Chains)
	}
}
