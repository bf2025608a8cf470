package e2e

import (
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	gocni "github.com/containerd/go-cni"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/cniexec"
)

// TestStatus sends STATUS (cniVersion 1.1.0) through cnitool: it passes on a
// working config and fails, saying why, when the delegate is missing or the
// dataDir cannot be used.
func TestStatus(t *testing.T) {
	statusConf := func(t *testing.T, e *testEnv) map[string]any {
		t.Helper()
		conf := e.confFor(t, "minimal.conflist")
		conf["cniVersion"] = "1.1.0"
		return conf
	}

	t.Run("ok", func(t *testing.T) {
		e := newEnv(t)
		e.requirePlugin(t)
		e.writeConflist(t, statusConf(t, e))
		ns := e.addNetns(t, "a")
		if _, stderr, err := e.cnitool("status", ns, ""); err != nil {
			t.Fatalf("STATUS of a working config failed: %v (%s)", err, stderr)
		}
	})

	t.Run("delegate-missing", func(t *testing.T) {
		e := newEnv(t)
		e.requirePlugin(t)
		conf := statusConf(t, e)
		entryOfType(t, conf, pluginType)["delegate"] = "nonexistent-plugin"
		e.writeConflist(t, conf)
		ns := e.addNetns(t, "a")
		_, _, err := e.cnitool("status", ns, "")
		if err == nil {
			t.Fatal("STATUS succeeded although the delegate nonexistent-plugin is not in CNI_PATH")
		}
		if !strings.Contains(err.Error(), "nonexistent-plugin") {
			t.Fatalf("STATUS failed without naming the missing delegate: %v", err)
		}
		t.Logf("STATUS failed as it should: %v", err)
	})

	t.Run("dataDir-unusable", func(t *testing.T) {
		e := newEnv(t)
		e.requirePlugin(t)
		// A dataDir below a regular file can be neither created nor used.
		file := filepath.Join(e.dataDir, "not-a-directory")
		if err := os.WriteFile(file, nil, 0o644); err != nil {
			t.Fatalf("write file: %v", err)
		}
		conf := statusConf(t, e)
		entryOfType(t, conf, pluginType)["dataDir"] = filepath.Join(file, "leases")
		e.writeConflist(t, conf)
		ns := e.addNetns(t, "a")
		_, _, err := e.cnitool("status", ns, "")
		if err == nil {
			t.Fatal("STATUS succeeded although dataDir lies below a regular file")
		}
		t.Logf("STATUS failed as it should: %v", err)
	})
}

// TestGC sends GC (cniVersion 1.1.0) with two containers attached. Through
// libcni with a valid list naming one of them, only the other one's lease
// goes; through `cnitool gc` (no valid list: none is valid) all go.
//
// Both calls run with no cached attachments for the network (a per-test
// libcni cache, and cnitool's cache entries dropped first), because libcni
// otherwise DELs each stale cached attachment before sending GC, and the
// leases would go even if the plugin ignored GC. The control runs the same
// with the bare bridge chain, which does not implement or forward GC: the
// stale lease must stay there, which proves the assertion can fail.
func TestGC(t *testing.T) {
	t.Run("nomad-bridge-cni", func(t *testing.T) {
		f := newGCFixture(t, false)

		if err := f.e.gcWithValid(t, f.confPath, f.a); err != nil {
			t.Fatalf("GC with valid list [%s]: %v", f.a.cid, err)
		}
		assertLeases(t, f.leaseDir, map[netip.Addr]string{f.addrA: leaseContent(f.a.cid)})
		// GC leaves the valid container working.
		ping(t, f.a, f.gwA)

		if _, stderr, err := f.e.cnitool("gc", f.a, ""); err != nil {
			t.Fatalf("cnitool gc: %v (%s)", err, stderr)
		}
		assertLeases(t, f.leaseDir, nil)
		f.e.assertDefaultDirsUntouched(t)
	})

	t.Run("control-bare-bridge", func(t *testing.T) {
		f := newGCFixture(t, true)
		if err := f.e.gcWithValid(t, f.confPath, f.a); err != nil {
			t.Fatalf("GC with valid list [%s]: %v", f.a.cid, err)
		}
		// bridge v1.10.0 drops GC: nothing is released.
		assertLeases(t, f.leaseDir, map[netip.Addr]string{
			f.addrA: leaseContent(f.a.cid),
			f.addrB: leaseContent(f.b.cid),
		})
	})
}

