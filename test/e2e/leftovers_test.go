package e2e

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/containernetworking/cni/pkg/invoke"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/cniexec"
)

// What an earlier attachment, a killed release or a half-done ADD leaves
// behind must never outlive the next sweep, and never make a later DEL or
// re-ADD of the same container ID fail.

// TestReleaseWithIPTablesKilled: a gc whose every iptables exec is killed
// (strace kills each child at its first execve, no code change needed)
// cannot release the stale container's NAT rules; it must keep its lease
// and record, which are what let the next gc find the rules. Then Nomad
// restores the same allocation (new namespace at the same path, ADD
// without DEL) and DELs it: both succeed and nothing is left.
func TestReleaseWithIPTablesKilled(t *testing.T) {
	requireTool(t, "strace")
	e := newEnv(t)
	e.requirePlugin(t)
	e.writeConflist(t, e.reclaimConf(t, "nomad.conflist"))
	a, b := e.addNetns(t, "a"), e.addNetns(t, "b")
	portA := randomHostPort()
	capA, capB := portMappings(portA), portMappings(portA+1)
	pa, _ := parseResult(t, e.mustCNI(t, "add", a, capA)).addrIn(t, e.subnet4)
	pb, _ := parseResult(t, e.mustCNI(t, "add", b, capB)).addrIn(t, e.subnet4)
	e.mustKillNetns(t, a)

	r := cniexec.Run(t, "strace", invoke.Args{}, cniexec.Opts{Argv: []string{"-f", "-qq", "-o", "/dev/null", "-e", "trace=execve", "-e", "inject=execve:signal=SIGKILL:when=1", e.binary(pluginType), "gc", "--data-dir", e.dataDir}})
	t.Logf("gc with every iptables killed: %v\nstdout: %s\nstderr: %s", r.Err, r.Stdout, r.Stderr)
	if st := e.readNAT(t, a.cid); len(st["iptables"].masqJumps) > 0 {
		// The rules stayed: so must what names them.
		if _, err := os.Stat(e.recordPath(a.cid)); err != nil {
			t.Errorf("the NAT rules of %s stayed, its record did not: %v", a.cid, err)
		}
		assertLease(t, e.leaseDir(), pa.Addr(), a.cid)
	}

	out := e.operatorSweep(t)
	t.Logf("the next gc: %s", out)
	e.assertNoTrace(t, a.cid)
	e.assertNAT(t, b.cid, natWant{Masq: []netip.Addr{pb.Addr()}, DNAT: []portMap{{portA + 1, pb.Addr()}}})

	if _, err := e.newNetns("a"); err != nil {
		t.Fatal(err)
	}
	e.mustCNI(t, "add", a, capA)
	e.mustCNI(t, "check", a, capA)
	e.mustCNI(t, "del", a, capA)
	e.mustCNI(t, "del", b, capB)
	e.assertNetworkEmpty(t, e.leaseDir())
}

