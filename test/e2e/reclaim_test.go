package e2e

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/cniexec"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/testhost"
)

// noAddresses is host-local's error when every address of the range is
// leased: what leaked leases lead to upstream.
const noAddresses = "no IP addresses available"

// portMappings is CAP_ARGS mapping hostPort to the container's port 80.
func portMappings(hostPort int) string {
	return fmt.Sprintf(`{"portMappings":[{"hostPort":%d,"containerPort":80,"protocol":"tcp"}]}`, hostPort)
}

// TestReclaimOnCheck: container A's namespace is deleted without a DEL.
// The next CHECK of another container, B, on the network releases
// everything A left (lease, bridge's ipMasq chain and POSTROUTING jump,
// portmap's DNAT chain and its CNI-HOSTPORT-DNAT jump, the record), leaves
// B alone, and A's address can be allocated again. The range holds two
// addresses, so until the CHECK the stale lease makes every ADD fail the
// upstream way: that proves it is the CHECK that frees it.
func TestReclaimOnCheck(t *testing.T) {
	e := newEnv(t)
	e.requirePlugin(t)
	conf := e.reclaimConf(t, "nomad.conflist")
	setRange(t, conf, e.hostAddr(10), e.hostAddr(11))
	e.writeConflist(t, conf)

	a, b := e.addNetns(t, "a"), e.addNetns(t, "b")
	portA := randomHostPort()
	portB := portA + 1
	capA, capB := portMappings(portA), portMappings(portB)
	pa, _ := parseResult(t, e.mustCNI(t, "add", a, capA)).addrIn(t, e.subnet4)
	pb, gw := parseResult(t, e.mustCNI(t, "add", b, capB)).addrIn(t, e.subnet4)
	addrA, addrB := pa.Addr(), pb.Addr()
	assertLeases(t, e.leaseDir(), map[netip.Addr]string{addrA: leaseContent(a.cid), addrB: leaseContent(b.cid)})
	e.assertRecord(t, a, addrA)
	e.assertRecord(t, b, addrB)
	e.assertNAT(t, a.cid, natWant{Masq: []netip.Addr{addrA}, DNAT: []portMap{{portA, addrA}}})
	e.assertNAT(t, b.cid, natWant{Masq: []netip.Addr{addrB}, DNAT: []portMap{{portB, addrB}}})

	e.mustKillNetns(t, a)

	// The stale lease holds the range: an ADD must fail, and leave no
	// record behind.
	c := e.addNetns(t, "c")
	if out, _, err := e.cnitool("add", c, ""); err == nil || !strings.Contains(err.Error(), noAddresses) {
		t.Fatalf("ADD with A's stale lease holding the range: want %q, got %v\nstdout: %s", noAddresses, err, out)
	}
	e.assertNoRecord(t, c.cid)

	leaseB := readLeases(t, e.leaseDir())[addrB]
	_, recB := e.readRecord(t, b.cid)

	_, stderr, err := e.cnitool("check", b, capB)
	if err != nil {
		t.Fatalf("CHECK of the live container B: %v\nstderr: %s", err, stderr)
	}
	e.assertReleased(t, stderr, a.cid, addrA.String(), a.path, e.masqChain(a.cid), e.dnatChain(a.cid))
	if lines := e.releaseLines(stderr); len(lines) != 1 {
		t.Errorf("CHECK released more than A: %q", lines)
	}

	// Everything of A is gone.
	assertLeases(t, e.leaseDir(), map[netip.Addr]string{addrB: leaseB})
	e.assertNoRecord(t, a.cid)
	e.assertNAT(t, a.cid, natWant{})
	if rules := firewallRules(t, addrA); len(rules) > 0 {
		// Not in docs/reclaim.md's list of what a release removes (see its "Releasing a stale attachment").
		t.Logf("note: firewall's rules for A's %s stay in %s after the release:\n%s", addrA, firewallChain, rulesString(rules))
	}

	// B is untouched.
	if _, now := e.readRecord(t, b.cid); string(now) != string(recB) {
		t.Errorf("B's record changed by the sweep:\nbefore %s\nafter  %s", recB, now)
	}
	e.assertNAT(t, b.cid, natWant{Masq: []netip.Addr{addrB}, DNAT: []portMap{{portB, addrB}}})
	e.assertFirewall(t, addrB)
	ping(t, b, gw)

	// A's address is free again: the only one left in the range.
	d := e.addNetns(t, "d")
	pd, gwd := parseResult(t, e.mustCNI(t, "add", d, "")).addrIn(t, e.subnet4)
	if pd.Addr() != addrA {
		t.Fatalf("ADD after the sweep got %s, want A's released %s", pd.Addr(), addrA)
	}
	assertLease(t, e.leaseDir(), addrA, d.cid)
	e.assertRecord(t, d, addrA)
	ping(t, d, gwd)

	// A sweep with nothing to release says nothing.
	_, stderr, err = e.cnitool("check", b, capB)
	if err != nil {
		t.Fatalf("second CHECK of B: %v", err)
	}
	if lines := e.releaseLines(stderr); len(lines) != 0 {
		t.Errorf("a sweep with nothing stale logged releases: %q", lines)
	}
	if strings.Contains(stderr, "nomad-bridge-cni:") {
		t.Errorf("a sweep with nothing stale is not silent: %q", stderr)
	}

	e.mustCNI(t, "del", b, capB)
	e.mustCNI(t, "del", d, "")
	e.mustCNI(t, "del", c, "")
	e.assertNetworkEmpty(t, e.leaseDir())
	e.assertDefaultDirsUntouched(t)
}

