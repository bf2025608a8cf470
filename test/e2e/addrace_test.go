package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	gocni "github.com/containerd/go-cni"
	"golang.org/x/sys/unix"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/cniexec"
)

// A runtime that gives up on an ADD kills the plugin (containerd/go-cni
// kills its direct child; others kill the caller's process group), while
// the delegate, in a process group of its own, runs on and finishes the
// ADD. A sweep in between must count the ADD as running for as long as any
// of its processes runs; once they are gone, the next sweep judges it by
// the usual rules.

// churnIterationsEnv sets how many ADDs TestKilledAddsUnderConcurrentGC
// kills (default 30).
const churnIterationsEnv = "NBC_E2E_CHURN_ITERATIONS"

// slowDelegate is the fake delegate's name in the entry's "delegate".
const slowDelegate = "slow-bridge"

// slowBridgeBin is a CNI bin directory whose slowDelegate is a shell
// script: body, which pauses and then execs the real bridge (bridgePath).
// Making the delegate slow is the fault injection: it widens the window in
// which the ADD's caller is killed mid-delegate.
func (e *testEnv) slowBridgeBin(t *testing.T, body string) string {
	t.Helper()
	return e.fakeBinDir(t, map[string]string{slowDelegate: "#!/bin/sh\n" + body + "\n"})
}

// bridgePath is the real bridge, next to slowDelegate, in its script.
const bridgePath = `"${0%/*}/bridge"`

// slowConf is the minimal conflist with slowDelegate as the delegate and
// the IPv4 range limited to hosts first..last.
func (e *testEnv) slowConf(t *testing.T, first, last int) map[string]any {
	t.Helper()
	conf := e.reclaimConf(t, "minimal.conflist")
	entryOfType(t, conf, pluginType)["delegate"] = slowDelegate
	setRange(t, conf, e.hostAddr(first), e.hostAddr(last))
	return conf
}

// readyFIFO creates a named pipe the delegate writes a line to once it
// runs, and returns its path and the reader to wait on (waitLine).
func readyFIFO(t *testing.T) (string, *bufio.Reader) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "delegate-started")
	if err := unix.Mkfifo(path, 0o600); err != nil {
		t.Fatalf("mkfifo: %v", err)
	}
	// O_RDWR: opening a FIFO does not wait for a writer then.
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	t.Cleanup(func() { f.Close() })
	return path, bufio.NewReader(f)
}

// TestSweepWaitsForTheDelegateOfAKilledAdd: the caller of an ADD (plugin
// and all) is killed while the delegate sleeps before exec'ing bridge. A
// sweep then must keep the pending record: the ADD still runs. Once the
// delegate has finished, the namespace is deleted without a DEL, and one
// sweep must release everything the ADD left: lease, NAT rules, record.
func TestSweepWaitsForTheDelegateOfAKilledAdd(t *testing.T) {
	e := newEnv(t)
	e.requirePlugin(t)
	fifo, started := readyFIFO(t)
	// It reads all of its config before it says it started: the kill must
	// not cut the config short, or bridge would do nothing.
	bin := e.slowBridgeBin(t, fmt.Sprintf("conf=$(cat)\necho started > '%s'\nsleep 1\nexec %s <<EOF\n$conf\nEOF", fifo, bridgePath))
	conf := e.slowConf(t, 10, 20)
	becomeSubreaper(t)

	ns := e.addNetns(t, "killed")
	// Once the delegate has started, the runtime gives up: it kills its own
	// process group.
	giveUp, kill := context.WithCancel(context.Background())
	delegateStarted := make(chan error, 1)
	go func() {
		_, err := waitLine(started, cmdTimeout)
		delegateStarted <- err
		kill()
	}()
	args := e.cniArgs("ADD", ns)
	args.Path = bin
	r := cniexec.Run(t, e.binary(pluginType), args, cniexec.Opts{Stdin: entryConfig(t, conf, pluginType), Ctx: giveUp, Group: true})
	if err := <-delegateStarted; err != nil {
		t.Fatalf("delegate did not start: %v", err)
	}
	if r.Err == nil {
		t.Fatal("the plugin finished the ADD before it was killed")
	}

	out := e.operatorSweep(t)
	if raw, err := os.ReadFile(e.recordPath(ns.cid)); err != nil || !strings.Contains(string(raw), `"state":"pending"`) {
		t.Errorf("gc while the delegate still ran left the ADD's record %q (%v), want it pending; gc said:\n%s", raw, err, out)
	}

	if err := reapChildren(cmdTimeout); err != nil {
		t.Fatal(err)
	}
	// The point of the test: bridge finished the ADD after its caller died.
	addr := e.leaseOf(t, ns.cid)
	if len(e.readNAT(t, ns.cid)["iptables"].masqJumps) == 0 {
		t.Fatalf("bridge left no masquerade rule for %s: the test proves nothing", ns.cid)
	}
	e.mustKillNetns(t, ns)

	out = e.operatorSweep(t)
	if !strings.Contains(out, "released "+e.netName+" "+ns.cid+"/"+ifName+" "+addr.String()) {
		t.Errorf("gc after the namespace went did not release %s %s:\n%s", ns.cid, addr, out)
	}
	assertLeases(t, e.leaseDir(), nil)
	e.assertRecordsExactly(t)
	e.assertNAT(t, ns.cid, natWant{})
}

