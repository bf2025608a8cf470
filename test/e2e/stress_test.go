package e2e

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/cniexec"
)

// Knobs of the long-running tests; the defaults are the required load.
const (
	stressDurationEnv = "NBC_E2E_STRESS_DURATION" // Go duration, default 30s
	crashTrialsEnv    = "NBC_E2E_CRASH_TRIALS"    // default 20
	crashWindowEnv    = "NBC_E2E_CRASH_WINDOW"    // Go duration, default 60ms
)

func envDuration(t *testing.T, name string, def time.Duration) time.Duration {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		t.Fatalf("%s=%q: want a positive Go duration", name, v)
	}
	return d
}

func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// resultAddr is the IPv4 address of a CNI result inside subnet, for use
// off the test goroutine.
func resultAddr(stdout string, subnet netip.Prefix) (netip.Addr, error) {
	var r cniResult
	if err := json.Unmarshal([]byte(stdout), &r); err != nil {
		return netip.Addr{}, fmt.Errorf("result is not JSON: %w: %s", err, stdout)
	}
	var found []netip.Addr
	for _, ip := range r.IPs {
		p, err := netip.ParsePrefix(ip.Address)
		if err == nil && subnet.Contains(p.Addr()) {
			found = append(found, p.Addr())
		}
	}
	if len(found) != 1 {
		return netip.Addr{}, fmt.Errorf("want one address in %s, result has %v", subnet, r.IPs)
	}
	return found[0], nil
}

// errorList collects the errors of many goroutines, keeping the first few.
type errorList struct {
	mu    sync.Mutex
	n     int
	first []string
}

func (l *errorList) add(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.n++
	if len(l.first) < 20 {
		l.first = append(l.first, fmt.Sprintf(format, args...))
	}
}

func (l *errorList) report(t *testing.T) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.n > 0 {
		t.Errorf("%d error(s), the first %d:\n  %s", l.n, len(l.first), strings.Join(l.first, "\n  "))
	}
}

// TestConcurrentReclaim runs 16 workers for NBC_E2E_STRESS_DURATION
// (default 30s) on one network, each looping over a fresh namespace: ADD,
// CHECK, then DEL, or, every fourth time, abandoning the namespace without
// a DEL. Meanwhile a sweeper CHECKs a long-lived container over and over,
// so sweeps race ADDs, DELs and each other. Asserted throughout: no address
// is ever held by two live containers (from the ADD results), and every
// CHECK of a live container passes (host-local's CHECK fails when the lease
// is gone, so no live lease was released). At the end one more sweep, then
// the final DEL, must leave no lease, record or NAT rule.
func TestConcurrentReclaim(t *testing.T) {
	const workers = 16
	duration := envDuration(t, stressDurationEnv, 30*time.Second)
	e := newEnv(t)
	e.requirePlugin(t)
	conf := e.reclaimConf(t, "minimal.conflist")
	// 81 addresses for 17 live containers and the abandoned ones awaiting
	// a sweep: addresses are reused many times over.
	setRange(t, conf, e.hostAddr(10), e.hostAddr(90))
	// Every CHECK sweeps: the point is sweeps racing ADDs, DELs and each
	// other, not the default's sharing of one sweep between CHECKs.
	entryOfType(t, conf, pluginType)["checkSweepInterval"] = "0s"
	e.writeConflist(t, conf)

	long := e.addNetns(t, "long")
	pl, _ := parseResult(t, e.mustCNI(t, "add", long, "")).addrIn(t, e.subnet4)

	var (
		mu   sync.Mutex
		live = map[netip.Addr]string{pl.Addr(): long.cid}
	)
	claim := func(a netip.Addr, cid string) error {
		mu.Lock()
		defer mu.Unlock()
		if other, ok := live[a]; ok {
			return fmt.Errorf("%s handed to %s while live container %s holds it", a, cid, other)
		}
		live[a] = cid
		return nil
	}
	// A container's address is unclaimed before its DEL or abandonment:
	// from then on it may legitimately be handed out again.
	unclaim := func(a netip.Addr) {
		mu.Lock()
		defer mu.Unlock()
		delete(live, a)
	}

	var errs errorList
	var stats struct {
		sync.Mutex
		iterations, abandoned, sweeps, released int
	}
	deadline := time.Now().Add(duration)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; time.Now().Before(deadline); n++ {
				ns, err := e.newNetns(fmt.Sprintf("w%02d-%d", w, n))
				if err != nil {
					errs.add("worker %d: %v", w, err)
					return
				}
				out, _, err := e.cnitool("add", ns, "")
				if err != nil {
					errs.add("worker %d: ADD: %v", w, err)
					_ = e.killNetns(ns)
					continue
				}
				addr, err := resultAddr(out, e.subnet4)
				if err != nil {
					errs.add("worker %d: %v", w, err)
					continue
				}
				if err := claim(addr, ns.cid); err != nil {
					errs.add("worker %d: duplicate address: %v", w, err)
				}
				if _, _, err := e.cnitool("check", ns, ""); err != nil {
					errs.add("worker %d: CHECK of live %s (%s): %v", w, ns.cid, addr, err)
				}
				unclaim(addr)
				abandon := (n+w)%4 == 3
				if !abandon {
					if _, _, err := e.cnitool("del", ns, ""); err != nil {
						errs.add("worker %d: DEL: %v", w, err)
					}
				}
				if err := e.killNetns(ns); err != nil {
					errs.add("worker %d: %v", w, err)
				}
				stats.Lock()
				stats.iterations++
				if abandon {
					stats.abandoned++
				}
				stats.Unlock()
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for time.Now().Before(deadline) {
			_, stderr, err := e.cnitool("check", long, "")
			if err != nil {
				errs.add("sweeper: CHECK of the long-lived container: %v", err)
			}
			stats.Lock()
			stats.sweeps++
			stats.released += len(e.releaseLines(stderr))
			stats.Unlock()
		}
	}()
	wg.Wait()
	t.Logf("%d iterations (%d abandoned without DEL), %d sweeps releasing %d attachments, in %v",
		stats.iterations, stats.abandoned, stats.sweeps, stats.released, duration)
	errs.report(t)
	if stats.abandoned == 0 || stats.sweeps == 0 {
		t.Fatalf("the run was too short to test anything: %d abandoned, %d sweeps", stats.abandoned, stats.sweeps)
	}

	// The last abandoned containers are released by one more sweep; the
	// long-lived one survives it.
	e.mustCNI(t, "check", long, "")
	assertLeases(t, e.leaseDir(), map[netip.Addr]string{pl.Addr(): leaseContent(long.cid)})
	e.assertRecordsExactly(t, long.cid)
	e.assertNAT(t, long.cid, natWant{Masq: []netip.Addr{pl.Addr()}})

	e.mustCNI(t, "del", long, "")
	e.assertNetworkEmpty(t, e.leaseDir())
	if out, err := output("ip", "-o", "link", "show", "master", e.bridge); err != nil || strings.TrimSpace(out) != "" {
		t.Errorf("ports left on %s: %q %v", e.bridge, out, err)
	}
}