// TestReclaimOnCheckWhenPortmapCutItsComment: portmap cuts a comment over
// 255 characters (trimComment), so with a long network name its jump names
// the container only by the chain it jumps to. A CHECK sweep still
// releases all that A left: the jump must go before portmap's chain can.
func TestReclaimOnCheckWhenPortmapCutItsComment(t *testing.T) {
	e := newEnv(t)
	e.requirePlugin(t)
	// cnitool's container IDs are 28 characters: portmap's comment (20
	// more) is then 258 characters, bridge's (15 more) 253, which
	// iptables still takes.
	e.netName += "-" + strings.Repeat("n", 210-len(e.netName)-1)
	e.writeConflist(t, e.reclaimConf(t, "nomad.conflist"))

	a, b := e.addNetns(t, "a"), e.addNetns(t, "b")
	portA := randomHostPort()
	capA, capB := portMappings(portA), portMappings(portA+1)
	pa, _ := parseResult(t, e.mustCNI(t, "add", a, capA)).addrIn(t, e.subnet4)
	pb, gw := parseResult(t, e.mustCNI(t, "add", b, capB)).addrIn(t, e.subnet4)
	addrA, addrB := pa.Addr(), pb.Addr()
	// portmap's jump is there, its comment cut (portmap makes it 256
	// characters, iptables keeps 255).
	cutJump := func(cid string) {
		t.Helper()
		if nat := e.readNAT(t, cid)["iptables"]; len(nat.dnatJumps) != 1 || len(nat.dnatJumps[0].Comment()) != 255 || !nat.hasDNAT || !nat.hasMasq {
			t.Fatalf("want %s's chains and one jump to portmap's with a cut comment:\n%v", cid, e.readNAT(t, cid))
		}
	}
	cutJump(a.cid)
	cutJump(b.cid)

	e.mustKillNetns(t, a)
	_, stderr, err := e.cnitool("check", b, capB)
	if err != nil {
		t.Fatalf("CHECK of the live container B: %v\nstderr: %s", err, stderr)
	}
	e.assertReleased(t, stderr, a.cid, addrA.String(), e.masqChain(a.cid), e.dnatChain(a.cid))
	e.assertNoRecord(t, a.cid)
	e.assertNAT(t, a.cid, natWant{})
	assertLeases(t, e.leaseDir(), map[netip.Addr]string{addrB: leaseContent(b.cid)})
	cutJump(b.cid)
	ping(t, b, gw)

	e.mustCNI(t, "del", b, capB)
	e.assertNetworkEmpty(t, e.leaseDir())
}

