package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/invoke"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/cniexec"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/testhost"
)

// Crash points: every path that changes state is killed (SIGKILL, as kill
// -9) at its k-th state-changing step, for every k until it completes
// unkilled, on real namespaces, real bridge, host-local, firewall and
// portmap through cnitool on Nomad's chain. Then what a runtime or an
// operator runs next (the DEL, the re-ADD, the next sweep) must leave
// exactly the live containers' state: nothing of the dead one (lease,
// record, temp file, any NAT line with its ID or its address), everything
// of the live one, and every DEL must succeed.
//
// The steps are the plugin's own (internal/crashpoint, armed in the
// binary `make build-crashpoints` builds): each file created, renamed or
// removed, each iptables deletion, each nftables deletion (before its
// first batch), each delegate started. The kill comes before the step is
// made.

// crashpointBinary is the armed plugin, next to the plugin under test.
func crashpointBinary(t *testing.T, bin string) string {
	t.Helper()
	exe := filepath.Join(bin, "crashpoints", pluginType)
	if _, err := os.Stat(exe); err != nil {
		testhost.SkipOrFail(t, fmt.Sprintf("%s is missing (run `make build-crashpoints`): %v", exe, err))
	}
	return exe
}

// useCrashpointPlugin makes the test's bin dir a copy of the real one (by
// symlinks) whose plugin is the armed build: cnitool then runs it as the
// chain's entry, and the operator commands run it too.
func (e *testEnv) useCrashpointPlugin(t *testing.T) {
	t.Helper()
	armed := crashpointBinary(t, e.bin)
	dir := t.TempDir()
	entries, err := os.ReadDir(e.bin)
	if err != nil {
		t.Fatal(err)
	}
	for _, ent := range entries {
		if ent.IsDir() || ent.Name() == pluginType {
			continue
		}
		if err := os.Symlink(filepath.Join(e.bin, ent.Name()), filepath.Join(dir, ent.Name())); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(armed, filepath.Join(dir, pluginType)); err != nil {
		t.Fatal(err)
	}
	e.bin = dir
}

// crashRun is one run of a path with the plugin armed to die at step k.
// It reports whether the plugin was killed (it reached step k) and how
// many steps it made.
type crashRun struct {
	killed bool
	steps  int
	log    string
}

// armed returns the environment that arms the plugin to die at step k,
// and a function that reads what the run did.
func armed(t *testing.T, k int) ([]string, func() crashRun) {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), "steps")
	env := []string{"NBC_CRASH_AT=" + strconv.Itoa(k), "NBC_CRASH_LOG=" + logPath}
	return env, func() crashRun {
		b, err := os.ReadFile(logPath)
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		r := crashRun{log: string(b)}
		sc := bufio.NewScanner(strings.NewReader(r.log))
		for sc.Scan() {
			n, _, _ := strings.Cut(sc.Text(), " ")
			if i, err := strconv.Atoi(n); err == nil {
				r.steps = max(r.steps, i)
			}
		}
		r.killed = r.steps >= k
		return r
	}
}

// crashPath is one state-changing path: setup makes the scene, crash runs
// the path with env armed, next is what a runtime or operator does next,
// and check asserts the end state.
type crashPath struct {
	name string
	// gcVerb: the conflist is at cniVersion 1.1.0, for the GC verb.
	gcVerb bool
	// nftables: bridge's ipMasq and portmap keep their rules in
	// nftables, whose batches are the steps, where they are iptables
	// rules elsewhere.
	nftables bool
	run      func(t *testing.T, e *testEnv, s *crashScene, env []string)
	next     func(t *testing.T, e *testEnv, s *crashScene)
}

// crashScene is a live container B (with a port mapping) that every step
// must leave alone, and the container A whose state the path changes.
type crashScene struct {
	a, b         netns
	c            netns // a third container, the "add" path's
	confPath     string
	capA, capB   string
	addrA, addrB netip.Addr
	portA, portB int
}

