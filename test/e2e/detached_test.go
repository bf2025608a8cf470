package e2e

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"testing"
)

// How a test makes Nomad's CHECK fail on a running allocation.
const (
	// deleteEth0: the container's interface is gone (bridge's CHECK fails).
	deleteEth0 = "eth0-deleted"
	// flushPortmap: portmap's per-container chain was flushed, as any
	// firewall reload does, while eth0 is intact (portmap's CHECK fails).
	flushPortmap = "portmap-flushed"
)

// TestNomadReAddAfterFailedCheck drives Nomad's restore path after a failed
// CHECK, as its client does it (allocrunner network hook and CNI setup):
// it unmounts the allocation's netns path, creates a new namespace at the
// same path and sends ADD again without DEL, and it never moves the tasks,
// which run on in the old namespace. With a task left there, the re-ADD
// must be refused and change nothing (its address is still in use: it
// still answers on it); sweeps keep it; once the task is gone, Nomad's DEL
// on the new path releases everything. With no task left, the re-ADD
// succeeds in place. The control, bare bridge, refuses the re-ADD too
// ("duplicate allocation"): refusing is what keeps Nomad rescheduling.
func TestNomadReAddAfterFailedCheck(t *testing.T) {
	for _, tc := range []struct {
		name    string
		breakIt string
		task    bool // a process stays in the old namespace
		bare    bool
	}{
		{name: "eth0-deleted-task-running", breakIt: deleteEth0, task: true},
		{name: "portmap-flushed-task-running", breakIt: flushPortmap, task: true},
		{name: "eth0-deleted-no-task", breakIt: deleteEth0},
		{name: "portmap-flushed-no-task", breakIt: flushPortmap},
		{name: "control-bare-bridge-portmap-flushed-task-running", breakIt: flushPortmap, task: true, bare: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			conf := e.reclaimConf(t, "nomad.conflist")
			leaseDir := e.chooseChain(t, conf, tc.bare)
			e.writeConflist(t, conf)
			alloc := e.addNetns(t, "alloc")
			port := randomHostPort()
			capArgs := portMappings(port)

			p1, gw := parseResult(t, e.mustCNI(t, "add", alloc, capArgs)).addrIn(t, e.subnet4)
			e.assertNAT(t, alloc.cid, natWant{Masq: []netip.Addr{p1.Addr()}, DNAT: []portMap{{port, p1.Addr()}}})
			_, oldIno := netnsIdentity(t, alloc.path)
			var task *container
			if tc.task {
				task = e.startContainer(t, alloc)
			}

			e.failCheck(t, alloc, capArgs, tc.breakIt)
			nat := e.readNAT(t, alloc.cid)
			// Nomad's recovery: unmount the path, a new namespace there.
			if err := alloc.named().Recreate(); err != nil {
				t.Fatal(err)
			}

			out, stderr, err := e.cnitool("add", alloc, capArgs)
			switch {
			case tc.bare:
				assertControlFails(t, out, err, duplicateAllocation)
				return
			case !tc.task:
				if err != nil {
					t.Fatalf("re-ADD with nothing left in the old namespace: %v\nstderr: %s", err, stderr)
				}
				p2, gw := parseResult(t, out).addrIn(t, e.subnet4)
				e.assertReleased(t, stderr, alloc.cid, "was replaced")
				assertLeases(t, leaseDir, map[netip.Addr]string{p2.Addr(): leaseContent(alloc.cid)})
				e.assertRecord(t, alloc, p2.Addr())
				assertAddrOnIf(t, alloc, p2)
				ping(t, alloc, gw)
				e.mustCNI(t, "del", alloc, capArgs)
				e.assertNetworkEmpty(t, leaseDir)
				return
			}

			// A task still runs in the old namespace: refused, as Nomad's
			// up to three tries all are.
			for try := range 2 {
				if err == nil {
					t.Fatalf("re-ADD %d while pid %d holds the old namespace succeeded:\n%s", try+1, task.pid, out)
				}
				for _, want := range []string{fmt.Sprintf("held by pid %d (sleep)", task.pid), fmt.Sprintf("net:[%d]", oldIno), "nomad-bridge-cni refused the ADD: ", "Nothing to do by hand: the runtime stops the container and sends DEL"} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("re-ADD error does not say %q: %v", want, err)
					}
				}
				e.assertDetachedKept(t, alloc, oldIno, p1.Addr(), nat)
				_, stderr, err = e.cnitool("add", alloc, capArgs)
				if len(e.releaseLines(stderr)) != 0 {
					t.Errorf("refused re-ADD released something: %s", stderr)
				}
			}
			if tc.breakIt == flushPortmap {
				// The task still answers on its address.
				assertAddrOnIf(t, task.ns, netip.PrefixFrom(p1.Addr(), p1.Bits()))
				e.assertReaches(t, task.ns, netip.AddrPortFrom(p1.Addr(), mappedPort))
				ping(t, task.ns, gw)
			}

			// Sweeps keep it: a CHECK (it fails: the new namespace is empty)
			// and the operator's gc.
			if _, _, err := e.cnitool("check", alloc, capArgs); err == nil {
				t.Error("CHECK of the empty new namespace passed")
			}
			if _, stderr, err := e.operator(t, "gc", "--data-dir", e.dataDir, "--network", e.netName); err != nil {
				t.Fatalf("gc: %v\n%s", err, stderr)
			}
			e.assertDetachedKept(t, alloc, oldIno, p1.Addr(), nat)
			e.assertLeasesSaysDetached(t, alloc.cid, task.pid)

			// Nomad gives up: it kills the tasks, DELs on the new path.
			task.stop()
			e.mustCNI(t, "del", alloc, capArgs)
			e.assertNetworkEmpty(t, leaseDir)
		})
	}
}