// TestRestoreReAdd is Nomad's restore path: after a failed CHECK Nomad
// re-creates the allocation's namespace at the same path and ADDs again
// under the same container ID, without a DEL. The plugin must release the
// old attachment and succeed: exactly one lease, one ipMasq jump, one
// portmap jump for the ID, and connectivity. ADD into the same, still
// live namespace is a real duplicate and must fail.
func TestRestoreReAdd(t *testing.T) {
	for _, tc := range []struct {
		name string
		// reuseInode re-creates the namespace until the kernel hands out
		// the old one's inode number again (it allocates the lowest free
		// one, so a namespace re-created some time after the old one
		// died, as Nomad does on a client restart, usually gets it).
		reuseInode bool
	}{
		{name: "new-namespace-new-inode"},
		{name: "new-namespace-same-inode", reuseInode: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.requirePlugin(t)
			e.writeConflist(t, e.reclaimConf(t, "nomad.conflist"))
			ns := e.addNetns(t, "a")
			port := randomHostPort()
			capArgs := portMappings(port)

			p1, _ := parseResult(t, e.mustCNI(t, "add", ns, capArgs)).addrIn(t, e.subnet4)
			e.assertRecord(t, ns, p1.Addr())

			// The same namespace, still alive: a real duplicate.
			_, _, err := e.cnitool("add", ns, capArgs)
			if err == nil || !strings.Contains(err.Error(), "already attached") {
				t.Fatalf("second ADD into the same live namespace: want an %q error, got %v", "already attached", err)
			}
			assertLeases(t, e.leaseDir(), map[netip.Addr]string{p1.Addr(): leaseContent(ns.cid)})
			e.assertRecord(t, ns, p1.Addr())

			e.replaceNetns(t, ns, tc.reuseInode)

			out, stderr, err := e.cnitool("add", ns, capArgs)
			if err != nil {
				t.Fatalf("re-ADD into the re-created namespace: %v\nstderr: %s", err, stderr)
			}
			p2, gw := parseResult(t, out).addrIn(t, e.subnet4)
			if p2 != p1 {
				t.Errorf("re-ADD gave %s, first ADD %s: a restore in place keeps its free address", p2, p1)
			}
			e.assertReleased(t, stderr, ns.cid)
			assertLeases(t, e.leaseDir(), map[netip.Addr]string{p2.Addr(): leaseContent(ns.cid)})
			e.assertRecord(t, ns, p2.Addr())
			assertAddrOnIf(t, ns, p2)
			ping(t, ns, gw)
			e.assertNAT(t, ns.cid, natWant{Masq: []netip.Addr{p2.Addr()}, DNAT: []portMap{{port, p2.Addr()}}})

			e.mustCNI(t, "check", ns, capArgs)
			e.mustCNI(t, "del", ns, capArgs)
			e.assertNetworkEmpty(t, e.leaseDir())
		})
	}
}

// replaceNetns deletes ns without a DEL and creates a new namespace at the
// same path, as Nomad does on restore. With sameInode it retries until the
// kernel hands the new namespace the old one's inode number (freed only
// once the old namespace is really destroyed, asynchronously), and skips
// the test if that never happens within 10s. Otherwise it keeps the old
// namespace alive through an open file until the new one exists, so the
// inode numbers surely differ.
func (e *testEnv) replaceNetns(t *testing.T, ns netns, sameInode bool) {
	t.Helper()
	_, oldIno := netnsIdentity(t, ns.path)
	suffix := strings.TrimPrefix(ns.name, "nbc-e2e-"+e.id+"-")
	if !sameInode {
		hold, err := os.Open(ns.path)
		if err != nil {
			t.Fatalf("open %s: %v", ns.path, err)
		}
		defer hold.Close()
	}
	e.mustKillNetns(t, ns)
	deadline := time.Now().Add(10 * time.Second)
	for {
		again, err := e.newNetns(suffix)
		if err != nil {
			t.Fatal(err)
		}
		if again != ns {
			t.Fatalf("re-created namespace %+v differs from %+v", again, ns)
		}
		_, ino := netnsIdentity(t, ns.path)
		if ino == oldIno && !sameInode {
			t.Fatalf("new namespace at %s has inode %d although the old one is still alive", ns.path, ino)
		}
		if !sameInode || ino == oldIno {
			t.Logf("re-created %s: inode %d (old %d)", ns.path, ino, oldIno)
			return
		}
		if time.Now().After(deadline) {
			testhost.SkipOrFail(t, fmt.Sprintf("the kernel did not reuse inode %d for a new namespace within 10s (got %d): the reused-inode case must run", oldIno, ino))
		}
		if err := run("ip", "netns", "delete", ns.name); err != nil {
			t.Fatal(err)
		}
		// Polling a kernel-internal release (the netns cleanup work
		// queue) that nothing can be subscribed to.
		time.Sleep(100 * time.Millisecond)
	}
}

