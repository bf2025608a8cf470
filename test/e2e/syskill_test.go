package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/cniexec"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/testhost"
)

// Kills at system calls the code did not choose. The crash points
// (crashpoints_test.go) kill the plugin at the steps it marks; a step it
// does not know it makes (a library's file write, a delegate's netlink
// message, a runtime's own cache) is where a crash can still leave what
// nobody finishes. So each path of the crash points' scene runs here under
// test/syskill as the runtime (or the operator) would run it: cnitool, the
// plugin's gc, a Go runtime's libcni GC, with everything they start. It is
// counted first (-k 0); then, for sampled K, the whole tree is SIGKILLed
// at the K-th unlink, rename, create, write, flock, netlink send or exec,
// before that call runs. Then comes what the runtime or operator does
// next, and the crash points' invariants: the dead container leaves
// nothing after its DEL or the next sweep, the live ones keep everything,
// every address on a live container is leased to it and to no other, and
// every DEL and gc succeeds.
//
// By default each path kills at K=1, the last K and six between, and one
// path at each of its execs too (a few minutes in all); NBC_SYSKILL_ALL=1
// (make test-syskill) kills at every K.

const (
	syskillAllEnv = "NBC_SYSKILL_ALL"
	// gcHelperEnv makes the test binary a runtime sending GC (TestMain):
	// libcni's GC, with the valid list cnitool cannot pass, as a process
	// of its own that syskill can trace and kill.
	gcHelperEnv = "NBC_E2E_GC"
)

// syskillCall is a counted call, a line of test/syskill's -log.
type syskillCall struct {
	K                         int
	PID, TID                  int
	Comm, Call, Class, Detail string
}

func (c syskillCall) String() string {
	return fmt.Sprintf("%d %d/%d %s %s [%s] %s", c.K, c.PID, c.TID, c.Comm, c.Call, c.Class, c.Detail)
}

// syskillReport is test/syskill's -report.
type syskillReport struct {
	Killed  bool           `json:"killed"`
	Count   int            `json:"count"`
	At      *syskillCall   `json:"at"`
	ByClass map[string]int `json:"byClass"`
}

// syskillPath is one path of the crash points' scene: cmd sets it up and
// returns the command a runtime or operator runs for it; next is what
// comes after that command died.
type syskillPath struct {
	name   string
	gcVerb bool
	cmd    func(t *testing.T, e *testEnv, s *crashScene) *exec.Cmd
	next   func(t *testing.T, e *testEnv, s *crashScene)
	// everyExec: the sample also kills at every exec of the counted run.
	everyExec bool
}

