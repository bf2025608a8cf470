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
			// The migration happened with the first ADD.
			assertLeases(t, legacy, nil)
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
	e.assertMasq(t, old, addrOld)
	e.assertDNAT(t, old, addrOld, port, 80)

	// A sweep keeps the migrated lease: it has no record, but is from this
	// boot.
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
	e.assertNoMasq(t, old)
	e.assertNoDNAT(t, old)
	assertLeases(t, legacy, nil)

	for _, ns := range added {
		e.mustCNI(t, "del", ns, "")
	}
	assertLeases(t, e.leaseDir(), nil)
	e.assertRecordsExactly(t)
	e.assertDefaultDirsUntouched(t)
	e.assertNetworkNATEmpty(t)
}