// TestCrashPoints kills each state-changing path at each of its steps.
func TestCrashPoints(t *testing.T) {
	paths := []crashPath{
		{
			// The operator's gc releasing a lost namespace's attachment;
			// next: another gc, then Nomad restores A under the same ID.
			name: "gc",
			run: func(t *testing.T, e *testEnv, s *crashScene, env []string) {
				e.mustKillNetns(t, s.a)
				cniexec.Run(t, e.binary(pluginType), invoke.Args{}, cniexec.Opts{Argv: []string{"gc", "--data-dir", e.dataDir}, Env: env})
			},
			next: func(t *testing.T, e *testEnv, s *crashScene) {
				e.operatorSweep(t)
				e.assertOnlyB(t, s)
				e.restoreAndDel(t, s)
			},
		},
		{
			// gc releasing orphan rules: X ran on bare bridge (its lease
			// in the legacy directory), lost its namespace, and its
			// runtime's DEL, through that configuration, released its
			// lease and skipped bridge's teardown: its ipMasq jumps and
			// chains, in both families, name a container the network
			// holds nothing of. Next: another gc. Regression: a gc killed
			// between a family's jump and its chain left the chain, which
			// nothing named any more.
			name: "gc-orphan",
			run: func(t *testing.T, e *testEnv, s *crashScene, env []string) {
				s.c = e.orphanOnBareBridge(t, s)
				cniexec.Run(t, e.binary(pluginType), invoke.Args{}, cniexec.Opts{Argv: []string{"gc", "--data-dir", e.dataDir}, Env: env})
			},
			next: func(t *testing.T, e *testEnv, s *crashScene) {
				e.sweepsCAwayThenDELsA(t, s)
			},
		},
		{
			// gc removing what writers killed mid-write left: a record's
			// temp file whose writer is gone, and an empty lease (its
			// host-local died between creating and writing it); next:
			// another gc.
			name: "gc-debris",
			run: func(t *testing.T, e *testEnv, s *crashScene, env []string) {
				dead := exec.Command("true")
				if err := dead.Run(); err != nil {
					t.Fatal(err)
				}
				temp := filepath.Join(e.recordDir(), fmt.Sprintf(".tmp-%d-1", dead.Process.Pid))
				empty := filepath.Join(e.leaseDir(), e.hostAddr(250).String())
				for _, f := range []string{temp, empty} {
					if err := os.WriteFile(f, nil, 0o600); err != nil {
						t.Fatal(err)
					}
				}
				cniexec.Run(t, e.binary(pluginType), invoke.Args{}, cniexec.Opts{Argv: []string{"gc", "--data-dir", e.dataDir}, Env: env})
			},
			next: func(t *testing.T, e *testEnv, s *crashScene) {
				e.operatorSweep(t)
				if names := e.recordNames(t); slices.ContainsFunc(names, func(n string) bool { return strings.HasPrefix(n, ".tmp-") }) {
					t.Errorf("temp file left in %s: %q", e.recordDir(), names)
				}
				assertLeases(t, e.leaseDir(), map[netip.Addr]string{s.addrA: leaseContent(s.a.cid), s.addrB: leaseContent(s.b.cid)})
				e.assertLiveB(t, s)
				e.mustCNI(t, "del", s.a, s.capA)
			},
		},
		{
			// CHECK of B sweeps A's lost attachment; next: CHECK again.
			name: "check-sweep",
			run: func(t *testing.T, e *testEnv, s *crashScene, env []string) {
				e.mustKillNetns(t, s.a)
				_, _, _ = e.cnitoolEnv("check", s.b, append(env, "CAP_ARGS="+s.capB)...)
			},
			next: func(t *testing.T, e *testEnv, s *crashScene) {
				e.mustCNI(t, "check", s.b, s.capB)
				e.assertOnlyB(t, s)
				e.restoreAndDel(t, s)
			},
		},
		{
			// The runtime's GC verb lists B only; next: GC again.
			name:   "gc-verb",
			gcVerb: true,
			run: func(t *testing.T, e *testEnv, s *crashScene, env []string) {
				for _, kv := range env {
					k, v, _ := strings.Cut(kv, "=")
					t.Setenv(k, v) // libcni runs the plugins with the test's environment
				}
				_ = e.gcWithValid(t, s.confPath, s.b)
				for _, kv := range env {
					k, _, _ := strings.Cut(kv, "=")
					os.Unsetenv(k)
				}
			},
			next: func(t *testing.T, e *testEnv, s *crashScene) {
				if err := e.gcWithValid(t, s.confPath, s.b); err != nil {
					t.Fatalf("GC after the crash: %v", err)
				}
				e.assertOnlyB(t, s)
			},
		},
		{
			// DEL of a live container; next: the runtime retries the DEL.
			name: "del",
			run: func(t *testing.T, e *testEnv, s *crashScene, env []string) {
				_, _, _ = e.cnitoolEnv("del", s.a, append(env, "CAP_ARGS="+s.capA)...)
			},
			next: func(t *testing.T, e *testEnv, s *crashScene) {
				e.mustCNI(t, "del", s.a, s.capA)
				e.assertOnlyB(t, s)
			},
		},
		{
			// DEL after the namespace is gone (CRI-O's replayed DELs,
			// Nomad's DEL after a lost netns); next: the DEL again.
			name: "del-lost-netns",
			run: func(t *testing.T, e *testEnv, s *crashScene, env []string) {
				e.mustKillNetns(t, s.a)
				_, _, _ = e.cnitoolEnv("del", s.a, append(env, "CAP_ARGS="+s.capA)...)
			},
			next: func(t *testing.T, e *testEnv, s *crashScene) {
				e.mustCNI(t, "del", s.a, s.capA)
				e.assertOnlyB(t, s)
			},
		},
		{
			// Nomad's restore: A's namespace re-created at the same path,
			// ADD without DEL (the earlier attachment is released first);
			// next: the runtime's DEL of the failed ADD, then the ADD again.
			name: "re-add",
			run: func(t *testing.T, e *testEnv, s *crashScene, env []string) {
				e.replaceNetns(t, s.a, false)
				_, _, _ = e.cnitoolEnv("add", s.a, append(env, "CAP_ARGS="+s.capA)...)
			},
			next: func(t *testing.T, e *testEnv, s *crashScene) {
				e.mustCNI(t, "del", s.a, s.capA)
				e.assertOnlyB(t, s)
				e.addAgainAndDel(t, s)
			},
		},
		{
			// gc releasing a lost namespace's attachment whose rules are
			// nftables rules (bridge's and portmap's); next: another gc.
			name:     "gc-nftables",
			nftables: true,
			run: func(t *testing.T, e *testEnv, s *crashScene, env []string) {
				e.mustKillNetns(t, s.a)
				cniexec.Run(t, e.binary(pluginType), invoke.Args{}, cniexec.Opts{Argv: []string{"gc", "--data-dir", e.dataDir}, Env: env})
			},
			next: func(t *testing.T, e *testEnv, s *crashScene) {
				e.operatorSweep(t)
				e.assertOnlyBNFTables(t, s)
			},
		},
		{
			// DEL after the namespace is gone, with nftables rules:
			// bridge skips its teardown, the plugin's DEL releases them;
			// next: the DEL again.
			name:     "del-lost-netns-nftables",
			nftables: true,
			run: func(t *testing.T, e *testEnv, s *crashScene, env []string) {
				e.mustKillNetns(t, s.a)
				_, _, _ = e.cnitoolEnv("del", s.a, append(env, "CAP_ARGS="+s.capA)...)
			},
			next: func(t *testing.T, e *testEnv, s *crashScene) {
				e.mustCNI(t, "del", s.a, s.capA)
				e.assertOnlyBNFTables(t, s)
			},
		},
		{
			// A first ADD; next: its container is gone, and a sweep runs.
			name: "add",
			run: func(t *testing.T, e *testEnv, s *crashScene, env []string) {
				s.c = e.addNetns(t, "c")
				_, _, _ = e.cnitoolEnv("add", s.c, append(env, "CAP_ARGS="+portMappings(s.portA+7))...)
			},
			next: func(t *testing.T, e *testEnv, s *crashScene) {
				e.mustKillNetns(t, s.c)
				e.sweepsCAwayThenDELsA(t, s)
			},
		},
		{
			// A first ADD whose delegate dies without an answer after
			// bridge did all of its work (lease, veth, rules): the plugin
			// rolls it back with a DEL, then drops its pending record
			// (Abort); next: the runtime's DEL of the failed ADD.
			name: "add-fails",
			run: func(t *testing.T, e *testEnv, s *crashScene, env []string) {
				s.c = e.addNetns(t, "c")
				restore := e.withDelegate(t, s, "crashy", crashAfterBridge)
				if _, _, err := e.cnitoolEnv("add", s.c, append(env, "CAP_ARGS="+portMappings(s.portA+7))...); err == nil {
					t.Fatal("ADD through a delegate that dies succeeded")
				}
				restore()
			},
			next: func(t *testing.T, e *testEnv, s *crashScene) {
				e.mustCNI(t, "del", s.c, portMappings(s.portA+7))
				e.assertNoTrace(t, s.c.cid)
				if linkExistsIn(s.c, ifName) {
					t.Errorf("%s left in %s", ifName, s.c.name)
				}
				e.assertLiveB(t, s)
				e.mustCNI(t, "del", s.a, s.capA)
			},
		},
		{
			// A first ADD; next: the runtime retries it into the same,
			// live namespace, then DELs it. Killed after bridge finished
			// and before its record was completed, the container works:
			// the retry must not release its address (regression: it did,
			// and a second container asking for the address got it).
			name: "add-retry",
			run: func(t *testing.T, e *testEnv, s *crashScene, env []string) {
				s.c = e.addNetns(t, "c")
				_, _, _ = e.cnitoolEnv("add", s.c, append(env, "CAP_ARGS="+portMappings(s.portA+7))...)
			},
			next: func(t *testing.T, e *testEnv, s *crashScene) {
				held := leasesNaming(t, e.leaseDir(), s.c.cid)
				_, _, retryErr := e.cnitool("add", s.c, portMappings(s.portA+7))
				now := leasesNaming(t, e.leaseDir(), s.c.cid)
				if retryErr != nil && !slices.Equal(now, held) {
					t.Errorf("the refused retry changed C's leases: %v, then %v (%v)", held, now, retryErr)
				}
				// No one else is given an address C holds.
				for _, addr := range now {
					d := e.addNetns(t, "d")
					if _, _, err := e.cnitoolEnv("add", d, "CNI_ARGS=IgnoreUnknown=1;IP="+addr.String()); err == nil {
						t.Errorf("D was given %s, which C holds", addr)
					}
					e.mustCNI(t, "del", d, "")
				}
				e.mustCNI(t, "del", s.c, portMappings(s.portA+7))
				e.assertNoTrace(t, s.c.cid)
				e.assertLiveB(t, s)
				e.mustCNI(t, "del", s.a, s.capA)
			},
		},
	}
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			killAtEveryStep(t, func(t *testing.T, k int) crashRun {
				e, s := newCrashScene(t, p.gcVerb, p.nftables)
				env, done := armed(t, k)
				p.run(t, e, s, env)
				run := done()
				p.next(t, e, s)
				e.mustCNI(t, "del", s.b, s.capB)
				e.assertNetworkEmpty(t, e.leaseDir())
				if p.nftables {
					e.assertNFTablesHold(t, s, 0)
				}
				return run
			})
		})
	}
}