func TestSyskill(t *testing.T) {
	requireHost(t)
	runner := buildSyskill(t)
	paths := []syskillPath{
		{
			// A first ADD of C; next: the runtime retries it, then DELs C,
			// and a sweep runs (it releases an empty lease: host-local
			// killed between creating and writing it names nobody, so no
			// DEL can tell it is C's).
			name: "add",
			cmd: func(t *testing.T, e *testEnv, s *crashScene) *exec.Cmd {
				s.c = e.addNetns(t, "c")
				return e.cnitoolCmd(context.Background(), "add", s.c, "CAP_ARGS="+portMappings(s.portA+7))
			},
			next: func(t *testing.T, e *testEnv, s *crashScene) {
				e.retryAdd(t, s.c, s.portA+7, s.a, s.b)
				e.mustCNI(t, "del", s.c, portMappings(s.portA+7))
				e.assertNoTrace(t, s.c.cid)
				e.operatorSweep(t)
				e.assertLiveB(t, s)
				assertLease(t, e.leaseDir(), s.addrA, s.a.cid)
				e.assertNAT(t, s.a.cid, natWant{Masq: []netip.Addr{s.addrA}, DNAT: []portMap{{s.portA, s.addrA}}})
				e.mustCNI(t, "del", s.a, s.capA)
			},
		},
		{
			// Nomad's restore of A (new namespace at the same path, ADD
			// without DEL); next: the runtime retries it, then DELs A,
			// and a sweep runs (as for "add").
			name: "re-add",
			cmd: func(t *testing.T, e *testEnv, s *crashScene) *exec.Cmd {
				e.replaceNetns(t, s.a, false)
				return e.cnitoolCmd(context.Background(), "add", s.a, "CAP_ARGS="+s.capA)
			},
			next: func(t *testing.T, e *testEnv, s *crashScene) {
				e.retryAdd(t, s.a, s.portA, s.b)
				e.mustCNI(t, "del", s.a, s.capA)
				e.assertNoTrace(t, s.a.cid)
				e.operatorSweep(t)
				e.assertOnlyB(t, s)
			},
		},
		{
			// CHECK of B sweeps A's lost attachment; next: CHECK again,
			// then Nomad restores A and DELs it.
			name: "check-sweep",
			cmd: func(t *testing.T, e *testEnv, s *crashScene) *exec.Cmd {
				e.mustKillNetns(t, s.a)
				return e.cnitoolCmd(context.Background(), "check", s.b, "CAP_ARGS="+s.capB)
			},
			next: func(t *testing.T, e *testEnv, s *crashScene) {
				e.mustCNI(t, "check", s.b, s.capB)
				e.assertOnlyB(t, s)
				e.restoreAndDel(t, s)
			},
		},
		{
			// DEL of a live A; next: the runtime retries the DEL.
			name: "del",
			cmd: func(t *testing.T, e *testEnv, s *crashScene) *exec.Cmd {
				return e.cnitoolCmd(context.Background(), "del", s.a, "CAP_ARGS="+s.capA)
			},
			next: func(t *testing.T, e *testEnv, s *crashScene) {
				e.mustCNI(t, "del", s.a, s.capA)
				e.assertOnlyB(t, s)
			},
		},
		{
			// The operator's gc releasing A's lost attachment; next:
			// another gc, then Nomad restores A and DELs it.
			name: "gc",
			cmd: func(t *testing.T, e *testEnv, s *crashScene) *exec.Cmd {
				e.mustKillNetns(t, s.a)
				return exec.Command(e.binary(pluginType), "gc", "--data-dir", e.dataDir)
			},
			next: func(t *testing.T, e *testEnv, s *crashScene) {
				e.operatorSweep(t)
				e.assertOnlyB(t, s)
				e.restoreAndDel(t, s)
			},
		},
		{
			// The operator's gc releasing orphan rules (crashpoints_test.go's
			// gc-orphan), killed at each of its execs too: each iptables
			// change is one. Next: another gc. Regression: killed between
			// bridge's chain's flush and its deletion, two iptables runs,
			// the gc left that chain empty, which nothing named any more.
			name:      "gc-orphan",
			everyExec: true,
			cmd: func(t *testing.T, e *testEnv, s *crashScene) *exec.Cmd {
				s.c = e.orphanOnBareBridge(t, s)
				return exec.Command(e.binary(pluginType), "gc", "--data-dir", e.dataDir)
			},
			next: func(t *testing.T, e *testEnv, s *crashScene) {
				e.sweepsCAwayThenDELsA(t, s)
			},
		},
		{
			// The runtime's GC verb listing B only; next: GC again.
			name:   "gc-verb",
			gcVerb: true,
			cmd: func(t *testing.T, e *testEnv, s *crashScene) *exec.Cmd {
				exe, err := os.Executable()
				if err != nil {
					t.Fatal(err)
				}
				cmd := exec.Command(exe, s.confPath, e.bin, e.cacheDir, s.b.cid)
				cmd.Env = []string{gcHelperEnv + "=1"}
				return cmd
			},
			next: func(t *testing.T, e *testEnv, s *crashScene) {
				if err := e.gcWithValid(t, s.confPath, s.b); err != nil {
					t.Fatalf("GC after the crash: %v", err)
				}
				e.assertOnlyB(t, s)
			},
		},
	}
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			trial := func(t *testing.T, k int) (syskillReport, []syskillCall) {
				e := newEnv(t)
				e.requirePlugin(t)
				s := e.newScene(t, p.gcVerb, false)
				rep, calls := e.underSyskill(t, runner, k, p.cmd(t, e, s))
				defer func() {
					if t.Failed() {
						t.Logf("reproduce: NBC_SYSKILL_ALL=1 go test -run '^TestSyskill$/^%s$/^(count|k=%d)$' ./test/e2e/ (the K-th call can shift with scheduling); the last calls up to it:\n%s", p.name, k, lastCalls(calls, 30))
					}
				}()
				p.next(t, e, s)
				e.assertAddrsHeld(t, s.b)
				e.mustCNI(t, "del", s.b, s.capB)
				e.assertNetworkEmpty(t, e.leaseDir())
				return rep, calls
			}
			var count syskillReport
			var calls []syskillCall
			if !t.Run("count", func(t *testing.T) { count, calls = trial(t, 0) }) {
				return
			}
			if calls == nil {
				t.Skip("the count run is filtered out; -run must include it, as in '^TestSyskill$/^add$/^(count|k=3)$'")
			}
			n := count.Count
			if os.Getenv(syskillAllEnv) != "1" {
				ks := syskillSample(calls)
				for _, c := range calls {
					if p.everyExec && c.Class == "exec" {
						ks = append(ks, c.K)
					}
				}
				slices.Sort(ks)
				for _, k := range slices.Compact(ks) {
					t.Run(fmt.Sprintf("k=%d", k), func(t *testing.T) { trial(t, k) })
				}
				return
			}
			// Every K, and on past n until a run completes unkilled: the
			// count of one run is not exactly the next one's.
			for k := 1; ; k++ {
				var rep syskillReport
				t.Run(fmt.Sprintf("k=%d", k), func(t *testing.T) { rep, _ = trial(t, k) })
				if !rep.Killed && k >= n {
					break
				}
				if k > 2*n+100 {
					t.Fatalf("still killed at call %d of a path that counted %d", k, n)
				}
			}
		})
	}
}