// TestCrashDuringAdd kills the plugin with SIGKILL at random points of ADD
// (NBC_E2E_CRASH_TRIALS times, default 20, after a random delay within
// NBC_E2E_CRASH_WINDOW, default 60ms, about one ADD's duration): the fault
// a runtime's timeout or the OOM killer injects. Only the plugin dies: its
// delegates run on, as they would. Then each namespace is deleted, and one
// CHECK of a live container must leave no lease, record or NAT rule of the
// dead containers. The range has room for the live container and exactly
// trials+10 more, so the closing ADDs of trials+10 containers only all
// succeed if every dead container's lease was released; none may receive
// the live container's address.
func TestCrashDuringAdd(t *testing.T) {
	trials := envInt(t, crashTrialsEnv, 20)
	window := envDuration(t, crashWindowEnv, 60*time.Millisecond)
	if trials > 200 {
		t.Fatalf("%s=%d: at most 200 fit in the test's /24", crashTrialsEnv, trials)
	}
	e := newEnv(t)
	e.requirePlugin(t)
	conf := e.reclaimConf(t, "minimal.conflist")
	first := 10
	last := first + trials + 10 // the live container and trials+10 more
	setRange(t, conf, e.hostAddr(first), e.hostAddr(last))
	e.writeConflist(t, conf)

	live := e.addNetns(t, "live")
	pl, gw := parseResult(t, e.mustCNI(t, "add", live, "")).addrIn(t, e.subnet4)
	stdin := entryConfig(t, conf, pluginType)

	// The killed plugin's delegates are orphaned: the test inherits them.
	becomeSubreaper(t)

	var dead []netns
	completed := 0
	for i := range trials {
		ns := e.addNetns(t, fmt.Sprintf("k%02d", i))
		dead = append(dead, ns)
		// The fault injection: the plugin alone is killed at a random point.
		killAfter := 1 + time.Duration(rand.Int64N(int64(window)))
		if r := cniexec.Run(t, e.binary(pluginType), e.cniArgs("ADD", ns), cniexec.Opts{Stdin: stdin, Timeout: killAfter}); r.Err == nil {
			completed++
		}
		// Its delegates finish the ADD (or fail) before the namespace goes.
		if err := reapChildren(30 * time.Second); err != nil {
			t.Fatalf("trial %d: %v", i, err)
		}
		e.mustKillNetns(t, ns)
	}
	t.Logf("%d trials, kill after 0-%v: %d ADDs finished before the kill", trials, window, completed)

	_, stderr, err := e.cnitool("check", live, "")
	if err != nil {
		t.Fatalf("CHECK of the live container after the crashes: %v\nstderr: %s", err, stderr)
	}
	t.Logf("the sweep released %d attachments", len(e.releaseLines(stderr)))
	assertLeases(t, e.leaseDir(), map[netip.Addr]string{pl.Addr(): leaseContent(live.cid)})
	e.assertRecordsExactly(t, live.cid)
	for _, ns := range dead {
		e.assertNAT(t, ns.cid, natWant{})
	}
	e.assertNAT(t, live.cid, natWant{Masq: []netip.Addr{pl.Addr()}})
	ping(t, live, gw)

	// Every other address of the range is free again, and none of the new
	// containers gets the live one's.
	seen := map[netip.Addr]string{}
	var fresh []netns
	for i := range last - first {
		ns := e.addNetns(t, fmt.Sprintf("f%02d", i))
		out, _, err := e.cnitool("add", ns, "")
		if err != nil {
			t.Fatalf("ADD %d of %d after the sweep (range %s-%s): %v; leases: %v", i+1, last-first, e.hostAddr(first), e.hostAddr(last), err, readLeases(t, e.leaseDir()))
		}
		fresh = append(fresh, ns)
		p, _ := parseResult(t, out).addrIn(t, e.subnet4)
		if p.Addr() == pl.Addr() {
			t.Fatalf("ADD after the sweep got the live container's %s", p.Addr())
		}
		if other, dup := seen[p.Addr()]; dup {
			t.Fatalf("%s handed out twice: %s and %s", p.Addr(), other, ns.cid)
		}
		seen[p.Addr()] = ns.cid
	}
	for _, ns := range append(fresh, live) {
		e.mustCNI(t, "del", ns, "")
	}
	e.assertNetworkEmpty(t, e.leaseDir())
}
