package e2e

import (
	"errors"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/testhost"
)

// TestAddCheckDel is the plugin's basic life cycle through cnitool, once
// with the minimal example (the plugin alone) and once with Nomad's chain
// (loopback, the plugin, firewall, portmap), which also proves that the
// plugins after it accept its result as prevResult.
func TestAddCheckDel(t *testing.T) {
	for _, tc := range []struct {
		file  string
		nomad bool
	}{
		{file: "minimal.conflist"},
		{file: "nomad.conflist", nomad: true},
	} {
		t.Run(tc.file, func(t *testing.T) {
			e := newEnv(t)
			e.requirePlugin(t)
			e.writeConflist(t, e.confFor(t, tc.file))
			ns := e.addNetns(t, "a")

			res := parseResult(t, e.mustCNI(t, "add", ns, ""))
			addr, gw := res.addrIn(t, e.subnet4)

			// The lease is host-local's, on the tmpfs, and only there.
			assertLeases(t, e.leaseDir(), map[netip.Addr]string{addr.Addr(): leaseContent(ns.cid)})
			e.assertDefaultDirsUntouched(t)

			// The container really is on the network.
			assertAddrOnIf(t, ns, addr)
			ping(t, ns, gw)
			e.assertNAT(t, ns.cid, natWant{Masq: []netip.Addr{addr.Addr()}})
			if tc.nomad {
				assertLinkUp(t, ns, "lo") // loopback ran
				e.assertFirewall(t, addr.Addr())
			}

			e.mustCNI(t, "check", ns, "")

			e.mustCNI(t, "del", ns, "")
			assertLeases(t, e.leaseDir(), nil)
			e.assertNAT(t, ns.cid, natWant{})
			if tc.nomad {
				assertNoFirewall(t, addr.Addr())
			}
			if linkExistsIn(ns, ifName) {
				t.Errorf("%s still exists in %s after DEL", ifName, ns.name)
			}

			// DEL is idempotent: again, and once the namespace is gone.
			e.mustCNI(t, "del", ns, "")
			e.destroyNetns(t, ns)
			e.mustCNI(t, "del", ns, "")
			assertLeases(t, e.leaseDir(), nil)
			e.assertDefaultDirsUntouched(t)
		})
	}
}

// linkExistsIn reports whether a link exists inside the namespace.
func linkExistsIn(ns netns, link string) bool {
	return run("ip", "-n", ns.name, "link", "show", "dev", link) == nil
}

// TestNomadChainPortMappings runs the whole conflist/nomad.conflist chain
// with portMappings in CAP_ARGS, the way Nomad passes them: portmap must
// DNAT the host port to the address our plugin returned, and DEL must remove
// it.
func TestNomadChainPortMappings(t *testing.T) {
	e := newEnv(t)
	e.requirePlugin(t)
	e.writeConflist(t, e.confFor(t, "nomad.conflist"))
	ns := e.addNetns(t, "a")

	hostPort := randomHostPort()
	capArgs := portMappings(hostPort)

	res := parseResult(t, e.mustCNI(t, "add", ns, capArgs))
	if res.CNIVersion != "0.4.0" {
		t.Errorf("result of Nomad's chain is at cniVersion %q, want 0.4.0", res.CNIVersion)
	}
	addr, gw := res.addrIn(t, e.subnet4)
	assertLeases(t, e.leaseDir(), map[netip.Addr]string{addr.Addr(): leaseContent(ns.cid)})
	e.assertDefaultDirsUntouched(t)
	ping(t, ns, gw)
	e.assertNAT(t, ns.cid, natWant{Masq: []netip.Addr{addr.Addr()}, DNAT: []portMap{{hostPort, addr.Addr()}}})
	e.assertFirewall(t, addr.Addr())

	// Real traffic through the mapping: connect to the host port on the
	// bridge's address (the test's own) and reach a listener on port 80
	// inside the namespace.
	e.assertReaches(t, ns, netip.AddrPortFrom(gw, uint16(hostPort)))

	e.mustCNI(t, "check", ns, capArgs)

	e.mustCNI(t, "del", ns, capArgs)
	e.assertNAT(t, ns.cid, natWant{})
	assertLeases(t, e.leaseDir(), nil)
	assertNoFirewall(t, addr.Addr())
}

// TestCNIVersions runs ADD, CHECK and DEL at every supported cniVersion with
// the plugin alone in the chain, so cnitool prints exactly the plugin's
// result: it must be in the config's version (libcni takes the version from
// the result itself, so a wrong one would show here).
func TestCNIVersions(t *testing.T) {
	for _, v := range []string{"0.3.1", "0.4.0", "1.0.0", "1.1.0"} {
		t.Run(v, func(t *testing.T) {
			e := newEnv(t)
			e.requirePlugin(t)
			conf := e.confFor(t, "minimal.conflist")
			conf["cniVersion"] = v
			e.writeConflist(t, conf)
			ns := e.addNetns(t, "a")

			res := parseResult(t, e.mustCNI(t, "add", ns, ""))
			if res.CNIVersion != v {
				t.Errorf("result cniVersion %q, want %q", res.CNIVersion, v)
			}
			// The ips[].version field exists up to 0.4.0 and was removed in
			// 1.0.0: its presence tells the result format apart.
			ips, _ := res.raw["ips"].([]any)
			if len(ips) == 0 {
				t.Fatalf("result has no ips: %v", res.raw)
			}
			for _, ip := range ips {
				_, hasVersion := ip.(map[string]any)["version"]
				if want := v == "0.3.1" || v == "0.4.0"; hasVersion != want {
					t.Errorf("ips entry %v: has version field = %v, want %v for %s", ip, hasVersion, want, v)
				}
			}
			addr, gw := res.addrIn(t, e.subnet4)
			assertLeases(t, e.leaseDir(), map[netip.Addr]string{addr.Addr(): leaseContent(ns.cid)})
			e.assertDefaultDirsUntouched(t)
			assertAddrOnIf(t, ns, addr)
			ping(t, ns, gw)

			// CHECK exists from 0.4.0 on; libcni refuses it for 0.3.1.
			if v != "0.3.1" {
				e.mustCNI(t, "check", ns, "")
			}

			e.mustCNI(t, "del", ns, "")
			assertLeases(t, e.leaseDir(), nil)
			e.assertNAT(t, ns.cid, natWant{})
		})
	}
}

