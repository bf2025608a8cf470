package e2e

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestUpgradeInPlace: a container attached by the bare bridge chain, with
// host-local's leases in a persistent directory (its ipam.dataDir), keeps
// running while the conflist is switched to the plugin: same network name,
// bridge and subnet, ipam.dataDir still pointing at the legacy directory,
// dataDir the test's tmpfs. The first ADD moves its lease (content and
// mtime) into the tmpfs and removes it from the legacy directory, and drops
// a legacy lease from before this boot; 20 new ADDs never receive its
// address, although it is the first of the range, which an empty store
// would hand out first; a CHECK keeps it; its DEL through the plugin
// releases it and its NAT rules.
func TestUpgradeInPlace(t *testing.T) {
	e := newEnv(t)
	e.requirePlugin(t)
	legacy := filepath.Join(e.persistDir, e.netName)

	bare := e.confFor(t, "nomad.conflist")
	bareBridge(t, bare, e.persistDir)
	e.writeConflist(t, bare)
	old := e.addNetns(t, "old")
	port := randomHostPort()
	capArgs := portMappings(port)
	po, gw := parseResult(t, e.mustCNI(t, "add", old, capArgs)).addrIn(t, e.subnet4)
	addrOld := po.Addr()
	assertLeases(t, legacy, map[netip.Addr]string{addrOld: leaseContent(old.cid)})
	if first := e.hostAddr(2); addrOld != first {
		t.Fatalf("the bare chain gave the first container %s, want the range's first address %s (the one an empty store hands out first)", addrOld, first)
	}
	ping(t, old, gw)
	oldMtime := leaseMtime(t, legacy, addrOld)
	// A legacy lease from before this boot belongs to a namespace that
	// died with it: migration removes it.
	preBoot := e.hostAddr(100)
	writeLease(t, legacy, preBoot, "pre-boot-id\r\n"+ifName, bootTime(t).Add(-2*time.Hour))

	// The switch: one word, plus the plugin's dataDir on tmpfs.
	e.writeConflist(t, e.reclaimConf(t, "nomad.conflist"))

	seen := map[netip.Addr]string{}
	var added []netns
	for i := range 20 {
		ns := e.addNetns(t, fmt.Sprintf("n%02d", i))
		p, _ := parseResult(t, e.mustCNI(t, "add", ns, "")).addrIn(t, e.subnet4)
		if p.Addr() == addrOld {
			t.Fatalf("ADD %d after the upgrade got %s, the address the running container %s still holds", i, p.Addr(), old.cid)
		}
		if other, dup := seen[p.Addr()]; dup {
			t.Fatalf("ADD %d got %s, already given to %s", i, p.Addr(), other)
		}
		seen[p.Addr()] = ns.cid
		added = append(added, ns)
		e.assertRecord(t, ns, p.Addr())

		if i == 0 {
			// The migration happened with the first ADD. The running
			// container's legacy lease stays: the sign it is alive, for a
			// runtime that DELs it through the old configuration.
			assertLeases(t, legacy, map[netip.Addr]string{addrOld: leaseContent(old.cid)})
			leases := readLeases(t, e.leaseDir())
			if leases[addrOld] != leaseContent(old.cid) {
				t.Fatalf("lease of %s not migrated into %s: %q", addrOld, e.leaseDir(), leases)
			}
			if _, ok := leases[preBoot]; ok {
				t.Errorf("the pre-boot legacy lease %s was migrated instead of dropped", preBoot)
			}
			if got := leaseMtime(t, e.leaseDir(), addrOld); !got.Equal(oldMtime) {
				t.Errorf("migrated lease mtime %v, want the original %v", got, oldMtime)
			}
			marker, err := os.ReadFile(filepath.Join(e.recordDir(), ".migrated"))
			if err != nil || strings.TrimSpace(string(marker)) != bootID(t) {
				t.Errorf("migration marker: %q %v, want this boot's id", marker, err)
			}
		}
	}

	// The old container still works, with all its rules.
	assertAddrOnIf(t, old, po)
	ping(t, old, gw)
	e.assertNAT(t, old.cid, natWant{Masq: []netip.Addr{addrOld}, DNAT: []portMap{{port, addrOld}}})

	// A sweep keeps the migrated lease: its legacy copy still names it.
	e.mustCNI(t, "check", added[0], "")
	if got := readLeases(t, e.leaseDir())[addrOld]; got != leaseContent(old.cid) {
		t.Fatalf("CHECK released the migrated lease of the running container (now %q)", got)
	}
	ping(t, old, gw)

	// Its DEL through the plugin releases it.
	e.mustCNI(t, "del", old, capArgs)
	if _, ok := readLeases(t, e.leaseDir())[addrOld]; ok {
		t.Errorf("DEL through the plugin left the lease of %s", addrOld)
	}
	e.assertNAT(t, old.cid, natWant{})
	assertLeases(t, legacy, nil)

	for _, ns := range added {
		e.mustCNI(t, "del", ns, "")
	}
	e.assertNetworkEmpty(t, e.leaseDir())
	e.assertDefaultDirsUntouched(t)
}