// The GC verb with the list under the spec's first name,
// "cni.dev/attachments", which the plugin honours: host-local, to which
// the plugin forwards GC, must keep the listed container's lease too
// (regression: it read no list and released every lease, the listed live
// container's included, while its record and NAT rules stayed).
func TestGCWithTheOldListKeyKeepsWhatItLists(t *testing.T) {
	f := newGCFixture(t, false)
	e := f.e
	conf := e.confFor(t, "minimal.conflist")
	conf["cniVersion"] = "1.1.0"
	var entry map[string]any
	if err := json.Unmarshal(entryConfig(t, conf, pluginType), &entry); err != nil {
		t.Fatal(err)
	}
	entry["cni.dev/attachments"] = []map[string]string{{"containerID": f.a.cid, "ifname": ifName}}
	args := e.cniArgs("GC", f.a)
	args.ContainerID, args.NetNS, args.IfName = "", "", ""
	r := cniexec.Run(t, e.binary(pluginType), args, cniexec.Opts{Stdin: mustJSON(t, entry)})
	if r.ExitCode != 0 {
		t.Fatalf("GC: exit %d: %s %s", r.ExitCode, r.Stdout, r.Stderr)
	}
	assertLeases(t, f.leaseDir, map[netip.Addr]string{f.addrA: leaseContent(f.a.cid)})
	ping(t, f.a, f.gwA)
}

// The GC verb keeps the NAT rules of every attachment it lists, also of
// one the network holds no lease or record of in its data dir: x, attached
// to the same network through a second data dir, keeps its masquerade when
// the first data dir's GC lists it (regression: it went as an orphan's,
// the network being the plugin's there).
func TestGCKeepsTheNATRulesOfWhatItListsFromAnotherDataDir(t *testing.T) {
	f := newGCFixture(t, false)
	e := f.e
	conf := e.confFor(t, "minimal.conflist")
	conf["cniVersion"] = "1.1.0"
	entryOfType(t, conf, pluginType)["dataDir"] = filepath.Join(e.persistDir, "second")
	base := f.e.subnet4.Addr().As4()
	base[3] = 200
	start := netip.AddrFrom4(base)
	base[3] = 210
	setRange(t, conf, start, netip.AddrFrom4(base))
	x := e.addNetns(t, "x")
	stdin := entryConfig(t, conf, pluginType)
	r := cniexec.Run(t, e.binary(pluginType), e.cniArgs("ADD", x), cniexec.Opts{Stdin: stdin})
	if r.ExitCode != 0 {
		t.Fatalf("ADD x through the second data dir: exit %d: %s %s", r.ExitCode, r.Stdout, r.Stderr)
	}
	t.Cleanup(func() { cniexec.Run(t, e.binary(pluginType), e.cniArgs("DEL", x), cniexec.Opts{Stdin: stdin}) })
	addrX, _ := parseResult(t, r.Stdout).addrIn(t, e.subnet4)

	if err := e.gcWithValid(t, f.confPath, f.a, x); err != nil {
		t.Fatalf("GC with valid list [%s %s]: %v", f.a.cid, x.cid, err)
	}
	e.assertNAT(t, x.cid, natWant{Masq: []netip.Addr{addrX.Addr()}})
	e.assertNAT(t, f.b.cid, natWant{})
}

// gcFixture is a network at cniVersion 1.1.0 with two containers attached
// and no cached attachments.
type gcFixture struct {
	e            *testEnv
	confPath     string
	leaseDir     string
	a, b         netns
	addrA, addrB netip.Addr
	gwA          netip.Addr
}

// newGCFixture attaches containers a and b, through the plugin or (bare) the
// bare bridge chain with leases in a persistent directory.
func newGCFixture(t *testing.T, bare bool) gcFixture {
	t.Helper()
	f := gcFixture{e: newEnv(t)}
	e := f.e
	conf := e.confFor(t, "minimal.conflist")
	conf["cniVersion"] = "1.1.0"
	f.leaseDir = e.leaseDir()
	if bare {
		bareBridge(t, conf, e.persistDir)
		f.leaseDir = filepath.Join(e.persistDir, e.netName)
	} else {
		e.requirePlugin(t)
	}
	f.confPath = e.writeConflist(t, conf)
	f.a, f.b = e.addNetns(t, "a"), e.addNetns(t, "b")
	resA := parseResult(t, e.mustCNI(t, "add", f.a, ""))
	resB := parseResult(t, e.mustCNI(t, "add", f.b, ""))
	pa, gw := resA.addrIn(t, e.subnet4)
	pb, _ := resB.addrIn(t, e.subnet4)
	f.addrA, f.addrB, f.gwA = pa.Addr(), pb.Addr(), gw
	assertLeases(t, f.leaseDir, map[netip.Addr]string{
		f.addrA: leaseContent(f.a.cid),
		f.addrB: leaseContent(f.b.cid),
	})
	if err := e.dropCnitoolCache(); err != nil {
		t.Fatalf("drop cnitool cache: %v", err)
	}
	return f
}