// syskillSample is K=1, the last K and six spread between, spread over
// the distinct points of the counted run: calls one after another of one
// thread, alike but for their number (iptables' netlink reads of its
// cache), are one point, killed at its first.
func syskillSample(calls []syskillCall) []int {
	var points []int
	for i, c := range calls {
		if i == 0 || c.TID != calls[i-1].TID || c.Call != calls[i-1].Call || c.Detail != calls[i-1].Detail {
			points = append(points, c.K)
		}
	}
	ks := []int{1, calls[len(calls)-1].K}
	for i := 1; i <= 6; i++ {
		ks = append(ks, points[i*len(points)/7])
	}
	slices.Sort(ks)
	return slices.Compact(ks)
}

func lastCalls(calls []syskillCall, n int) string {
	var b strings.Builder
	for _, c := range calls[max(0, len(calls)-n):] {
		fmt.Fprintln(&b, c)
	}
	return b.String()
}

// buildSyskill builds test/syskill for the test.
func buildSyskill(t *testing.T) string {
	t.Helper()
	exe := filepath.Join(t.TempDir(), "syskill")
	cmd := exec.Command("go", "build", "-buildvcs=false", "-o", exe, "./test/syskill")
	cmd.Dir = testhost.RepoDir(t)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build test/syskill: %v\n%s", err, out)
	}
	return exe
}

// underSyskill runs cmd, as the harness prepared it, under runner killing
// at the k-th call (k = 0: counting only), and returns the report and the
// calls counted (up to the killed one).
func (e *testEnv) underSyskill(t *testing.T, runner string, k int, cmd *exec.Cmd) (syskillReport, []syskillCall) {
	t.Helper()
	dir := t.TempDir()
	reportPath, logPath := filepath.Join(dir, "report.json"), filepath.Join(dir, "calls")
	argv := append([]string{"-k", strconv.Itoa(k), "-report", reportPath, "-log", logPath, "--", cmd.Path}, cmd.Args[1:]...)
	r := cniexec.Run(t, runner, invoke.Args{}, cniexec.Opts{Argv: argv, Env: cmd.Env})
	raw, err := os.ReadFile(reportPath)
	if err != nil {
		t.Fatalf("syskill wrote no report: %v\n%s", err, r)
	}
	var rep syskillReport
	if err := json.Unmarshal(raw, &rep); err != nil {
		t.Fatalf("syskill report %s: %v", raw, err)
	}
	log, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	calls := []syskillCall{}
	for line := range strings.Lines(string(log)) {
		var c syskillCall
		if err := json.Unmarshal([]byte(line), &c); err != nil {
			t.Fatalf("syskill log line %q: %v", line, err)
		}
		calls = append(calls, c)
	}
	switch {
	case len(calls) != rep.Count:
		t.Fatalf("syskill logged %d calls, counted %d", len(calls), rep.Count)
	case rep.Killed && (r.ExitCode != 137 || rep.At == nil):
		t.Fatalf("syskill killed the run but exits %d (at %v), want 137\n%s", r.ExitCode, rep.At, r)
	case rep.Killed:
		t.Logf("killed at call %s", rep.At)
	case r.Err != nil:
		// Not killed, the run is the untraced one: it must succeed.
		t.Fatalf("the run under syskill, not killed, failed: %v", r.Err)
	case len(calls) == 0:
		t.Fatal("no call counted: syskill traced nothing")
	default:
		t.Logf("completed unkilled after %d calls: %v", rep.Count, rep.ByClass)
	}
	return rep, calls
}