// killAtEveryStep runs trial(k) for k = 1, 2, ... in subtests, until the
// path it runs armed at k completes unkilled, and reports the number of
// kill points. trial returns what the armed run did.
func killAtEveryStep(t *testing.T, trial func(t *testing.T, k int) crashRun) {
	t.Helper()
	points := 0
	for k := 1; ; k++ {
		if k > 60 {
			t.Fatalf("still killed at step %d: a path this long is a bug", k)
		}
		var run crashRun
		ok := t.Run(fmt.Sprintf("kill-at-%d", k), func(t *testing.T) {
			run = trial(t, k)
			if !run.killed {
				t.Logf("completed unkilled after %d steps:\n%s", run.steps, run.log)
			}
		})
		if !ok {
			t.Logf("steps of the failed run:\n%s", run.log)
			return
		}
		if !run.killed {
			break
		}
		points++
	}
	t.Logf("%d kill points, each finished by what comes next", points)
	if points == 0 {
		t.Error("the path made no state change: the crash points are not armed")
	}
}

// TestCrashPointsAdoption: a container L runs on bare bridge with its lease
// in the legacy directory; the conflist is switched to the plugin, and the
// first ADD through it (of C) migrates L's lease, killed at each step.
// Then one of L's futures:
//
//   - l-runs: the runtime DELs C and ADDs it again (the migration runs
//     again), and a sweep runs while L still runs: L's lease must be in
//     the dataDir exactly once, never handed to C, and kept by the sweep
//     (regression: the migration run again removed L's legacy lease, the
//     sign that L is alive, and the sweep released L's copy); then L's DEL
//     through the bare configuration it was added with and one sweep
//     release it;
//   - l-deleted: L's runtime DELs it first, through that configuration;
//     then C's DEL and ADD (the migration runs again) and a sweep must
//     leave nothing of L (regression: a copy the killed run made before
//     L's record stayed, a lease with no record, until the reboot).
//
// Nothing may be left after C's DEL.
func TestCrashPointsAdoption(t *testing.T) {
	for _, future := range []struct {
		name     string
		lDeleted bool // L's runtime DELs L right after the crash
	}{{"l-runs", false}, {"l-deleted", true}} {
		t.Run(future.name, func(t *testing.T) {
			killAtEveryStep(t, func(t *testing.T, k int) crashRun {
				e := newEnv(t)
				e.requirePlugin(t)
				e.useCrashpointPlugin(t)
				bare := e.reclaimConf(t, "nomad.conflist")
				bareBridge(t, bare, e.persistDir)
				e.writeConflist(t, bare)
				l, c := e.addNetns(t, "l"), e.addNetns(t, "c")
				pl, _ := parseResult(t, e.mustCNI(t, "add", l, "")).addrIn(t, e.subnet4)
				legacyDir := filepath.Join(e.persistDir, e.netName)
				// L goes the way its runtime added it: bare bridge, legacy dir.
				delL := func() {
					e.writeConflist(t, bare)
					e.mustCNI(t, "del", l, "")
					e.writeConflist(t, e.reclaimConf(t, "nomad.conflist"))
				}
				// gc learns the legacy directory, where L's migrated
				// record's lease was, from the conflist: a record's own
				// paths are not trusted.
				sweep := func() {
					if _, stderr, err := e.operator(t, "gc", "--data-dir", e.dataDir, "--conf-dir", e.confDir); err != nil {
						t.Fatalf("gc: %v\n%s", err, stderr)
					}
				}

				e.writeConflist(t, e.reclaimConf(t, "nomad.conflist"))
				env, done := armed(t, k)
				_, _, _ = e.cnitoolEnv("add", c, env...)
				run := done()

				if future.lDeleted {
					delL()
				}
				e.mustCNI(t, "del", c, "")
				out := e.mustCNI(t, "add", c, "")
				pc, _ := parseResult(t, out).addrIn(t, e.subnet4)
				if pc.Addr() == pl.Addr() && !future.lDeleted {
					t.Fatalf("C got L's address %s", pl.Addr())
				}
				sweep()
				if future.lDeleted {
					e.assertNoTrace(t, l.cid)
					assertLeases(t, e.leaseDir(), map[netip.Addr]string{pc.Addr(): leaseContent(c.cid)})
					e.assertRecordsExactly(t, c.cid)
				} else {
					assertLeases(t, e.leaseDir(), map[netip.Addr]string{pl.Addr(): leaseContent(l.cid), pc.Addr(): leaseContent(c.cid)})
					assertLeases(t, legacyDir, map[netip.Addr]string{pl.Addr(): leaseContent(l.cid)})
					e.assertRecordsExactly(t, l.cid, c.cid)
					delL()
					sweep()
					e.assertNoTrace(t, l.cid)
				}
				e.mustCNI(t, "del", c, "")
				e.assertNetworkEmpty(t, e.leaseDir())
				assertLeases(t, legacyDir, nil)
				return run
			})
		})
	}
}