// TestDelAfterEarlierAttachmentLeftovers: an earlier attachment of the
// same container ID left NAT state no record names (a release killed by an
// earlier version, a runtime that ran bare bridge). The re-ADD of that ID
// and its DEL must both succeed and leave nothing; bare bridge's DEL fails
// on the extra jump ("iptables -X: Device or resource busy").
func TestDelAfterEarlierAttachmentLeftovers(t *testing.T) {
	for _, tc := range []struct {
		name  string
		leave func(t *testing.T, e *testEnv, cid string)
	}{
		{name: "jump-and-chain", leave: func(*testing.T, *testEnv, string) {}},
		{name: "flushed-chain", leave: func(t *testing.T, e *testEnv, cid string) {
			// Only the chain, emptied: a release killed between its steps.
			for fam, r := range e.readNAT(t, cid) {
				for _, j := range r.masqJumps {
					if err := deleteRule(fam, "nat", j); err != nil {
						t.Fatal(err)
					}
				}
				if r.hasMasq {
					if err := run(fam, "-w", "-t", "nat", "-F", e.masqChain(cid)); err != nil {
						t.Fatal(err)
					}
				}
			}
		}},
		{name: "dnat-chain-without-jump", leave: func(t *testing.T, e *testEnv, cid string) {
			for fam, r := range e.readNAT(t, cid) {
				for _, j := range r.dnatJumps {
					if err := deleteRule(fam, "nat", j); err != nil {
						t.Fatal(err)
					}
				}
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.requirePlugin(t)
			e.writeConflist(t, e.reclaimConf(t, "nomad.conflist"))
			a := e.addNetns(t, "a")
			port := randomHostPort()
			capA := portMappings(port)
			first, _ := parseResult(t, e.mustCNI(t, "add", a, capA)).addrIn(t, e.subnet4)
			// The namespace is lost, and the files that named its rules
			// went: what the release used to leave when killed.
			e.mustKillNetns(t, a)
			if err := os.Remove(e.recordPath(a.cid)); err != nil {
				t.Fatal(err)
			}
			if err := os.Remove(filepath.Join(e.leaseDir(), first.Addr().String())); err != nil {
				t.Fatal(err)
			}
			tc.leave(t, e, a.cid)
			t.Logf("left by the earlier attachment:\n%s", e.networkNAT(t))

			if _, err := e.newNetns("a"); err != nil {
				t.Fatal(err)
			}
			// A first ADD hands out the next address, so the old jump (if
			// any) names another source.
			spare := e.addNetns(t, "spare")
			e.mustCNI(t, "add", spare, "")
			out := e.mustCNI(t, "add", a, capA)
			again, _ := parseResult(t, out).addrIn(t, e.subnet4)
			if again.Addr() == first.Addr() {
				t.Logf("note: the re-ADD got the first address again (%s)", again.Addr())
			}
			e.mustCNI(t, "check", a, capA)
			if _, stderr, err := e.cnitool("del", a, capA); err != nil {
				t.Fatalf("DEL after the earlier attachment's leftovers: %v\nstderr: %s\nNAT:\n%s", err, stderr, e.networkNAT(t))
			}
			e.assertNoTrace(t, a.cid)
			e.mustCNI(t, "del", spare, "")
			e.assertNetworkEmpty(t, e.leaseDir())
		})
	}
}

// TestDelAfterInterfaceDeleted: the container's interface was deleted from
// inside its namespace, which is still there. bridge's DEL then finds no
// interface and skips its ipMasq teardown; the plugin's DEL must still
// leave no NAT rule.
func TestDelAfterInterfaceDeleted(t *testing.T) {
	e := newEnv(t)
	e.requirePlugin(t)
	e.writeConflist(t, e.reclaimConf(t, "nomad.conflist"))
	a := e.addNetns(t, "a")
	capA := portMappings(randomHostPort())
	e.mustCNI(t, "add", a, capA)
	if err := run("ip", "-n", a.name, "link", "del", ifName); err != nil {
		t.Fatal(err)
	}
	e.mustCNI(t, "del", a, capA)
	e.assertNoTrace(t, a.cid)
	e.assertNetworkEmpty(t, e.leaseDir())
}

// TestFullTmpfsAtEveryWrite fills the dataDir's tmpfs so that the ADD runs
// out of space at each of its writes in turn (pending record, lease,
// host-local's last_reserved_ip, the completed record...), one more page
// free each time, until an ADD succeeds. Every failed ADD must leave
// nothing at once (no sweep needed: host-local keeps a reservation whose
// last_reserved_ip it could not write), and the runtime's DEL must work on
// the full disk.
func TestFullTmpfsAtEveryWrite(t *testing.T) {
	for leave := 0; ; leave++ {
		if leave > 12 {
			t.Fatalf("an ADD still fails with %d pages free", leave)
		}
		succeeded := false
		t.Run(fmt.Sprintf("%d-pages-free", leave), func(t *testing.T) {
			e := newEnv(t)
			e.requirePlugin(t)
			e.mountTinyTmpfs(t, "256k")
			conf := e.reclaimConf(t, "minimal.conflist")
			e.writeConflist(t, conf)
			stdin := entryConfig(t, conf, pluginType)
			filler := fillTmpfs(t, e.dataDir, leave)
			ns := e.addNetns(t, "a")
			r := cniexec.Run(t, e.binary(pluginType), e.cniArgs("ADD", ns), cniexec.Opts{Stdin: stdin})
			if r.Err == nil {
				succeeded = true
				t.Logf("ADD succeeded with %d pages free", leave)
			} else {
				if !strings.Contains(r.Stdout, "no space left on device") {
					t.Errorf("the error does not say the disk is full: %s", r.Stdout)
				}
				e.assertNoTrace(t, ns.cid)
			}
			if r := cniexec.Run(t, e.binary(pluginType), e.cniArgs("DEL", ns), cniexec.Opts{Stdin: stdin}); r.Err != nil {
				t.Fatalf("DEL, disk still full: %v", r.Err)
			}
			e.assertNoTrace(t, ns.cid)
			if err := os.Remove(filler); err != nil {
				t.Fatal(err)
			}
		})
		if succeeded || t.Failed() {
			return
		}
	}
}

// TestAddRacingDel runs the ADD and the DEL of one container ID at the
// same moment, as a runtime that gives up on a container while it starts
// can, on Nomad's chain. Whichever wins, what is left must be consistent:
// the runtime's next DEL leaves nothing, and a later ADD of the same ID
// succeeds with exactly one lease and one set of NAT rules.
func TestAddRacingDel(t *testing.T) {
	trials := envInt(t, "NBC_E2E_RACE_TRIALS", 10)
	e := newEnv(t)
	e.requirePlugin(t)
	e.writeConflist(t, e.reclaimConf(t, "nomad.conflist"))
	a := e.addNetns(t, "a")
	capA := portMappings(randomHostPort())
	for i := range trials {
		var wg sync.WaitGroup
		var addErr, delErr error
		start := make(chan struct{})
		wg.Go(func() { <-start; _, _, addErr = e.cnitool("add", a, capA) })
		wg.Go(func() { <-start; _, _, delErr = e.cnitool("del", a, capA) })
		close(start)
		wg.Wait()
		t.Logf("trial %d: ADD %v, DEL %v", i, addErr, delErr)
		if _, stderr, err := e.cnitool("del", a, capA); err != nil {
			t.Fatalf("trial %d: the DEL after the race: %v\nstderr: %s\nNAT:\n%s", i, err, stderr, e.networkNAT(t))
		}
		e.assertNoTrace(t, a.cid)
		if leftovers := e.networkNAT(t); leftovers != "" {
			t.Fatalf("trial %d: NAT left after the DEL:\n%s", i, leftovers)
		}
		out, stderr, err := e.cnitool("add", a, capA)
		if err != nil {
			t.Fatalf("trial %d: ADD after the race: %v\nstderr: %s", i, err, stderr)
		}
		p, _ := parseResult(t, out).addrIn(t, e.subnet4)
		assertLeases(t, e.leaseDir(), map[netip.Addr]string{p.Addr(): leaseContent(a.cid)})
		e.mustCNI(t, "del", a, capA)
	}
	e.assertNetworkEmpty(t, e.leaseDir())
}