// TestAdoptInPlaceThenDelThroughTheOldConfig: a runtime caches the
// configuration of each attachment at ADD and DELs with it (podman, libcni's
// cache). Containers started on plain bridge, then the network switched to
// the plugin: their DEL still reaches plain bridge on the legacy lease
// directory. The plugin's copy of their lease must not outlive that: a
// restarted container's ADD succeeds (it failed with "duplicate
// allocation"), a removed container's copy goes at the next sweep, and
// nothing is left in either directory.
func TestAdoptInPlaceThenDelThroughTheOldConfig(t *testing.T) {
	e := newEnv(t)
	e.requirePlugin(t)
	legacy := filepath.Join(e.persistDir, e.netName)
	bare := e.confFor(t, "minimal.conflist")
	bareBridge(t, bare, e.persistDir)
	plugin := e.reclaimConf(t, "minimal.conflist")

	e.writeConflist(t, bare)
	restarted, removed := e.addNetns(t, "restarted"), e.addNetns(t, "removed")
	pr, _ := parseResult(t, e.mustCNI(t, "add", restarted, "")).addrIn(t, e.subnet4)
	pd, _ := parseResult(t, e.mustCNI(t, "add", removed, "")).addrIn(t, e.subnet4)

	// The switch; the next ADD migrates both running containers' leases.
	e.writeConflist(t, plugin)
	fresh := e.addNetns(t, "fresh")
	e.mustCNI(t, "add", fresh, "")
	assertLeases(t, legacy, map[netip.Addr]string{pr.Addr(): leaseContent(restarted.cid), pd.Addr(): leaseContent(removed.cid)})
	if got := readLeases(t, e.leaseDir()); got[pr.Addr()] != leaseContent(restarted.cid) || got[pd.Addr()] != leaseContent(removed.cid) {
		t.Fatalf("leases not migrated: %v", got)
	}

	// Both are stopped: their runtime DELs with the configuration cached at
	// ADD, plain bridge on the legacy directory.
	e.writeConflist(t, bare)
	e.mustCNI(t, "del", restarted, "")
	e.mustCNI(t, "del", removed, "")
	assertLeases(t, legacy, nil)
	e.writeConflist(t, plugin)

	// One starts again, through the plugin now.
	out, stderr, err := e.cnitool("add", restarted, "")
	if err != nil {
		t.Fatalf("ADD of the restarted container: %v\n%s", err, stderr)
	}
	p2, gw := parseResult(t, out).addrIn(t, e.subnet4)
	e.assertReleased(t, stderr, restarted.cid, "released its legacy lease")
	ping(t, restarted, gw)
	e.assertRecord(t, restarted, p2.Addr())

	// The other is gone for good: the next sweep releases its copy.
	_, stderr, err = e.cnitool("check", fresh, "")
	if err != nil {
		t.Fatalf("CHECK: %v\n%s", err, stderr)
	}
	e.assertReleased(t, stderr, removed.cid, "released its legacy lease")
	if _, ok := readLeases(t, e.leaseDir())[pd.Addr()]; ok {
		t.Errorf("the removed container's lease %s is still held", pd.Addr())
	}
	e.assertNoRecord(t, removed.cid)

	for _, ns := range []netns{restarted, fresh} {
		e.mustCNI(t, "del", ns, "")
	}
	assertLeases(t, e.leaseDir(), nil)
	e.assertNetworkEmpty(t, legacy)
}

// TestAdoptThenCheckOrDelFirst: a container the bare bridge chain added,
// the conflist switched to the plugin, and the first verb through it on the
// network is not an ADD. A CHECK (Nomad's restore, its client restarted
// with the new conflist or with the plugin in front as bridge) must pass:
// host-local finds the lease in the dataDir (regression: it failed, and
// Nomad re-created the allocation's namespace, re-ADDed, was refused and
// killed the allocation). A DEL (a runtime that reloads the conflist) must
// leave no lease of the container in either directory (regression: the
// legacy lease stayed, and the next ADD migrated it as live).
func TestAdoptThenCheckOrDelFirst(t *testing.T) {
	for _, first := range []string{"check", "del"} {
		t.Run(first, func(t *testing.T) {
			e := newEnv(t)
			e.requirePlugin(t)
			legacy := filepath.Join(e.persistDir, e.netName)
			bare := e.confFor(t, "nomad.conflist")
			bareBridge(t, bare, e.persistDir)
			e.writeConflist(t, bare)
			old := e.addNetns(t, "old")
			po, _ := parseResult(t, e.mustCNI(t, "add", old, "")).addrIn(t, e.subnet4)
			assertLeases(t, legacy, map[netip.Addr]string{po.Addr(): leaseContent(old.cid)})

			e.writeConflist(t, e.reclaimConf(t, "nomad.conflist"))
			if _, stderr, err := e.cnitool(first, old, ""); err != nil {
				t.Fatalf("%s of the container the bare chain added: %v\n%s", first, err, stderr)
			}
			if first == "check" {
				e.mustCNI(t, "del", old, "")
			}
			// The next ADD migrates whatever is left of it.
			fresh := e.addNetns(t, "fresh")
			e.mustCNI(t, "add", fresh, "")
			e.assertNoTrace(t, old.cid)
			assertLeases(t, legacy, nil)
			e.mustCNI(t, "del", fresh, "")
			e.assertNetworkEmpty(t, e.leaseDir())
		})
	}
}