// TestCrashPointsMigratedDel: a container L runs on bare bridge, its lease
// in the legacy directory, and the conflist is switched to the plugin.
// Then L's first verbs through the plugin, one of them killed at each step:
//
//   - after-check: the runtime's CHECK of L migrates L's lease (before its
//     delegate, so that host-local finds it and the CHECK passes); then L's
//     runtime DELs it through the plugin (a runtime that reads the conflist
//     at DEL, as Nomad does), killed: the plugin's DEL removes L's legacy
//     lease too, before its record. Next: the DEL again.
//   - del-first: L's DEL is the first verb after the switch, killed: its
//     migration (record, copy, marker) runs before its delegate, so that
//     the DEL releases L's lease in both directories. Next: the DEL again.
//   - check-first: L's CHECK is the first verb after the switch (Nomad's
//     restore), killed, its migration and its sweep with it. Next: the
//     CHECK again, which must pass, L's lease in both directories and its
//     record alone; then L's DEL.
//
// Nothing of L may be left, in the dataDir or the legacy directory.
func TestCrashPointsMigratedDel(t *testing.T) {
	for _, c := range []struct {
		name    string
		checked bool   // L is CHECKed, unkilled, before the armed verb
		verb    string // the armed verb
	}{
		{"after-check", true, "del"},
		{"del-first", false, "del"},
		{"check-first", false, "check"},
	} {
		t.Run(c.name, func(t *testing.T) {
			killAtEveryStep(t, func(t *testing.T, k int) crashRun {
				e := newEnv(t)
				e.requirePlugin(t)
				e.useCrashpointPlugin(t)
				bare := e.reclaimConf(t, "nomad.conflist")
				bareBridge(t, bare, e.persistDir)
				e.writeConflist(t, bare)
				l := e.addNetns(t, "l")
				pl, _ := parseResult(t, e.mustCNI(t, "add", l, "")).addrIn(t, e.subnet4)
				legacyDir := filepath.Join(e.persistDir, e.netName)
				conf := e.reclaimConf(t, "nomad.conflist")
				// Every CHECK sweeps: a killed CHECK's sweep must be
				// finished by the next one.
				entryOfType(t, conf, pluginType)["checkSweepInterval"] = "0s"
				e.writeConflist(t, conf)
				// L as the migration leaves it: its lease in both
				// directories, its migrated record.
				migrated := func() {
					t.Helper()
					assertLeases(t, e.leaseDir(), map[netip.Addr]string{pl.Addr(): leaseContent(l.cid)})
					assertLeases(t, legacyDir, map[netip.Addr]string{pl.Addr(): leaseContent(l.cid)})
					e.assertRecordsExactly(t, l.cid)
				}
				if c.checked {
					e.mustCNI(t, "check", l, "")
					migrated()
				}

				env, done := armed(t, k)
				_, _, _ = e.cnitoolEnv(c.verb, l, env...)
				run := done()

				if c.verb == "check" {
					e.mustCNI(t, "check", l, "")
					migrated()
				}
				e.mustCNI(t, "del", l, "")
				e.assertNoTrace(t, l.cid)
				e.assertNetworkEmpty(t, e.leaseDir())
				assertLeases(t, legacyDir, nil)
				return run
			})
		})
	}
}