// TestReclaimBootRules: attachments from another boot are released on
// CHECK: a record carrying another boot ID (its namespace is even still
// there: the boot rule alone decides), and a record-less lease file older
// than the boot time. A record-less lease from this boot is kept, and the
// CHECK still succeeds.
func TestReclaimBootRules(t *testing.T) {
	e := newEnv(t)
	e.requirePlugin(t)
	e.writeConflist(t, e.reclaimConf(t, "minimal.conflist"))
	live, old := e.addNetns(t, "live"), e.addNetns(t, "old")

	pl, gw := parseResult(t, e.mustCNI(t, "add", live, "")).addrIn(t, e.subnet4)
	po, _ := parseResult(t, e.mustCNI(t, "add", old, "")).addrIn(t, e.subnet4)
	e.assertRecord(t, live, pl.Addr())
	e.assertRecord(t, old, po.Addr())
	e.assertNAT(t, old.cid, natWant{Masq: []netip.Addr{po.Addr()}})

	// old's record now claims another boot.
	_, raw := e.readRecord(t, old.cid)
	otherBoot := "00000000-1111-4222-8333-444444444444"
	forged := strings.Replace(string(raw), `"bootID":"`+bootID(t)+`"`, `"bootID":"`+otherBoot+`"`, 1)
	if forged == string(raw) {
		t.Fatalf("record has no bootID field to forge: %s", raw)
	}
	if err := os.WriteFile(e.recordPath(old.cid), []byte(forged), 0o600); err != nil {
		t.Fatalf("forge record: %v", err)
	}

	// A lease with no record from two hours before boot, and one from
	// this boot.
	boot := bootTime(t)
	preBoot, thisBoot := e.hostAddr(200), e.hostAddr(201)
	writeLease(t, e.leaseDir(), preBoot, "pre-boot-id\r\n"+ifName, boot.Add(-2*time.Hour))
	writeLease(t, e.leaseDir(), thisBoot, "this-boot-id\r\n"+ifName, time.Now())
	thisBootMtime := leaseMtime(t, e.leaseDir(), thisBoot)

	leaseLive := readLeases(t, e.leaseDir())[pl.Addr()]
	_, recLive := e.readRecord(t, live.cid)

	_, stderr, err := e.cnitool("check", live, "")
	if err != nil {
		t.Fatalf("CHECK of the live container: %v\nstderr: %s", err, stderr)
	}
	e.assertReleased(t, stderr, old.cid, po.Addr().String(), "boot")
	e.assertReleased(t, stderr, "pre-boot-id", preBoot.String(), "boot")
	if lines := e.releaseLines(stderr); len(lines) != 2 {
		t.Errorf("want exactly 2 releases, got %q", lines)
	}
	if !strings.Contains(stderr, "this-boot-id") {
		// Such a lease must be reported; the sweep only
		// logs releases and problems. Not a failure of this test.
		t.Logf("note: the record-less lease from this boot (%s) is not mentioned on stderr", thisBoot)
	}

	assertLeases(t, e.leaseDir(), map[netip.Addr]string{
		pl.Addr(): leaseLive,
		thisBoot:  "this-boot-id\r\n" + ifName,
	})
	if got := leaseMtime(t, e.leaseDir(), thisBoot); !got.Equal(thisBootMtime) {
		t.Errorf("kept lease %s was rewritten: mtime %v, was %v", thisBoot, got, thisBootMtime)
	}
	e.assertNoRecord(t, old.cid)
	e.assertNAT(t, old.cid, natWant{})
	if _, now := e.readRecord(t, live.cid); string(now) != string(recLive) {
		t.Errorf("the live record changed:\nbefore %s\nafter  %s", recLive, now)
	}
	e.assertNAT(t, live.cid, natWant{Masq: []netip.Addr{pl.Addr()}})
	ping(t, live, gw)

	// The record-less lease from this boot survives further sweeps too.
	e.mustCNI(t, "check", live, "")
	if _, ok := readLeases(t, e.leaseDir())[thisBoot]; !ok {
		t.Errorf("lease %s from this boot with no record was released by a second CHECK", thisBoot)
	}

	e.mustCNI(t, "del", live, "")
	e.mustCNI(t, "del", old, "")
	assertLeases(t, e.leaseDir(), map[netip.Addr]string{thisBoot: "this-boot-id\r\n" + ifName})
	e.assertRecordsExactly(t)
	e.assertNetworkNATEmpty(t)
}