// TestDualStack runs conflist/dual-stack.conflist: one IPv4 and one IPv6
// address, each in its range with a lease, both released by DEL.
func TestDualStack(t *testing.T) {
	e := newEnv(t)
	e.requirePlugin(t)
	e.writeConflist(t, e.confFor(t, "dual-stack.conflist"))
	ns := e.addNetns(t, "a")

	res := parseResult(t, e.mustCNI(t, "add", ns, ""))
	if len(res.IPs) != 2 {
		t.Fatalf("want 2 addresses, got %+v", res.IPs)
	}
	addr4, gw4 := res.addrIn(t, e.subnet4)
	addr6, gw6 := res.addrIn(t, e.subnet6)
	assertLeases(t, e.leaseDir(), map[netip.Addr]string{
		addr4.Addr(): leaseContent(ns.cid),
		addr6.Addr(): leaseContent(ns.cid),
	})
	e.assertDefaultDirsUntouched(t)
	assertAddrOnIf(t, ns, addr4)
	assertAddrOnIf(t, ns, addr6)
	ping(t, ns, gw4)
	waitAddrSettled(t, gw6)
	ping(t, ns, gw6)
	e.assertNAT(t, ns.cid, natWant{Masq: []netip.Addr{addr4.Addr(), addr6.Addr()}})

	e.mustCNI(t, "check", ns, "")

	e.mustCNI(t, "del", ns, "")
	assertLeases(t, e.leaseDir(), nil)
	e.assertNAT(t, ns.cid, natWant{})
}

// TestNonTmpfsWarning: with dataDir on a filesystem that survives a reboot
// the plugin still works but says so on stderr, once per boot and network:
// on the first ADD, not on the second (a runtime's log would fill with it).
// The marker that remembers it holds the boot ID, since it survives a
// reboot too. On tmpfs it says nothing of the kind. (cnitool passes the
// plugins' stderr through.)
func TestNonTmpfsWarning(t *testing.T) {
	tmpfsLines := func(stderr, dataDir string) []string {
		var lines []string
		for line := range strings.SplitSeq(stderr, "\n") {
			if strings.Contains(line, "tmpfs") && strings.Contains(line, dataDir) {
				lines = append(lines, line)
			}
		}
		return lines
	}

	t.Run("persistent-dataDir", func(t *testing.T) {
		e := newEnv(t)
		e.requirePlugin(t)
		e.persistDir = testhost.DirOffTmpfs(t)
		conf := e.confFor(t, "minimal.conflist")
		entryOfType(t, conf, pluginType)["dataDir"] = e.persistDir
		e.writeConflist(t, conf)
		ns := e.addNetns(t, "a")

		out, stderr, err := e.cnitool("add", ns, "")
		if err != nil {
			t.Fatalf("ADD with a persistent dataDir must still work: %v", err)
		}
		addr, _ := parseResult(t, out).addrIn(t, e.subnet4)
		assertLease(t, filepath.Join(e.persistDir, e.netName), addr.Addr(), ns.cid)
		if lines := tmpfsLines(stderr, e.persistDir); len(lines) != 1 {
			t.Fatalf("want one stderr line saying %s is not on tmpfs, got %q (stderr: %q)", e.persistDir, lines, stderr)
		}
		marker := filepath.Join(e.persistDir, recordDirName, e.netName, ".warned-not-tmpfs")
		if b, err := os.ReadFile(marker); err != nil || string(b) != bootID(t) {
			t.Errorf("marker %s = %q, %v; want this boot's ID", marker, b, err)
		}

		ns2 := e.addNetns(t, "b")
		if _, stderr, err := e.cnitool("add", ns2, ""); err != nil {
			t.Fatalf("second ADD with a persistent dataDir: %v", err)
		} else if lines := tmpfsLines(stderr, e.persistDir); len(lines) != 0 {
			t.Errorf("the second ADD in the same boot warned again: %q", lines)
		}
		e.mustCNI(t, "del", ns2, "")
		e.mustCNI(t, "del", ns, "")
		assertLeases(t, filepath.Join(e.persistDir, e.netName), nil)
	})

	t.Run("tmpfs-dataDir", func(t *testing.T) {
		e := newEnv(t)
		e.requirePlugin(t)
		e.writeConflist(t, e.confFor(t, "minimal.conflist"))
		ns := e.addNetns(t, "a")
		_, stderr, err := e.cnitool("add", ns, "")
		if err != nil {
			t.Fatalf("ADD: %v", err)
		}
		if lines := tmpfsLines(stderr, e.dataDir); len(lines) != 0 {
			t.Fatalf("dataDir %s is a tmpfs, yet ADD warned: %q", e.dataDir, lines)
		}
		if _, err := os.Lstat(filepath.Join(e.recordDir(), ".warned-not-tmpfs")); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("tmpfs warning marker written on a tmpfs dataDir: %v", err)
		}
	})
}