// newCrashScene starts the test's network with A and B attached on
// Nomad's chain, each with a port mapping, through the armed plugin;
// with nftables, bridge's ipMasq and portmap use their nftables backends.
func newCrashScene(t *testing.T, gcVerb, nftables bool) (*testEnv, *crashScene) {
	t.Helper()
	e := newEnv(t)
	e.requirePlugin(t)
	e.useCrashpointPlugin(t)
	return e, e.newScene(t, gcVerb, nftables)
}

// newScene is newCrashScene's network, through e's plugin.
func (e *testEnv) newScene(t *testing.T, gcVerb, nftables bool) *crashScene {
	t.Helper()
	conf := e.reclaimConf(t, "nomad.conflist")
	// Every CHECK sweeps: a killed CHECK must be finished by the next one.
	entryOfType(t, conf, pluginType)["checkSweepInterval"] = "0s"
	if gcVerb {
		conf["cniVersion"] = "1.1.0"
	}
	if nftables {
		requireTool(t, "nft")
		entryOfType(t, conf, pluginType)["ipMasqBackend"] = "nftables"
		entryOfType(t, conf, "portmap")["backend"] = "nftables"
	}
	s := &crashScene{confPath: e.writeConflist(t, conf), a: e.addNetns(t, "a"), b: e.addNetns(t, "b"), portA: randomHostPort()}
	if nftables {
		// portmap's nftables rules are not the network's (they name no
		// network): the environment's cleanup does not know them.
		t.Cleanup(func() { deletePortmapNFTRules(t, s.a.cid, s.b.cid) })
	}
	s.portB = s.portA + 1
	s.capA, s.capB = portMappings(s.portA), portMappings(s.portB)
	pa, _ := parseResult(t, e.mustCNI(t, "add", s.a, s.capA)).addrIn(t, e.subnet4)
	pb, _ := parseResult(t, e.mustCNI(t, "add", s.b, s.capB)).addrIn(t, e.subnet4)
	s.addrA, s.addrB = pa.Addr(), pb.Addr()
	return s
}

