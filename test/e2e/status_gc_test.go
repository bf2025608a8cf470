package e2e

import (
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
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