// TestDELWhileTheKilledADDsDelegateRuns: regression test. containerd's
// RunPodSandbox (internal/cri/server/sandbox_run.go) sets up the pod's
// network with the CRI request's context and, when that fails, tears it
// down at once in a deferred teardownPodNetwork (a fresh context, the same
// netns path), then removes the netns. A kubelet that gives up on a slow
// RunPodSandbox cancels the context: go-cni's Setup (libcni's
// invoke.RawExec, exec.CommandContext) kills the plugin alone, and its
// delegate runs on. The DEL used to run while that delegate had not
// allocated yet: it found nothing, removed the record, and what bridge made
// next (a lease of this boot with no record, NAT rules naming a leased
// container) no sweep ever releases. The DEL must wait for the ADD's
// processes, then tear down what they made.
func TestDELWhileTheKilledADDsDelegateRuns(t *testing.T) {
	e := newEnv(t)
	e.requirePlugin(t)
	fifo, started := readyFIFO(t)
	// Only its ADD is slow: the DEL that follows runs at once.
	bin := e.slowBridgeBin(t, fmt.Sprintf("conf=$(cat)\nif [ \"$CNI_COMMAND\" = ADD ]; then echo started > '%s'; sleep 1; fi\nexec %s <<EOF\n$conf\nEOF", fifo, bridgePath))
	path := e.writeConflist(t, e.slowConf(t, 10, 20))
	becomeSubreaper(t)
	cri := e.goCNI(t, gocni.WithPluginDir([]string{bin}), gocni.WithConfListFile(path))
	cid := sandboxID(t)
	ns := e.podNetns(t, "pod", cid)

	// The kubelet's deadline passes once the delegate runs.
	giveUp, cancel := context.WithCancel(context.Background())
	defer cancel()
	delegateStarted := make(chan error, 1)
	go func() {
		_, err := waitLine(started, cmdTimeout)
		delegateStarted <- err
		cancel()
	}()
	if _, err := cri.Setup(giveUp, cid, ns.path, criOpts(t, cid, 0)...); err == nil {
		t.Fatal("Setup finished before the runtime gave up on it")
	}
	if err := <-delegateStarted; err != nil {
		t.Fatalf("delegate did not start: %v", err)
	}
	// The deferred teardownPodNetwork, while the delegate still runs.
	if err := cri.Remove(runtimeCtx(t), cid, ns.path, criOpts(t, cid, 0)...); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	if err := reapChildren(cmdTimeout); err != nil {
		t.Fatal(err)
	}
	// Then sandbox.NetNS.Remove().
	e.mustKillNetns(t, ns)
	out := e.operatorSweep(t)
	assertLeases(t, e.leaseDir(), nil)
	e.assertRecordsExactly(t)
	e.assertNAT(t, cid, natWant{})
	if t.Failed() {
		t.Logf("gc after the netns went:\n%s", out)
	}
}

// leaseOf is the one address host-local leased to cid.
func (e *testEnv) leaseOf(t *testing.T, cid string) netip.Addr {
	t.Helper()
	var found []netip.Addr
	for addr, content := range readLeases(t, e.leaseDir()) {
		if content == leaseContent(cid) {
			found = append(found, addr)
		}
	}
	if len(found) != 1 {
		t.Fatalf("want one lease of %s, have %v (leases %v)", cid, found, readLeases(t, e.leaseDir()))
	}
	return found[0]
}