// assertOnlyBNFTables is assertOnlyB on nftables rules: the network
// holds B and nothing else, B keeps its nftables rules, and A has none
// (nor any iptables rule).
func (e *testEnv) assertOnlyBNFTables(t *testing.T, s *crashScene) {
	t.Helper()
	assertLeases(t, e.leaseDir(), map[netip.Addr]string{s.addrB: leaseContent(s.b.cid)})
	e.assertRecordsExactly(t, s.b.cid)
	e.assertRecord(t, s.b, s.addrB)
	e.assertNAT(t, s.a.cid, natWant{})
	e.assertNAT(t, s.b.cid, natWant{})
	assertNoFirewall(t, s.addrA)
	e.assertNFTablesHold(t, s, 1)
}

// assertNFTablesHold checks the nftables rules of the scene: none of A,
// and of B, bridge's one ipMasq rule and portmap's when b is 1, none when
// it is 0.
func (e *testEnv) assertNFTablesHold(t *testing.T, s *crashScene, b int) {
	t.Helper()
	if owners := e.nftMasqOwners(t, s.a.cid, s.b.cid); owners[s.a.cid] != 0 || owners["?"] != 0 || owners[s.b.cid] != b {
		t.Errorf("bridge's nftables ipMasq rules by owner: %v, want %d of B only", owners, b)
	}
	pm := portmapNFTRules(t)
	if countOf(pm, s.a.cid) != 0 || (countOf(pm, s.b.cid) > 0) != (b > 0) {
		t.Errorf("portmap's nftables rules: %q, want B's only (%d)", pm, b)
	}
}