// TestGCVerbValidList sends GC through libcni with a real valid list
// naming one of three attachments. Exactly that one survives: the others
// lose their leases, records and ipMasq rules, and an orphan ipMasq chain
// and jump (IPv4 and IPv6) of a container with neither lease nor record go
// too. No attachment is cached in libcni's cache (a per-test cache dir and
// cnitool's entries dropped), so only the plugin's GC can release anything.
func TestGCVerbValidList(t *testing.T) {
	e := newEnv(t)
	e.requirePlugin(t)
	conf := e.reclaimConf(t, "minimal.conflist")
	conf["cniVersion"] = "1.1.0"
	confPath := e.writeConflist(t, conf)

	a, b, c := e.addNetns(t, "a"), e.addNetns(t, "b"), e.addNetns(t, "c")
	addrs := map[string]netip.Addr{}
	for _, ns := range []netns{a, b, c} {
		p, _ := parseResult(t, e.mustCNI(t, "add", ns, "")).addrIn(t, e.subnet4)
		addrs[ns.cid] = p.Addr()
		e.assertRecord(t, ns, p.Addr())
		e.assertNAT(t, ns.cid, natWant{Masq: []netip.Addr{p.Addr()}})
	}
	if err := e.dropCnitoolCache(); err != nil {
		t.Fatalf("drop cnitool cache: %v", err)
	}

	// An orphan: bridge's ipMasq chain and jump for a container that has
	// no lease and no record, as a DEL that skipped the teardown leaves.
	orphan := "orphan-id"
	e.track(orphan) // cleanup removes its chains if the plugin does not
	orphanSrc := map[string]string{"iptables": e.hostAddr(250).String(), "ip6tables": e.subnet6.Addr().Next().String()}
	for _, fam := range ipFamilies {
		chain := e.masqChain(orphan)
		for _, args := range [][]string{
			{"-N", chain},
			{"-A", chain, "-j", "MASQUERADE"},
			{"-A", "POSTROUTING", "-s", orphanSrc[fam], "-j", chain, "-m", "comment", "--comment", e.masqComment(orphan)},
		} {
			if err := run(fam, append([]string{"-w", "-t", "nat"}, args...)...); err != nil {
				t.Fatalf("create orphan rules: %v", err)
			}
		}
		if j := e.readNAT(t, orphan)[fam].masqJumps; len(j) != 1 {
			t.Fatalf("%s: orphan jump not found after creating it", fam)
		}
	}

	if err := e.gcWithValid(t, confPath, a); err != nil {
		t.Fatalf("GC with valid list [%s]: %v", a.cid, err)
	}

	assertLeases(t, e.leaseDir(), map[netip.Addr]string{addrs[a.cid]: leaseContent(a.cid)})
	e.assertRecord(t, a, addrs[a.cid])
	e.assertNAT(t, a.cid, natWant{Masq: []netip.Addr{addrs[a.cid]}})
	e.assertRecordsExactly(t, a.cid)
	for _, ns := range []netns{b, c} {
		e.assertNoRecord(t, ns.cid)
		e.assertNAT(t, ns.cid, natWant{})
	}
	e.assertNAT(t, orphan, natWant{})
	ping(t, a, e.hostAddr(1))

	// A second GC with the same list has nothing left to do.
	if err := e.gcWithValid(t, confPath, a); err != nil {
		t.Fatalf("second GC: %v", err)
	}
	assertLeases(t, e.leaseDir(), map[netip.Addr]string{addrs[a.cid]: leaseContent(a.cid)})
	e.assertNAT(t, a.cid, natWant{Masq: []netip.Addr{addrs[a.cid]}})

	e.mustCNI(t, "del", a, "")
	e.assertNetworkEmpty(t, e.leaseDir())
}

