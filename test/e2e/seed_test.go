package e2e

import (
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
)

// duplicateAllocation is host-local's error when the container ID already
// holds a lease: the bug this project exists to fix.
const duplicateAllocation = "duplicate allocation is not allowed"

// TestRebootRestore is the seed scenario, on Nomad's chain: a container is
// added, the host "reboots" (its namespace disappears without any DEL), and
// the runtime restores the container under the same container ID in a new
// namespace at the same path.
//
// With the plugin, leases live on tmpfs and die with the reboot, so the
// second ADD succeeds. The control runs the same steps with the bare bridge
// chain and leases on persistent storage, and must fail the upstream way:
// that proves the test reproduces the bug rather than passing by accident.
func TestRebootRestore(t *testing.T) {
	t.Run("nomad-bridge-cni", func(t *testing.T) {
		e := newEnv(t)
		e.requirePlugin(t)
		e.writeConflist(t, e.confFor(t, "nomad.conflist"))
		ns := e.addNetns(t, "a")

		first := parseResult(t, e.mustCNI(t, "add", ns, ""))
		addr1, gw := first.addrIn(t, e.subnet4)
		assertLease(t, e.leaseDir(), addr1.Addr(), ns.cid)
		ping(t, ns, gw)

		e.reboot(t, ns, true)

		out, _, err := e.cnitool("add", ns, "")
		if err != nil {
			t.Fatalf("ADD after reboot under the same container ID failed: %v\nstdout: %s", err, out)
		}
		second := parseResult(t, out)
		addr2, gw2 := second.addrIn(t, e.subnet4)
		assertLeases(t, e.leaseDir(), map[netip.Addr]string{addr2.Addr(): leaseContent(ns.cid)})
		e.assertDefaultDirsUntouched(t)
		assertAddrOnIf(t, ns, addr2)
		ping(t, ns, gw2)
		e.assertNAT(t, ns.cid, natWant{Masq: []netip.Addr{addr2.Addr()}})
		e.assertFirewall(t, addr2.Addr())

		e.mustCNI(t, "check", ns, "")
		e.mustCNI(t, "del", ns, "")
		assertLeases(t, e.leaseDir(), nil)
	})

	t.Run("control-bare-bridge", func(t *testing.T) {
		e := newEnv(t)
		conf := e.confFor(t, "nomad.conflist")
		bareBridge(t, conf, e.persistDir)
		e.writeConflist(t, conf)
		ns := e.addNetns(t, "a")
		leaseDir := filepath.Join(e.persistDir, e.netName)

		first := parseResult(t, e.mustCNI(t, "add", ns, ""))
		addr1, gw := first.addrIn(t, e.subnet4)
		assertLease(t, leaseDir, addr1.Addr(), ns.cid)
		ping(t, ns, gw)

		e.reboot(t, ns, false)

		out, _, err := e.cnitool("add", ns, "")
		assertControlFails(t, out, err, duplicateAllocation)
		// The stale lease is what blocks it.
		assertLeases(t, leaseDir, map[netip.Addr]string{addr1.Addr(): leaseContent(ns.cid)})
	})
}

// reboot simulates what a host reboot does to one container: its namespace
// (and the veth pair in it) disappears without any CNI DEL, the tmpfs comes
// back empty if remount is set (a persistent dataDir survives), and the
// runtime re-creates the namespace at the same path, which gives the same
// cnitool container ID.
func (e *testEnv) reboot(t *testing.T, ns netns, remount bool) {
	t.Helper()
	e.destroyNetns(t, ns)
	if remount {
		e.remountTmpfs(t)
	}
	if again := e.addNetns(t, strings.TrimPrefix(ns.name, "nbc-e2e-"+e.id+"-")); again != ns {
		t.Fatalf("re-created namespace %+v differs from %+v", again, ns)
	}
}