// retryAdd is the runtime's retry of a killed ADD of x (port mapped to
// port) in the namespace it has now, the others live beside it. It may
// be refused: the runtime then DELs and ADDs again. Either way no address
// may be on two containers or on one that no lease holds (the next ADD
// would be handed it), and the ADD that succeeds leaves x complete.
func (e *testEnv) retryAdd(t *testing.T, x netns, port int, others ...netns) {
	t.Helper()
	live := append(slices.Clone(others), x)
	capArgs := portMappings(port)
	out, _, err := e.cnitool("add", x, capArgs)
	if err != nil {
		t.Logf("the retried ADD of %s failed: %v", x.name, err)
		e.assertAddrsHeld(t, live...)
		e.mustCNI(t, "del", x, capArgs)
		out = e.mustCNI(t, "add", x, capArgs)
	}
	p, _ := parseResult(t, out).addrIn(t, e.subnet4)
	e.assertAddrsHeld(t, live...)
	e.assertRecord(t, x, p.Addr())
	e.assertNAT(t, x.cid, natWant{Masq: []netip.Addr{p.Addr()}, DNAT: []portMap{{port, p.Addr()}}})
}

// assertAddrsHeld checks the addresses on the live containers' eth0 in
// the test's subnets: each is leased to its container and is on no other.
func (e *testEnv) assertAddrsHeld(t *testing.T, live ...netns) {
	t.Helper()
	leases := readLeases(t, e.leaseDir())
	on := map[netip.Addr]string{}
	for _, ns := range live {
		for _, a := range e.eth0Addrs(t, ns) {
			if other, ok := on[a]; ok {
				t.Errorf("address %s is on %s and on %s", a, other, ns.name)
			}
			on[a] = ns.name
			if got := leases[a]; got != leaseContent(ns.cid) {
				t.Errorf("address %s on %s's %s is leased as %q, want %q: the next ADD may be handed it (leases: %q)", a, ns.name, ifName, got, leaseContent(ns.cid), leases)
			}
		}
	}
}

// eth0Addrs are the addresses in the test's subnets on eth0 in ns, none
// when it has no eth0.
func (e *testEnv) eth0Addrs(t *testing.T, ns netns) []netip.Addr {
	t.Helper()
	enter := ns.enter()
	out, err := output(enter[0], append(enter[1:], "ip", "-j", "addr", "show")...)
	if err != nil {
		t.Fatal(err)
	}
	var links []struct {
		Ifname   string `json:"ifname"`
		AddrInfo []struct {
			Local string `json:"local"`
		} `json:"addr_info"`
	}
	if err := json.Unmarshal([]byte(out), &links); err != nil {
		t.Fatalf("parse ip addr in %s: %v", ns.name, err)
	}
	var addrs []netip.Addr
	for _, l := range links {
		for _, ai := range l.AddrInfo {
			if a, err := netip.ParseAddr(ai.Local); err == nil && l.Ifname == ifName && (e.subnet4.Contains(a) || e.subnet6.Contains(a)) {
				addrs = append(addrs, a)
			}
		}
	}
	return addrs
}

// gcHelperMain is the test binary as a runtime sending GC for a conflist
// with a valid list: args are the conflist, the bin dir, libcni's cache
// dir and the valid container IDs.
func gcHelperMain(args []string) int {
	if len(args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: CONFLIST BINDIR CACHEDIR [VALID-CID...]")
		return 2
	}
	list, err := libcni.ConfListFromFile(args[0])
	if err == nil {
		err = (&testEnv{bin: args[1], cacheDir: args[2]}).gcList(list, args[3:])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, strings.TrimSpace(err.Error()))
		return 1
	}
	return 0
}