// TestDelWithoutNetns: the namespace is gone and the runtime's DEL comes
// with an empty CNI_NETNS (nerdctl) or the dead path (CRI-O replaying
// cached DELs). bridge then releases the lease but skips its ipMasq
// teardown; the plugin must remove those rules and its record itself. The
// control runs bare bridge the same way and must leave the rules behind,
// which proves the assertion can fail.
//
// replaced-netns goes one step beyond the two cases above: the path
// holds a new namespace (Nomad re-created it) when the DEL comes. bridge
// enters it, finds no eth0 and skips the teardown just the same, and the
// record still names the old namespace.
func TestDelWithoutNetns(t *testing.T) {
	for _, tc := range []struct {
		name      string
		emptyPath bool
		replace   bool
		bare      bool
	}{
		{name: "empty-CNI_NETNS", emptyPath: true},
		{name: "vanished-netns"},
		{name: "replaced-netns", replace: true},
		{name: "control-bare-bridge-empty-CNI_NETNS", emptyPath: true, bare: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			conf := e.reclaimConf(t, "minimal.conflist")
			plugin, leaseDir := pluginType, e.leaseDir()
			if tc.bare {
				bareBridge(t, conf, e.persistDir)
				plugin, leaseDir = "bridge", filepath.Join(e.persistDir, e.netName)
			} else {
				e.requirePlugin(t)
			}
			e.writeConflist(t, conf)
			ns := e.addNetns(t, "a")
			p, _ := parseResult(t, e.mustCNI(t, "add", ns, "")).addrIn(t, e.subnet4)
			assertLeases(t, leaseDir, map[netip.Addr]string{p.Addr(): leaseContent(ns.cid)})
			e.assertNAT(t, ns.cid, natWant{Masq: []netip.Addr{p.Addr()}})

			if tc.replace {
				e.replaceNetns(t, ns, false)
			} else {
				e.mustKillNetns(t, ns)
			}
			path := ns.path
			if tc.emptyPath {
				path = ""
			}
			del := e.cniArgs("DEL", ns)
			del.NetNS = path
			r := cniexec.Run(t, e.binary(plugin), del, cniexec.Opts{Stdin: entryConfig(t, conf, plugin)})
			if r.Err != nil {
				t.Fatalf("DEL with CNI_NETNS=%q: %v", path, r.Err)
			}
			assertLeases(t, leaseDir, nil)
			if tc.bare {
				if len(e.readNAT(t, ns.cid)["iptables"].masqJumps) == 0 {
					t.Fatalf("control: bare bridge removed its ipMasq jump on a DEL without netns; the test no longer shows the gap")
				}
				t.Logf("control: bare bridge left its ipMasq rules, as upstream does")
				return
			}
			e.assertNAT(t, ns.cid, natWant{})
			e.assertNoRecord(t, ns.cid)
			e.assertNetworkNATEmpty(t)
			t.Logf("DEL stderr: %s", strings.TrimSpace(r.Stderr))

			// Idempotent: again.
			if r := cniexec.Run(t, e.binary(plugin), del, cniexec.Opts{Stdin: entryConfig(t, conf, plugin)}); r.Err != nil {
				t.Fatalf("second DEL: %v", r.Err)
			}
		})
	}
}