// deletePortmapNFTRules deletes portmap's nftables rules commented with
// one of cids (cleanup: what a failed test left).
func deletePortmapNFTRules(t *testing.T, cids ...string) {
	re := regexp.MustCompile(`comment "([^"]*)".*# handle (\d+)`)
	for _, family := range []string{"ip", "ip6"} {
		out, err := exec.Command("nft", "-a", "list", "table", family, "cni_hostport").CombinedOutput()
		if err != nil {
			continue // no table: no rule
		}
		var chain string
		for _, line := range strings.Split(string(out), "\n") {
			if f := strings.Fields(line); len(f) > 1 && f[0] == "chain" {
				chain = f[1]
			}
			m := re.FindStringSubmatch(line)
			if m == nil || !slices.Contains(cids, m[1]) {
				continue
			}
			if out, err := exec.Command("nft", "delete", "rule", family, "cni_hostport", chain, "handle", m[2]).CombinedOutput(); err != nil {
				t.Errorf("cleanup: nft delete rule %s cni_hostport %s handle %s: %v: %s", family, chain, m[2], err, out)
			}
		}
	}
}

// withDelegate makes the scene's plugin delegate to the script body,
// installed as name among the plugins, and returns what restores the
// scene's configuration.
func (e *testEnv) withDelegate(t *testing.T, s *crashScene, name, body string) func() {
	t.Helper()
	conf, restore := sceneConf(t, s)
	if err := os.WriteFile(filepath.Join(e.bin, name), []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	entryOfType(t, conf, pluginType)["delegate"] = name
	e.writeConflist(t, conf)
	return restore
}

// sceneConf is the scene's configuration, decoded for a step to edit, and
// what writes it back as it was.
func sceneConf(t *testing.T, s *crashScene) (conf map[string]any, restore func()) {
	t.Helper()
	ours, err := os.ReadFile(s.confPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(ours, &conf); err != nil {
		t.Fatal(err)
	}
	return conf, func() {
		if err := os.WriteFile(s.confPath, ours, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// orphanOnBareBridge makes orphan NAT rules on the scene's network: a
// container added through bare bridge (at an address A and B do not have),
// whose namespace dies before its runtime's DEL through the same
// configuration; bridge then skips its ipMasq teardown. It returns that
// container's namespace, gone.
func (e *testEnv) orphanOnBareBridge(t *testing.T, s *crashScene) netns {
	t.Helper()
	bare, restore := sceneConf(t, s)
	bareBridge(t, bare, e.persistDir)
	addr := e.hostAddr(200)
	setRange(t, bare, addr, addr)
	e.writeConflist(t, bare)
	x := e.addNetns(t, "x")
	e.mustCNI(t, "add", x, "")
	e.mustKillNetns(t, x)
	e.mustCNI(t, "del", x, "")
	restore()
	e.assertNAT(t, x.cid, natWant{Masq: []netip.Addr{addr}})
	assertLeases(t, filepath.Join(e.persistDir, e.netName), nil)
	return x
}

// assertLiveB checks B kept everything: its lease, its record, its NAT
// rules, and it still passes CHECK.
func (e *testEnv) assertLiveB(t *testing.T, s *crashScene) {
	t.Helper()
	assertLease(t, e.leaseDir(), s.addrB, s.b.cid)
	e.assertRecord(t, s.b, s.addrB)
	e.assertNAT(t, s.b.cid, natWant{Masq: []netip.Addr{s.addrB}, DNAT: []portMap{{s.portB, s.addrB}}})
}

// sweepsCAwayThenDELsA is a next step of a path whose container C is
// dead: a gc leaves nothing of C, B and A as they were, then A's DEL.
func (e *testEnv) sweepsCAwayThenDELsA(t *testing.T, s *crashScene) {
	t.Helper()
	e.operatorSweep(t)
	e.assertNoTrace(t, s.c.cid)
	e.assertLiveB(t, s)
	e.assertNAT(t, s.a.cid, natWant{Masq: []netip.Addr{s.addrA}, DNAT: []portMap{{s.portA, s.addrA}}})
	e.mustCNI(t, "del", s.a, s.capA)
}

// assertOnlyB checks that the network holds B and nothing else: no lease,
// record or NAT line of A, none with A's address.
func (e *testEnv) assertOnlyB(t *testing.T, s *crashScene) {
	t.Helper()
	e.assertNoTrace(t, s.a.cid)
	assertLeases(t, e.leaseDir(), map[netip.Addr]string{s.addrB: leaseContent(s.b.cid)})
	e.assertRecordsExactly(t, s.b.cid)
	e.assertLiveB(t, s)
	if nat := e.networkNAT(t); strings.Contains(nat, s.addrA.String()+"/") || strings.Contains(nat, s.addrA.String()+":") {
		t.Errorf("NAT rules name A's released address %s:\n%s", s.addrA, nat)
	}
	// The firewall plugin's rules of A's address went with it (before
	// its files: a kill between leaves the files that find them).
	assertNoFirewall(t, s.addrA)
}

// restoreAndDel is Nomad restoring A after it was lost: a new namespace at
// the same path, ADD without DEL, CHECK, then the DEL of the allocation.
func (e *testEnv) restoreAndDel(t *testing.T, s *crashScene) {
	t.Helper()
	if _, err := os.Stat(s.a.path); err == nil {
		e.mustKillNetns(t, s.a)
	}
	if _, err := e.newNetns(strings.TrimPrefix(s.a.name, "nbc-e2e-"+e.id+"-")); err != nil {
		t.Fatal(err)
	}
	e.addAgainAndDel(t, s)
}

// addAgainAndDel ADDs A into its current namespace, checks it holds
// exactly one lease and one set of NAT rules, CHECKs and DELs it.
func (e *testEnv) addAgainAndDel(t *testing.T, s *crashScene) {
	t.Helper()
	out, stderr, err := e.cnitool("add", s.a, s.capA)
	if err != nil {
		t.Fatalf("ADD of %s after the crash: %v\nstderr: %s", s.a.cid, err, stderr)
	}
	p, _ := parseResult(t, out).addrIn(t, e.subnet4)
	assertLeases(t, e.leaseDir(), map[netip.Addr]string{p.Addr(): leaseContent(s.a.cid), s.addrB: leaseContent(s.b.cid)})
	e.assertNAT(t, s.a.cid, natWant{Masq: []netip.Addr{p.Addr()}, DNAT: []portMap{{s.portA, p.Addr()}}})
	e.mustCNI(t, "check", s.a, s.capA)
	e.mustCNI(t, "del", s.a, s.capA)
	e.assertOnlyB(t, s)
}

// leasesNaming are the addresses whose lease in dir names cid's eth0.
func leasesNaming(t *testing.T, dir, cid string) []netip.Addr {
	t.Helper()
	var out []netip.Addr
	for addr, content := range readLeases(t, dir) {
		if content == leaseContent(cid) {
			out = append(out, addr)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}