// TestKilledAddsUnderConcurrentGC drives ADDs the way a runtime does, through
// libcni (cnitool), and kills each caller's process group at a random
// point, NBC_E2E_CHURN_ITERATIONS times (default 30), while `gc` sweeps
// run back to back. The delegate pauses 0-300 ms before exec'ing bridge,
// so most kills land while it runs. After each kill the namespace is
// deleted without a DEL (at once or one kill later), as when the runtime's
// sandbox is gone. At the end,
// once every orphaned delegate has exited, one sweep must leave no lease,
// record or NAT rule of a killed ADD, and a container added at the start
// keeps its lease, rules and connectivity.
func TestKilledAddsUnderConcurrentGC(t *testing.T) {
	iterations := envInt(t, churnIterationsEnv, 30)
	if iterations > 200 {
		t.Fatalf("%s=%d: at most 200 fit in the test's /24", churnIterationsEnv, iterations)
	}
	e := newEnv(t)
	e.requirePlugin(t)
	bin := e.slowBridgeBin(t, `sleep "${NBC_E2E_DELEGATE_PAUSE:-0}"`+"\nexec "+bridgePath)
	// Room for the live container and every killed one, should no sweep
	// release anything until the end.
	e.writeConflist(t, e.slowConf(t, 10, 10+iterations+10))
	becomeSubreaper(t)
	viaSlowBridge := "CNI_PATH=" + bin

	live := e.addNetns(t, "live")
	liveOut, _, err := e.cnitoolEnv("add", live, viaSlowBridge)
	if err != nil {
		t.Fatalf("ADD of the live container: %v", err)
	}
	pl, gw := parseResult(t, liveOut).addrIn(t, e.subnet4)

	stop := make(chan struct{})
	var errs errorList
	var sweeps, released int
	var wg sync.WaitGroup
	// Before becomeSubreaper's cleanup: its wait4(-1) must not take a gc
	// process from under exec.Cmd.Wait.
	stopSweeps := sync.OnceFunc(func() { close(stop); wg.Wait() })
	t.Cleanup(stopSweeps)
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			out, stderr, err := e.operator(t, "gc", "--data-dir", e.dataDir)
			if err != nil {
				errs.add("gc: %v\n%s%s", err, out, stderr)
			}
			sweeps++
			released += strings.Count(out, "released ")
		}
	})
	var killed, lingering []netns
	completed := 0
	for i := range iterations {
		ns := e.addNetns(t, fmt.Sprintf("k%02d", i))
		killed = append(killed, ns)
		// An ADD takes the pause plus some 50-100 ms: most kills land in it.
		pause := time.Duration(rand.Int64N(int64(300 * time.Millisecond)))
		killAfter := time.Duration(rand.Int64N(int64(pause + 100*time.Millisecond)))
		done, err := e.killedAdd(ns, killAfter, viaSlowBridge, fmt.Sprintf("NBC_E2E_DELEGATE_PAUSE=%.3f", pause.Seconds()))
		if err != nil {
			t.Fatalf("iteration %d: %v", i, err)
		}
		if done {
			completed++
		}
		// Half the namespaces go at once, half after the next kill: some
		// delegates lose their namespace mid-ADD, others finish in it.
		for _, old := range lingering {
			e.mustKillNetns(t, old)
		}
		lingering = nil
		if rand.IntN(2) == 0 {
			e.mustKillNetns(t, ns)
		} else {
			lingering = append(lingering, ns)
		}
	}
	for _, ns := range lingering {
		e.mustKillNetns(t, ns)
	}
	stopSweeps()
	t.Logf("%d ADDs killed at random points (%d had finished), %d gc sweeps meanwhile released %d attachments", iterations, completed, sweeps, released)
	errs.report(t)

	if err := reapChildren(cmdTimeout); err != nil {
		t.Fatal(err)
	}
	t.Logf("the last sweep: %s", e.operatorSweep(t))
	for _, ns := range killed {
		e.assertNoTrace(t, ns.cid)
	}
	assertLeases(t, e.leaseDir(), map[netip.Addr]string{pl.Addr(): leaseContent(live.cid)})
	e.assertRecordsExactly(t, live.cid)
	e.assertNAT(t, live.cid, natWant{Masq: []netip.Addr{pl.Addr()}})
	ping(t, live, gw)

	if _, _, err := e.cnitoolEnv("del", live, viaSlowBridge); err != nil {
		t.Fatalf("DEL of the live container: %v", err)
	}
	e.assertNetworkEmpty(t, e.leaseDir())
}