// Nomad asks go-cni's Status before every teardown of a cniVersion 1.1.0
// network and drops the teardown when it fails ("resources may have
// leaked"). A full data dir is something a DEL works through (and frees
// space by): STATUS passes, saying so, the Remove that follows it releases
// everything, and an ADD on the full disk fails with its own error
// (regression: STATUS failed with code 50, and no DEL was ever sent).
func TestStatusPassesOnAFullDataDirSoNomadTearsDown(t *testing.T) {
	e := newEnv(t)
	e.requirePlugin(t)
	e.mountTinyTmpfs(t, "256k")
	conf := e.confFor(t, "nomad.conflist")
	conf["cniVersion"] = "1.1.0"
	nomad := e.goCNI(t, gocni.WithConfListBytes(mustJSON(t, conf)))
	ctx := runtimeCtx(t)
	alloc := podUID(t)
	ns := e.podNetns(t, "alloc", alloc)
	port := randomHostPort()
	if _, err := nomad.Setup(ctx, alloc, ns.path, nomadOpts(alloc, port)...); err != nil {
		t.Fatalf("Setup: %v", err)
	}
	filler := fillTmpfs(t, e.dataDir, 0)

	if err := nomad.Status(); err != nil {
		t.Fatalf("STATUS on a full data dir: %v (Nomad would not tear the allocation down)", err)
	}
	if err := nomad.Remove(ctx, alloc, ns.path, nomadDelOpts(port)...); err != nil {
		t.Fatalf("Remove on a full data dir: %v", err)
	}
	e.assertNoTrace(t, alloc)
	fillTmpfs(t, e.dataDir, 0) // what the DEL freed
	other := e.podNetns(t, "other", podUID(t))
	if _, err := nomad.Setup(ctx, other.cid, other.path, nomadOpts(other.cid, port+1)...); err == nil {
		t.Error("ADD on a full data dir passed")
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	e.assertNetworkEmpty(t, e.leaseDir())
}

// Nomad's restore of an allocation whose namespace was lost, on a `cni/`
// network whose conflist (conflist/nomad.conflist) is at cniVersion 1.1.0,
// verb by verb as its client sends them (client/allocrunner/network_hook.go
// Prerun and networking_cni.go Setup and Teardown; the same code from Nomad
// v1.10.0 to v2.0.5, read at v1.11.2):
//
//   - Setup and Teardown begin with ensureCNIInitialized, which calls
//     go-cni's Status() (go-cni v1.1.12 and v1.1.13, Nomad's pins): libcni's
//     GetStatusNetworkList sends STATUS to every plugin of a list at 1.1.0
//     or later, and nothing below (Nomad's own bridge conflist,
//     client/allocrunner/cni/bridge.go, is 0.4.0, and never gets one). A
//     STATUS that fails fails the Setup ("cni not initialized"), which is
//     not ErrCNICheckFailed: the allocation fails, with no second try;
//   - the restored allocation's namespace path is still a namespace
//     (client/allocrunner/network_manager_linux.go, defaultNetworkManager's
//     CreateNetwork: NewNS fails with EPERM on the mounted path, and it
//     returns created=false), so Setup sends CHECK (with `bridge`
//     fingerprinted at 1.3.0 or later, supportsCNICheck);
//   - that CHECK fails: the namespace there is an empty one, whose lo is
//     down, so loopback, first in Nomad's chain, fails it and libcni stops
//     the list there (the plugin never sees this CHECK, and no CHECK sweep
//     runs); the hook then destroys the namespace (DestroyNetwork: unmount
//     and remove the path), makes a new one at the same path
//     (CreateNetwork, created=true) and runs Setup again: STATUS, then ADD
//     with the same container ID (the allocation ID), no DEL between;
//   - Postrun's Teardown: STATUS, then DEL.
//
// STATUS comes while the lost attachment's lease, record and NAT rules are
// still there: it must pass and change nothing. The re-ADD alone releases
// the lost attachment; after it the allocation has one lease (its old
// address), one record naming the new namespace, its NAT and firewall
// rules once, its address on eth0 and a working gateway; the DEL leaves
// nothing. The plugin's log (debug) shows the verbs that reached it, each
// STATUS passing, and the lost attachment released once, by the ADD.
func TestNomadStatusThenFailedCheckThenReAdd(t *testing.T) {
	e := newEnv(t)
	e.requirePlugin(t)
	logFile := filepath.Join(t.TempDir(), "nbc.log")
	conf := e.confFor(t, "nomad.conflist")
	conf["cniVersion"] = "1.1.0"
	entry := entryOfType(t, conf, pluginType)
	entry["logFile"], entry["logLevel"] = logFile, "debug"
	nomad := e.goCNI(t, gocni.WithConfListBytes(mustJSON(t, conf)))
	ctx := runtimeCtx(t)
	alloc := podUID(t)
	ns := e.podNetns(t, "alloc", alloc)
	port := randomHostPort()

	if err := nomad.Status(); err != nil {
		t.Fatalf("STATUS before the first Setup: %v", err)
	}
	res, err := nomad.Setup(ctx, alloc, ns.path, nomadOpts(alloc, port)...)
	if err != nil {
		t.Fatalf("Setup: %v", err)
	}
	p1, _ := goCNIResult(t, res).addrIn(t, e.subnet4)
	e.assertFirewall(t, p1.Addr())

	// The namespace is lost with no DEL; an empty one is at its path when
	// the client restores the allocation.
	_, oldIno := netnsIdentity(t, ns.path)
	e.restoreNetns(t, ns)
	nat := e.readNAT(t, alloc)

	if err := nomad.Status(); err != nil {
		t.Fatalf("STATUS with the lost allocation's attachment still recorded: %v (Nomad fails the restore)", err)
	}
	assertLeases(t, e.leaseDir(), map[netip.Addr]string{p1.Addr(): leaseContent(alloc)})
	if r, raw := e.readRecord(t, alloc); r.State != "complete" || r.NetnsID.Ino != oldIno {
		t.Errorf("STATUS changed the lost attachment's record (want complete, inode %d): %s", oldIno, raw)
	}
	if now := e.readNAT(t, alloc); now.String() != nat.String() {
		t.Errorf("STATUS changed the lost attachment's NAT state:\nwas:\n%snow:\n%s", nat, now)
	}

	if err := nomad.Check(ctx, alloc, ns.path, nomadOpts(alloc, port)...); err == nil || !strings.Contains(err.Error(), "loopback interface is down") {
		t.Fatalf("CHECK of the empty namespace: %v, want loopback's failure (Nomad's re-setup follows)", err)
	}
	// DestroyNetwork, then CreateNetwork: a new namespace at the same path.
	if err := ns.named().Recreate(); err != nil {
		t.Fatal(err)
	}
	if err := nomad.Status(); err != nil {
		t.Fatalf("STATUS before the re-ADD: %v", err)
	}
	res, err = nomad.Setup(ctx, alloc, ns.path, nomadOpts(alloc, port)...)
	if err != nil {
		t.Fatalf("re-ADD after the failed CHECK: %v", err)
	}
	p2, gw := goCNIResult(t, res).addrIn(t, e.subnet4)
	if p2 != p1 {
		t.Errorf("re-ADD got %s, first %s: the allocation keeps its free address", p2, p1)
	}
	assertLeases(t, e.leaseDir(), map[netip.Addr]string{p2.Addr(): leaseContent(alloc)})
	e.assertRecord(t, ns, p2.Addr())
	e.assertRecordsExactly(t, alloc)
	e.assertNAT(t, alloc, natWant{Masq: []netip.Addr{p2.Addr()}, DNAT: []portMap{{port, p2.Addr()}}})
	e.assertFirewall(t, p2.Addr())
	assertOnlyAddrOnIf(t, ns, p2)
	ping(t, ns, gw)

	if err := nomad.Status(); err != nil {
		t.Fatalf("STATUS before the teardown: %v", err)
	}
	if err := nomad.Remove(ctx, alloc, ns.path, nomadDelOpts(port)...); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	e.assertNetworkEmpty(t, e.leaseDir())
	assertNoFirewall(t, p2.Addr())

	// What reached the plugin, from its log.
	var verbs, statusOutcomes, releasedBy []string
	for _, ev := range readEventLog(t, logFile) {
		cmd, _ := ev["command"].(string)
		switch ev["event"] {
		case "start":
			verbs = append(verbs, cmd)
		case "done", "refusal":
			if cmd == "STATUS" {
				statusOutcomes = append(statusOutcomes, ev["event"].(string))
			}
		case "release":
			if msg, _ := ev["message"].(string); strings.Contains(msg, "released "+alloc+"/"+ifName+" "+p1.Addr().String()) {
				releasedBy = append(releasedBy, cmd)
			}
		}
	}
	if want := []string{"STATUS", "ADD", "STATUS", "STATUS", "ADD", "STATUS", "DEL"}; !slices.Equal(verbs, want) {
		t.Errorf("the plugin saw %q, want Nomad's %q", verbs, want)
	}
	if want := []string{"done", "done", "done", "done"}; !slices.Equal(statusOutcomes, want) {
		t.Errorf("STATUS outcomes in the log: %q, want %q", statusOutcomes, want)
	}
	if !slices.Equal(releasedBy, []string{"ADD"}) {
		t.Errorf("the lost attachment was released by %q, want once, by the re-ADD", releasedBy)
	}
}

// readEventLog is the plugin's log file (entry key "logFile"), one JSON
// object per line.
func readEventLog(t *testing.T, path string) []map[string]any {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("log file: %v", err)
	}
	var events []map[string]any
	for line := range strings.Lines(string(raw)) {
		var ev map[string]any
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		events = append(events, ev)
	}
	return events
}