// failCheck breaks the running allocation in ns the given way and checks
// that CHECK now fails, as Nomad sees it on a client restart.
func (e *testEnv) failCheck(t *testing.T, ns netns, capArgs, how string) {
	t.Helper()
	var err error
	switch how {
	case deleteEth0:
		err = run("ip", "-n", ns.name, "link", "delete", ifName)
	case flushPortmap:
		err = run("iptables", "-w", "-t", "nat", "-F", e.dnatChain(ns.cid))
	default:
		t.Fatalf("failCheck: unknown way %q", how)
	}
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.cnitool("check", ns, capArgs); err == nil {
		t.Fatalf("CHECK passed with %s: the test no longer drives Nomad's failure path", how)
	}
}

// assertDetachedKept checks that everything the attachment held in its old
// namespace (inode oldIno) is still there: its lease, its record, and its
// NAT state as it was once CHECK failed (nat).
func (e *testEnv) assertDetachedKept(t *testing.T, ns netns, oldIno uint64, addr netip.Addr, nat natState) {
	t.Helper()
	assertLeases(t, e.leaseDir(), map[netip.Addr]string{addr: leaseContent(ns.cid)})
	r, raw := e.readRecord(t, ns.cid)
	if r.State != "complete" || r.NetnsID.Ino != oldIno {
		t.Errorf("record of the detached attachment changed (want complete, inode %d): %s", oldIno, raw)
	}
	if now := e.readNAT(t, ns.cid); now.String() != nat.String() {
		t.Errorf("NAT state of the detached attachment changed:\nwas:\n%snow:\n%s", nat, now)
	}
}

// assertLeasesSaysDetached checks `leases --json` reports cid as detached,
// held by pid.
func (e *testEnv) assertLeasesSaysDetached(t *testing.T, cid string, pid int) {
	t.Helper()
	stdout, stderr, err := e.operator(t, "leases", "--data-dir", e.dataDir, "--network", e.netName, "--json")
	if err != nil {
		t.Fatalf("leases --json: %v\n%s", err, stderr)
	}
	var doc struct {
		Leases []struct {
			ContainerID string `json:"containerID"`
			State       string `json:"state"`
			Reason      string `json:"reason"`
			HeldBy      *struct {
				PID     int    `json:"pid"`
				Command string `json:"command"`
			} `json:"heldBy"`
		} `json:"leases"`
	}
	if err := json.Unmarshal([]byte(stdout), &doc); err != nil {
		t.Fatalf("leases --json: %v\n%s", err, stdout)
	}
	for _, l := range doc.Leases {
		if l.ContainerID != cid {
			continue
		}
		want := fmt.Sprintf("still held by pid %d (sleep)", pid)
		if l.State != "detached" || !strings.Contains(l.Reason, want) || l.HeldBy == nil || l.HeldBy.PID != pid || l.HeldBy.Command != "sleep" {
			t.Errorf("leases: %s is %s (%s), heldBy %+v; want detached, %q", cid, l.State, l.Reason, l.HeldBy, want)
		}
		return
	}
	t.Errorf("leases does not list %s:\n%s", cid, stdout)
}
