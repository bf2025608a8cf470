package podman

import (
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// A network's type is switched while its containers run: podman created it
// as plain bridge (host-local's leases in its default
// /var/lib/cni/networks/<net>), containers A (with a published port) and B
// run on it, then the conflist gets the one word. Podman caches each
// attachment's configuration at ADD and DELs with it, so A and B keep
// being torn down by plain bridge on the legacy directory:
//
//   - C's ADD, the plugin's first on the network, copies A's and B's
//     leases into its dataDir and keeps the legacy files (records
//     "migrated"), so nobody gets their addresses;
//   - `podman stop A` (plain bridge) releases only the legacy file; the
//     next `podman start A` (through the plugin) releases the copy first,
//     then allocates: it succeeds and serves;
//   - `podman rm -f B` releases only the legacy file too; podman sends no
//     GC, so the copy stays until a sweep: `nomad-bridge-cni gc` releases
//     it, and nothing of A's or C's.
//
// There is no bare-bridge control: what failed here ("duplicate
// allocation" at the restart of A) was the plugin's own earlier migration.
func TestSwitchTypeWhileRunning(t *testing.T) {
	e := newEnv(t, oneWord)
	n := e.addBridgeNetwork(t, "a")
	legacy := e.legacyDir(n)

	a := e.run(t, "a", n, withHostPort(t))
	b := e.run(t, "b", n)
	addrA := e.checkServesIn(t, a, n, "eth0", legacy, false)
	addrB := e.checkServesIn(t, b, n, "eth0", legacy, false)
	if leases := e.leases(t, n); len(leases) != 0 {
		t.Fatalf("leases in the plugin's dataDir before the switch: %q", leases)
	}

	e.adoptOneWord(t, n)
	c := e.run(t, "c", n)
	addrC := e.checkServes(t, c, n, "eth0")
	for _, x := range []struct {
		c    *container
		addr netip.Addr
	}{{a, addrA}, {b, addrB}} {
		e.assertLease(t, n, x.addr, x.c.id, "eth0")
		assertLeaseIn(t, legacy, x.addr, x.c.id, "eth0")
		e.assertMigrated(t, n, x.c, filepath.Join(legacy, x.addr.String()))
		assertServes(t, netip.AddrPortFrom(x.addr, 80).String(), e.token)
	}
	if slices.Contains([]netip.Addr{addrA, addrB}, addrC) {
		t.Fatalf("C got %s, an address A (%s) or B (%s) still holds", addrC, addrA, addrB)
	}
	var before leasesDoc
	operatorJSON(t, e.operatorOnHost, &before, "leases", "--data-dir", e.tmpfs, "--network", n.name)
	for _, x := range []*container{a, b, c} {
		assertStates(t, before, x, "live")
	}

	// Podman DELs A with the configuration it cached at ADD.
	e.podmanLogged(t, "stop", a.id)
	if got := leasesOf(t, legacy, a.id); len(got) != 0 {
		t.Fatalf("A's legacy lease %v left after podman stop", got)
	}
	assertNoRules(t, n, a.id)
	var stopped leasesDoc
	operatorJSON(t, e.operatorOnHost, &stopped, "leases", "--data-dir", e.tmpfs, "--network", n.name)
	assertStates(t, stopped, a, "stale")

	e.podmanLogged(t, "start", a.id)
	e.waitReady(t, a)
	restarted := e.checkServes(t, a, n, "eth0")
	if got := leasesOf(t, e.leaseDir(n), a.id); len(got) != 1 {
		t.Errorf("A's leases after its restart: %v, want only %s", got, restarted)
	}
	if got := leasesOf(t, legacy, a.id); len(got) != 0 {
		t.Errorf("A's legacy leases after its restart: %v", got)
	}
	assertMasqFrom(t, n, a.id, restarted)

	// B goes for good; its copy stays until a sweep.
	e.podmanLogged(t, "rm", "--force", "--time", "0", b.id)
	if got := leasesOf(t, legacy, b.id); len(got) != 0 {
		t.Fatalf("B's legacy lease %v left after podman rm", got)
	}
	assertNoRules(t, n, b.id)
	e.assertLease(t, n, addrB, b.id, "eth0")
	var gc gcDoc
	operatorJSON(t, e.operatorOnHost, &gc, "gc", "--data-dir", e.tmpfs, "--network", n.name)
	if len(gc.Released) != 1 || gc.Released[0].ContainerID != b.id || !slices.Equal(gc.Released[0].IPs, []string{addrB.String()}) {
		t.Fatalf("gc released %+v, want B's %s alone", gc.Released, addrB)
	}
	e.assertReleased(t, n, b.id, "eth0")
	e.assertLease(t, n, restarted, a.id, "eth0")
	e.assertRecord(t, n, a.id, "eth0", true)
	e.assertLease(t, n, addrC, c.id, "eth0")
	e.assertRecord(t, n, c.id, "eth0", true)
	assertServes(t, netip.AddrPortFrom(restarted, 80).String(), e.token)
	assertServes(t, netip.AddrPortFrom(addrC, 80).String(), e.token)

	e.podmanLogged(t, "rm", "--force", "--time", "0", a.id, c.id)
	for _, dir := range []string{e.leaseDir(n), legacy} {
		if leases := leasesIn(t, dir); len(leases) != 0 {
			t.Errorf("leases left in %s: %q", dir, leases)
		}
	}
	for _, x := range []*container{a, b, c} {
		e.assertRecord(t, n, x.id, "eth0", false)
		assertNoRules(t, n, x.id)
	}
}

// assertMigrated checks that container c's record on network n is the
// migration's, naming its legacy lease file.
func (e *env) assertMigrated(t *testing.T, n *network, c *container, legacyLease string) {
	t.Helper()
	path := filepath.Join(e.recordDir(n), c.id+"@eth0")
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("record of %s: %v", c.name, err)
	}
	var rec struct {
		State        string   `json:"state"`
		LegacyLeases []string `json:"legacyLeases"`
	}
	if err := json.Unmarshal(raw, &rec); err != nil {
		t.Fatalf("parse %s: %v", path, err)
	}
	if rec.State != "migrated" || !slices.Equal(rec.LegacyLeases, []string{legacyLease}) {
		t.Fatalf("record of %s: state %q, legacy leases %q; want migrated from %s:\n%s", c.name, rec.State, rec.LegacyLeases, legacyLease, raw)
	}
}

// assertStates checks that every row of container c in doc is in state
// want.
func assertStates(t *testing.T, doc leasesDoc, c *container, want string) {
	t.Helper()
	rows := doc.rowsOf(c.id)
	if len(rows) == 0 {
		t.Fatalf("leases lists nothing of %s", c.name)
	}
	for _, r := range rows {
		if r.State != want {
			t.Fatalf("leases: %s %s is %s (%s), want %s", c.name, r.IP, r.State, r.Reason, want)
		}
	}
	if want == "live" {
		return
	}
	t.Logf("%s: %s (%s)", c.name, rows[0].State, strings.TrimSpace(rows[0].Reason))
}