// killedAdd starts `cnitool add` for ns in a process group of its own,
// with env added to cnitool's (see cnitoolCmd: a CNI_PATH, CAP_ARGS, the
// slow delegate's pause), and SIGKILLs the group after killAfter, as a
// runtime that gives up on the ADD does. It reports whether the ADD had
// finished by then.
func (e *testEnv) killedAdd(ns netns, killAfter time.Duration, env ...string) (bool, error) {
	cmd := e.cnitoolCmd(context.Background(), "add", ns, env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	cmd.WaitDelay = 5 * time.Second // nothing the kill left may hold the pipe
	if err := cmd.Start(); err != nil {
		return false, fmt.Errorf("start cnitool: %w", err)
	}
	time.Sleep(killAfter) // the fault injection: a kill at a random point
	if err := unix.Kill(-cmd.Process.Pid, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
		return false, fmt.Errorf("kill cnitool's process group: %w", err)
	}
	err := cmd.Wait()
	if rerr := reapGroup(cmd.Process.Pid); rerr != nil {
		return false, rerr
	}
	var exitErr *exec.ExitError
	switch {
	case err == nil:
		return true, nil
	case errors.As(err, &exitErr) && exitErr.ExitCode() == -1:
		return false, nil // killed
	}
	return false, fmt.Errorf("ADD of %s failed before it was killed: %w: %s", ns.cid, err, cnitoolError(stderr.String()))
}

// TestSweepEndsAnOverdueDelegate: regression test. A delegate whose plugin
// was killed -9 ran on for ever (nothing enforced delegateTimeout any
// more), holding its ADD's record locked, so every sweep kept the ADD as
// running. Before the record's deadline a sweep still waits for it; past
// the deadline (set here in the record's own file, in place: the lock is
// on its inode) gc kills exactly that delegate and releases what the dead
// ADD left.
func TestSweepEndsAnOverdueDelegate(t *testing.T) {
	e := newEnv(t)
	e.requirePlugin(t)
	fifo, started := readyFIFO(t)
	pidFile := filepath.Join(t.TempDir(), "delegate.pid")
	// It never answers: it holds the record (fd 3, inherited) and sleeps.
	bin := e.slowBridgeBin(t, fmt.Sprintf("cat >/dev/null\necho $$ > '%s'\necho started > '%s'\nexec sleep 600", pidFile, fifo))
	conf := e.slowConf(t, 10, 20)
	becomeSubreaper(t)

	ns := e.addNetns(t, "overdue")
	giveUp, kill := context.WithCancel(context.Background())
	go func() {
		_, _ = waitLine(started, cmdTimeout)
		kill()
	}()
	args := e.cniArgs("ADD", ns)
	args.Path = bin
	r := cniexec.Run(t, e.binary(pluginType), args, cniexec.Opts{Stdin: entryConfig(t, conf, pluginType), Ctx: giveUp, Group: true})
	if r.Err == nil {
		t.Fatal("the plugin finished the ADD before it was killed")
	}
	raw, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	delegate, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil {
		t.Fatal(err)
	}

	out := e.operatorSweep(t)
	if unix.Kill(delegate, 0) != nil || !strings.Contains(readFile(t, e.recordPath(ns.cid)), `"state":"pending"`) {
		t.Fatalf("before its deadline, gc ended the delegate or dropped the pending record:\n%s", out)
	}

	// Past its deadline, in place.
	var rec map[string]any
	if err := json.Unmarshal([]byte(readFile(t, e.recordPath(ns.cid))), &rec); err != nil {
		t.Fatal(err)
	}
	rec["deadline"] = 1
	f, err := os.OpenFile(e.recordPath(ns.cid), os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(mustJSON(t, rec)); err != nil {
		t.Fatal(err)
	}
	f.Close()

	out = e.operatorSweep(t)
	t.Logf("gc past the deadline:\n%s", out)
	if !strings.Contains(out, "ran past the deadline") || !strings.Contains(out, fmt.Sprintf("killed pids [%d]", delegate)) {
		t.Errorf("gc past the deadline did not say it killed the delegate %d:\n%s", delegate, out)
	}
	if err := reapChildren(cmdTimeout); err != nil {
		t.Fatal(err)
	}
	if err := unix.Kill(delegate, 0); !errors.Is(err, unix.ESRCH) {
		t.Errorf("the overdue delegate %d still runs (%v)", delegate, err)
	}
	e.assertRecordsExactly(t)
	assertLeases(t, e.leaseDir(), nil)
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
