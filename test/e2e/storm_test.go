package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	gocni "github.com/containerd/go-cni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/plugins/pkg/utils"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/cniexec"
)

// Knobs of TestStorm; `make test-storm` sets the first three.
const (
	stormEnv         = "NBC_STORM"          // 1 runs TestStorm
	stormDurationEnv = "NBC_STORM_DURATION" // Go duration, default 60s
	stormWorkersEnv  = "NBC_STORM_WORKERS"  // default 6
	// stormLogEnv names a file to write the whole operations log to (the
	// failure message carries the histories of the containers involved).
	stormLogEnv = "NBC_STORM_LOG"
)

// stormLiveCap is how many containers a worker keeps live: beyond it, the
// oldest is retired (CHECK, DEL, its namespace deleted), so containers live
// through many sweeps before their DEL.
const stormLiveCap = 2

// stormScenario is what one iteration of a storm worker does.
type stormScenario int

const (
	// ADD, CHECK, live; CHECK and DEL when retired.
	stormLifecycle stormScenario = iota
	// ADD, then the namespace is deleted without DEL: left to the sweeps.
	stormLost
	// ADD, namespace lost, a new one at the same path, ADD again without
	// DEL (must succeed), CHECK, live; DEL when retired.
	stormRestored
	// cnitool's ADD, its process group SIGKILLed at a random point; then
	// the namespace is deleted.
	stormKilledAdd
	// ADD, a task in the namespace, the path re-created, ADD again (must
	// be refused), the task stopped, DEL (must succeed).
	stormDetached
	stormScenarios
)

func (sc stormScenario) String() string {
	return [...]string{"lifecycle", "lost-netns", "restored", "killed-add", "detached"}[sc]
}

// TestStorm is a churn test of Nomad's chain (conflist/nomad.conflist:
// bridge with ipMasq, firewall, portmap; cniVersion 0.4.0) on one network,
// driven through go-cni as Nomad drives it (Setup = ADD, Check, Remove =
// DEL, Nomad's CNI_ARGS and one port mapping on a host port of its own).
// NBC_STORM_WORKERS workers (default 6) loop over the storm's scenarios
// (see stormScenario) on containers of their own for NBC_STORM_DURATION
// (default 60s), while `gc --data-dir` runs every second, every third run
// SIGKILLed (its process group) at a random point. Asserted throughout:
// every ADD, re-ADD, CHECK and DEL the scenario expects to succeed does,
// the re-ADD of a detached container is refused because its task holds the
// old namespace, no address is handed out while a live container holds it,
// every gc exits 0 unless killed. At the end, once every orphaned process
// of a killed ADD or gc has exited: every live container passes CHECK with
// an address of its own; after one more sweep, the network's leases,
// records and NAT rules are exactly those of the live containers; after
// their DEL, nothing of the network is left. On failure, the histories of
// the containers involved (and the killed gc runs) are logged; set
// NBC_STORM_LOG=FILE for the whole operations log.
//
// It runs only with NBC_STORM=1: `make test-storm` (STORM_DURATION,
// STORM_WORKERS).
func TestStorm(t *testing.T) {
	if os.Getenv(stormEnv) != "1" {
		t.Skipf("the storm runs only with %s=1: run `make test-storm` (STORM_DURATION=60s STORM_WORKERS=6)", stormEnv)
	}
	duration := envDuration(t, stormDurationEnv, 60*time.Second)
	workers := envInt(t, stormWorkersEnv, 6)
	e := newEnv(t)
	e.requirePlugin(t)
	path := e.writeConflist(t, e.reclaimConf(t, "nomad.conflist"))
	s := &storm{
		t: t, e: e, cni: e.goCNI(t, gocni.WithConfListFile(path)),
		start: time.Now(), dir: t.TempDir(),
		ctrs: map[string]*stormCtr{}, claims: map[netip.Addr]*stormCtr{},
		ports: map[int]bool{}, counts: map[string]int{}, implicated: map[string]bool{},
		sharedSeen: map[string]bool{},
	}
	s.addTime.Store(int64(200 * time.Millisecond))
	s.gcTime.Store(int64(50 * time.Millisecond))
	// Killed ADDs and gc runs orphan their processes: the test inherits
	// them, and waits for them before it judges the state.
	becomeSubreaper(t)
	defer s.report(t)

	live := s.run(t, workers, duration)
	s.errs.report(t)
	if err := reapChildren(cmdTimeout); err != nil {
		t.Errorf("orphans of killed ADDs and gc runs: %v", err)
	}
	s.logStats(t, duration, workers, live)
	s.requireCoverage(t)

	t.Run("live-containers-pass-check", func(t *testing.T) {
		seen := map[netip.Addr]*stormCtr{}
		for _, c := range live {
			if err := s.check(c); err != nil {
				s.implicate(c.ns.cid)
				t.Errorf("CHECK of live %s: %v", s.describe(c.ns.cid), err)
			}
			switch other, dup := seen[c.addr]; {
			case !c.addr.IsValid():
				s.implicate(c.ns.cid)
				t.Errorf("live %s has no address", s.describe(c.ns.cid))
			case dup:
				s.implicate(c.ns.cid)
				s.implicate(other.ns.cid)
				t.Errorf("live %s and live %s both hold %s", s.describe(c.ns.cid), s.describe(other.ns.cid), c.addr)
			}
			seen[c.addr] = c
		}
	})

	out, stderr, err := e.operator(t, "gc", "--data-dir", e.dataDir)
	s.gcReleases("final gc", out)
	if err != nil {
		s.gcErrors("final gc", stderr)
		t.Errorf("the final sweep, gc --data-dir %s: %v\nstdout: %s\nstderr: %s", e.dataDir, err, out, stderr)
	} else {
		t.Logf("the final sweep:\n%s", out)
	}
	t.Run("after-the-sweep-only-live-state", func(t *testing.T) {
		s.assertOnlyLive(t, live)
		want := map[netip.Addr]string{}
		var cids []string
		for _, c := range live {
			want[c.addr] = leaseContent(c.ns.cid)
			cids = append(cids, c.ns.cid)
		}
		e.assertRecordsExactly(t, cids...)
		e.assertDefaultDirsUntouched(t)
		assertLeases(t, e.leaseDir(), want)
		for _, c := range live {
			e.assertNAT(t, c.ns.cid, natWant{Masq: []netip.Addr{c.addr}, DNAT: []portMap{{c.port, c.addr}}})
		}
	})

	for _, c := range live {
		if err := s.remove(c); err != nil {
			s.implicate(c.ns.cid)
			t.Errorf("DEL of live %s at the end: %v", s.describe(c.ns.cid), err)
		}
		if err := s.dropNetns(c, "deleted after the final DEL"); err != nil {
			t.Errorf("%v", err)
		}
	}
	t.Run("after-del-nothing-left", func(t *testing.T) {
		s.assertOnlyLive(t, nil)
		e.assertNetworkEmpty(t, e.leaseDir())
	})
}

// storm is one storm's shared state: its containers, what it believes
// each holds, counts and the operations log.
type storm struct {
	t     *testing.T
	e     *testEnv
	cni   gocni.CNI
	start time.Time
	dir   string // working directory of the gc runs
	errs  errorList

	// Estimates of an ADD's and of a gc's duration, in nanoseconds: the
	// windows the kill points are drawn from.
	addTime, gcTime atomic.Int64

	mu         sync.Mutex
	events     []stormEvent
	ctrs       map[string]*stormCtr     // by container ID
	claims     map[netip.Addr]*stormCtr // addresses held by containers believed live
	ports      map[int]bool             // host ports ever mapped
	counts     map[string]int
	implicated map[string]bool // container IDs a failure names
	sharedSeen map[string]bool // stormSharedChains seen to exist
}

// stormCtr is one container of the storm. Only its worker touches it until
// the workers are done.
type stormCtr struct {
	label    string // worker and iteration, "w3-17": the netns suffix
	scenario stormScenario
	ns       netns // ns.cid is the container ID
	port     int
	opts     []gocni.NamespaceOpts
	addr     netip.Addr // while it is believed to hold one
}

// stormEvent is one line of the operations log; cid is empty for events
// of no single container (gc runs).
type stormEvent struct {
	at   time.Duration
	cid  string
	text string
}

func (ev stormEvent) String() string {
	return fmt.Sprintf("+%9.3fs %s", ev.at.Seconds(), ev.text)
}

// logf adds an event of c to the operations log.
func (s *storm) logf(c *stormCtr, format string, args ...any) {
	s.logCID(c.ns.cid, fmt.Sprintf("%-8s %-10s %s: ", c.label, c.scenario, c.ns.cid)+fmt.Sprintf(format, args...))
}

func (s *storm) logCID(cid, text string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events = append(s.events, stormEvent{at: time.Since(s.start), cid: cid, text: text})
}

// fail records an error of c's: in the error list, the log, and c's
// history is shown at the end.
func (s *storm) fail(c *stormCtr, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	s.logf(c, "FAILED: %s", msg)
	s.implicate(c.ns.cid)
	s.errs.add("%s: %s", s.describe(c.ns.cid), msg)
}

func (s *storm) implicate(cid string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.implicated[cid] = true
}

func (s *storm) count(what string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.counts[what]++
}

// describe names a container ID with its label, scenario and namespace.
func (s *storm) describe(cid string) string {
	s.mu.Lock()
	c := s.ctrs[cid]
	s.mu.Unlock()
	if c == nil {
		return fmt.Sprintf("%q (no container of the storm)", cid)
	}
	return fmt.Sprintf("%s (%s, %s, netns %s)", cid, c.label, c.scenario, c.ns.name)
}

// freePort is a host port no container of the storm ever mapped.
func (s *storm) freePort() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		if p := randomHostPort(); !s.ports[p] {
			s.ports[p] = true
			return p
		}
	}
}

// claim records that c holds addr and returns the live container that
// already held it, if any.
func (s *storm) claim(c *stormCtr, addr netip.Addr) *stormCtr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if other := s.claims[addr]; other != nil && other != c {
		return other
	}
	s.claims[addr] = c
	c.addr = addr
	return nil
}

// unclaim: c no longer holds its address (DEL, or its namespace is gone:
// from then on the address may be handed out again, once released).
func (s *storm) unclaim(c *stormCtr) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c.addr.IsValid() && s.claims[c.addr] == c {
		delete(s.claims, c.addr)
	}
	c.addr = netip.Addr{}
}

// run starts the workers and the gc loop and returns, once the duration
// is over and all have stopped, the containers the workers left live.
func (s *storm) run(t *testing.T, workers int, duration time.Duration) []*stormCtr {
	ctx, abort := context.WithCancel(context.Background())
	gcCtx, stopGC := context.WithCancel(ctx)
	var workersWG, gcWG sync.WaitGroup
	// Registered after becomeSubreaper: it runs before that cleanup's
	// wait4(-1), which must not take a child from under exec.Cmd.Wait.
	t.Cleanup(func() { abort(); workersWG.Wait(); gcWG.Wait() })
	s.warmUp(t)
	deadline := time.Now().Add(duration)
	lives := make([][]*stormCtr, workers)
	for w := range workers {
		workersWG.Go(func() { lives[w] = s.worker(ctx, w, deadline) })
	}
	gcWG.Go(func() { s.gcLoop(gcCtx) })
	workersWG.Wait()
	stopGC()
	gcWG.Wait()
	return slices.Concat(lives...)
}

// warmUp adds and removes one container before the workers start, so
// that the chains firewall and portmap share between containers exist.
// Both create them on first use with `iptables -N` and fail the ADD when a
// concurrent first ADD created them in between ("CHAIN_USER_ADD failed
// (File exists)"): an upstream race on a host's first ADDs, which no
// wrapper in front of bridge can close, and not what the storm tries.
func (s *storm) warmUp(t *testing.T) {
	c, err := s.newCtr("warm-up", stormLifecycle)
	if err != nil {
		t.Fatalf("warm-up container: %v", err)
	}
	if err := s.setup(c, "ADD"); err != nil {
		t.Fatalf("warm-up ADD: %v", err)
	}
	s.retire(c)
}

// worker runs the scenarios in turn, from its own starting point, until
// the deadline. After each, it CHECKs one of its live containers and
// retires the oldest beyond stormLiveCap. It returns its live containers.
func (s *storm) worker(ctx context.Context, w int, deadline time.Time) []*stormCtr {
	var live []*stormCtr
	for n := 0; ctx.Err() == nil && time.Now().Before(deadline); n++ {
		label := fmt.Sprintf("w%d-%d", w, n)
		if c := s.scenario(stormScenario((w+n)%int(stormScenarios)), label); c != nil {
			live = append(live, c)
		}
		if len(live) > 0 {
			c := live[rand.IntN(len(live))]
			if err := s.check(c); err != nil {
				s.fail(c, "CHECK of a live container: %v", err)
			}
		}
		for len(live) > stormLiveCap {
			s.retire(live[0])
			live = live[1:]
		}
	}
	return live
}

// scenario runs one scenario on a new container and returns it if it is
// live afterwards.
func (s *storm) scenario(sc stormScenario, label string) *stormCtr {
	c, err := s.newCtr(label, sc)
	if err != nil {
		return nil
	}
	s.count("scenario " + sc.String())
	if sc == stormKilledAdd {
		s.killedAdd(c)
		return nil
	}
	if err := s.setup(c, "ADD"); err != nil {
		s.fail(c, "ADD: %v", err)
		_ = s.dropNetns(c, "deleted after the failed ADD")
		return nil
	}
	switch sc {
	case stormLifecycle:
		if err := s.check(c); err != nil {
			s.fail(c, "CHECK right after the ADD: %v", err)
		}
		return c
	case stormLost:
		_ = s.dropNetns(c, "deleted without DEL (lost), left to the sweeps")
		return nil
	case stormRestored:
		return s.restore(c)
	case stormDetached:
		s.detach(c)
		return nil
	}
	panic(sc)
}

// newCtr creates the namespace of a new container. The go-cni containers'
// IDs are Nomad's allocation IDs (UUIDs); cnitool's are derived from the
// path.
func (s *storm) newCtr(label string, sc stormScenario) (*stormCtr, error) {
	ns, err := s.e.newNetns(label)
	c := &stormCtr{label: label, scenario: sc, ns: ns, port: s.freePort()}
	if sc != stormKilledAdd {
		c.ns.cid = podUID(s.t)
		s.e.track(c.ns.cid)
		c.opts = nomadOpts(c.ns.cid, c.port)
	}
	s.mu.Lock()
	s.ctrs[c.ns.cid] = c
	s.mu.Unlock()
	if err != nil {
		s.fail(c, "%v", err)
		return nil, err
	}
	s.logf(c, "netns %s created, host port %d", ns.path, c.port)
	return c, nil
}

// opCtx bounds one library call like every other command.
func opCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), cmdTimeout)
}

// setup is go-cni's Setup (ADD) of c; on success c holds the result's
// address.
func (s *storm) setup(c *stormCtr, verb string) error {
	ctx, cancel := opCtx()
	defer cancel()
	start := time.Now()
	res, err := s.cni.Setup(ctx, c.ns.cid, c.ns.path, c.opts...)
	took := time.Since(start).Round(time.Millisecond)
	s.count(verb)
	if err != nil {
		s.logf(c, "%s failed after %v: %v", verb, took, err)
		return err
	}
	addr, err := goCNIAddr(res, s.e.subnet4)
	if err != nil {
		s.logf(c, "%s: %v", verb, err)
		return err
	}
	s.addTime.Store(int64(took))
	s.logf(c, "%s -> %s (%v)", verb, addr, took)
	if other := s.claim(c, addr); other != nil {
		s.fail(c, "%s handed out %s, which live container %s holds", verb, addr, s.describe(other.ns.cid))
	}
	return nil
}

// goCNIAddr is the one IPv4 address in subnet of a go-cni result.
func goCNIAddr(res *gocni.Result, subnet netip.Prefix) (netip.Addr, error) {
	if res == nil || len(res.Raw()) != 1 {
		return netip.Addr{}, fmt.Errorf("go-cni result: want one network's result, got %+v", res)
	}
	raw, err := json.Marshal(res.Raw()[0])
	if err != nil {
		return netip.Addr{}, err
	}
	return resultAddr(string(raw), subnet)
}

func (s *storm) check(c *stormCtr) error {
	ctx, cancel := opCtx()
	defer cancel()
	err := s.cni.Check(ctx, c.ns.cid, c.ns.path, c.opts...)
	s.count("CHECK")
	if err != nil {
		s.logf(c, "CHECK failed: %v", err)
		return err
	}
	s.logf(c, "CHECK ok")
	return nil
}

// remove is go-cni's Remove (DEL) of c; c no longer holds its address.
func (s *storm) remove(c *stormCtr) error {
	ctx, cancel := opCtx()
	defer cancel()
	err := s.cni.Remove(ctx, c.ns.cid, c.ns.path, nomadDelOpts(c.port)...)
	s.count("DEL")
	s.unclaim(c)
	if err != nil {
		s.logf(c, "DEL failed: %v", err)
		return err
	}
	s.logf(c, "DEL ok")
	return nil
}

// dropNetns deletes c's namespace without a DEL (killNetns): the container
// is gone.
func (s *storm) dropNetns(c *stormCtr, why string) error {
	s.unclaim(c)
	if err := s.e.killNetns(c.ns); err != nil {
		s.fail(c, "delete netns: %v", err)
		return err
	}
	s.count("netns deleted")
	s.logf(c, "netns %s", why)
	return nil
}

// retire ends a live container: CHECK, DEL, its namespace deleted.
func (s *storm) retire(c *stormCtr) {
	if err := s.check(c); err != nil {
		s.fail(c, "CHECK of a live container before its DEL: %v", err)
	}
	if err := s.remove(c); err != nil {
		s.fail(c, "DEL of a live container: %v", err)
	}
	_ = s.dropNetns(c, "deleted after the DEL")
}

// restore is Nomad's restore of an allocation whose namespace was lost:
// a new namespace at the same path, ADD again without DEL.
func (s *storm) restore(c *stormCtr) *stormCtr {
	if err := s.dropNetns(c, "deleted without DEL (lost)"); err != nil {
		return nil
	}
	if err := c.ns.named().Add(); err != nil {
		s.fail(c, "re-create the netns: %v", err)
		return nil
	}
	s.logf(c, "netns re-created at the same path")
	if err := s.setup(c, "re-ADD"); err != nil {
		s.fail(c, "re-ADD after the namespace was lost (must succeed): %v", err)
		_ = s.dropNetns(c, "deleted after the failed re-ADD")
		return nil
	}
	if err := s.check(c); err != nil {
		s.fail(c, "CHECK after the re-ADD: %v", err)
	}
	return c
}

// detach is Nomad's restore of an allocation whose task still runs in the
// old namespace: the path re-created, ADD again without DEL, which must be
// refused; then Nomad gives up: the task is stopped, DEL must succeed, and
// the container is gone.
func (s *storm) detach(c *stormCtr) {
	task, err := s.e.newContainer(c.ns)
	if err != nil {
		s.fail(c, "%v", err)
		if task != nil {
			task.stop()
		}
		_ = s.remove(c)
		_ = s.dropNetns(c, "deleted after the task failed to start")
		return
	}
	s.logf(c, "task pid %d runs in the namespace", task.pid)
	defer task.stop()
	if err := c.ns.named().Recreate(); err != nil {
		s.fail(c, "re-create the netns: %v", err)
		task.stop()
		_ = s.remove(c)
		_ = c.ns.named().Delete()
		return
	}
	s.logf(c, "netns path unmounted and re-created while pid %d holds the old namespace", task.pid)
	old := c.addr
	switch err := s.setup(c, "re-ADD"); {
	case err == nil:
		s.fail(c, "re-ADD while pid %d holds the old namespace succeeded (-> %s, was %s): it must be refused", task.pid, c.addr, old)
		s.mu.Lock()
		if s.claims[old] == c {
			delete(s.claims, old)
		}
		s.mu.Unlock()
	case !strings.Contains(err.Error(), fmt.Sprintf("held by pid %d", task.pid)):
		s.fail(c, "re-ADD refused, but not because pid %d holds the old namespace: %v", task.pid, err)
	default:
		s.count("re-ADD refused")
		s.logf(c, "re-ADD refused, as it must be")
	}
	// Held for a random while (the sweeps run meanwhile): how long Nomad
	// retries is not a synchronisation.
	hold := time.Duration(rand.Int64N(int64(time.Second)))
	time.Sleep(hold)
	task.stop()
	s.logf(c, "task pid %d stopped after a hold of %v", task.pid, hold.Round(time.Millisecond))
	if err := s.remove(c); err != nil {
		s.fail(c, "DEL once the task is gone (must succeed): %v", err)
	}
	_ = s.dropNetns(c, "deleted after the DEL")
}

// killedAdd runs cnitool's ADD of c as a runtime that dies: its process
// group is SIGKILLed after a random delay within about one ADD's
// duration. Then the namespace is deleted: the container is gone.
func (s *storm) killedAdd(c *stormCtr) {
	window := max(time.Duration(s.addTime.Load())*6/5, time.Millisecond)
	killAfter := 1 + time.Duration(rand.Int64N(int64(window)))
	done, err := s.e.killedAdd(c.ns, killAfter, "CAP_ARGS="+portMappings(c.port))
	switch {
	case err != nil:
		s.fail(c, "%v", err)
	case done:
		s.count("killed ADD: finished before the kill")
		s.logf(c, "cnitool ADD finished before its kill at %v", killAfter.Round(time.Microsecond))
	default:
		s.count("killed ADD: killed mid-ADD")
		s.logf(c, "cnitool ADD's process group SIGKILLed %v in", killAfter.Round(time.Microsecond))
	}
	_ = s.dropNetns(c, "deleted after the runtime died")
}

// gcLoop runs gc every second until ctx is done.
func (s *storm) gcLoop(ctx context.Context) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for n := 1; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		s.gc(n, n%3 == 0)
		s.watchSharedChains()
	}
}

// stormSharedChains are portmap's chains every container's DNAT chain
// jumps to. Neither the plugin nor the storm ever deletes them; another
// e2e run on the host does (TestMain's restoreSharedChains, when they did
// not exist as it started), and then every portmap CHECK, ADD and DEL
// fails: such a run says nothing about the product.
var stormSharedChains = []string{hostportMarkChain, hostportMasqChain}

// watchSharedChains notes, once a shared chain exists, each time it is
// found missing.
func (s *storm) watchSharedChains() {
	for _, chain := range stormSharedChains {
		exists := run("iptables", "-w", "-t", "nat", "-S", chain) == nil
		s.mu.Lock()
		seen := s.sharedSeen[chain]
		s.sharedSeen[chain] = seen || exists
		s.mu.Unlock()
		if seen && !exists {
			s.count("host: shared chain removed by someone else")
			s.logCID("", fmt.Sprintf("host: %s was removed by something outside the storm (another e2e run's TestMain?)", chain))
		}
	}
}

// gc runs `gc --data-dir` in a process group of its own; with kill, the
// group is SIGKILLed after a random delay within the last whole run's
// duration.
func (s *storm) gc(n int, kill bool) {
	who := fmt.Sprintf("gc#%d", n)
	o := cniexec.Opts{Argv: []string{"gc", "--data-dir", s.e.dataDir}, Dir: s.dir, Group: true}
	var killAfter time.Duration
	if kill {
		window := max(time.Duration(s.gcTime.Load()), time.Millisecond)
		killAfter = 1 + time.Duration(rand.Int64N(int64(window)))
		o.Timeout = killAfter
	}
	if kill {
		s.logCID("", fmt.Sprintf("%s started, to be SIGKILLed %v in", who, killAfter.Round(time.Microsecond)))
	} else {
		s.logCID("", who+" started")
	}
	r := cniexec.Run(s.t, s.e.binary(pluginType), invoke.Args{}, o)
	released := s.gcReleases(who, r.Stdout)
	took := r.Elapsed.Round(time.Millisecond)
	switch {
	case r.Killed:
		s.count("gc: killed mid-run")
		s.logCID("", fmt.Sprintf("%s SIGKILLed (its process group) %v in, after %d release line(s)", who, killAfter.Round(time.Microsecond), released))
	case r.Err != nil:
		s.count("gc: failed")
		s.logCID("", fmt.Sprintf("%s FAILED after %v (exit %d): %s", who, took, r.ExitCode, strings.TrimSpace(r.Stderr)))
		s.gcErrors(who, r.Stderr)
		s.errs.add("%s: %v", who, r.Err)
	default:
		s.gcTime.Store(int64(r.Elapsed))
		s.count("gc: finished")
		if kill {
			s.count("gc: finished before its kill")
		}
		s.logCID("", fmt.Sprintf("%s finished in %v: %d release(s)", who, took, released))
	}
}

// gcReleases logs each "released NETWORK CID/IFNAME ..." line of a gc's
// output as an event of that container and counts them.
func (s *storm) gcReleases(who, out string) int {
	n := 0
	for line := range strings.SplitSeq(out, "\n") {
		f := strings.Fields(line)
		i := slices.Index(f, "released")
		if i < 0 || i+2 >= len(f) || f[i+1] != s.e.netName {
			continue
		}
		cid, _, _ := strings.Cut(f[i+2], "/")
		s.logCID(cid, fmt.Sprintf("%-8s %-10s %s: %s", who, "", cid, strings.TrimSpace(line)))
		n++
	}
	s.mu.Lock()
	s.counts["gc: release lines"] += n
	s.mu.Unlock()
	return n
}

// gcErrors logs each line of a failed gc's stderr that names a container
// of the storm as an event of that container.
func (s *storm) gcErrors(who, stderr string) {
	s.mu.Lock()
	cids := slices.Collect(maps.Keys(s.ctrs))
	s.mu.Unlock()
	for line := range strings.SplitSeq(stderr, "\n") {
		for _, cid := range cids {
			if strings.Contains(line, cid) {
				s.logCID(cid, fmt.Sprintf("%-8s %-10s %s: FAILED: %s", who, "", cid, strings.TrimSpace(line)))
			}
		}
	}
}

// logStats logs what the storm did.
func (s *storm) logStats(t *testing.T, duration time.Duration, workers int, live []*stormCtr) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(s.counts)) {
		fmt.Fprintf(&b, "\n  %-40s %6d", k, s.counts[k])
	}
	t.Logf("storm of %v with %d workers (ran %v): %d containers, %d live at the end, %d log events:%s",
		duration, workers, time.Since(s.start).Round(time.Millisecond), len(s.ctrs), len(live), len(s.events), b.String())
}

// requireCoverage fails when the storm did not do what it is for, or
// something outside it removed portmap's shared chains meanwhile.
func (s *storm) requireCoverage(t *testing.T) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	var missing []string
	for sc := range stormScenarios {
		if s.counts["scenario "+sc.String()] == 0 {
			missing = append(missing, "scenario "+sc.String())
		}
	}
	for _, k := range []string{"killed ADD: killed mid-ADD", "gc: killed mid-run", "gc: finished", "re-ADD refused"} {
		if s.counts[k] == 0 {
			missing = append(missing, k)
		}
	}
	if n := s.counts["host: shared chain removed by someone else"]; n > 0 {
		t.Errorf("portmap's shared chains %v were removed %d time(s) during the storm by something outside it (another e2e run on this host? see the log's \"host:\" events): portmap's ADD, CHECK and DEL fail then, so this run's failures are no evidence against the product; run the storm alone", stormSharedChains, n)
	}
	if len(missing) > 0 {
		t.Errorf("the storm was too short to test what it is for (%s): none of %s", stormDurationEnv, strings.Join(missing, ", "))
	}
}

// assertOnlyLive checks that the network's leases, records and NAT rules
// are the live containers' and nobody else's, and names each thing that is
// not, with its container.
func (s *storm) assertOnlyLive(t *testing.T, live []*stormCtr) {
	t.Helper()
	byCID := map[string]*stormCtr{}
	for _, c := range live {
		byCID[c.ns.cid] = c
	}
	var problems []string
	problem := func(cid, format string, args ...any) {
		s.implicate(cid)
		problems = append(problems, s.describe(cid)+": "+fmt.Sprintf(format, args...))
	}

	leases := readLeases(t, s.e.leaseDir())
	for addr, content := range leases {
		cid, _, _ := strings.Cut(content, "\r\n")
		switch c := byCID[cid]; {
		case c == nil:
			problem(cid, "lease %s/%s (%q) of a container that is not live", s.e.leaseDir(), addr, content)
		case c.addr != addr:
			problem(cid, "lease %s/%s, but the live container's address is %s", s.e.leaseDir(), addr, c.addr)
		}
	}
	records := map[string]bool{}
	for _, name := range s.e.recordNames(t) {
		if slices.Contains(recordMarkers, name) {
			continue
		}
		cid, ok := strings.CutSuffix(name, "@"+ifName)
		records[cid] = ok
		if !ok || byCID[cid] == nil {
			raw, err := os.ReadFile(s.e.recordPath(cid))
			if err != nil {
				raw = []byte(err.Error())
			}
			problem(cid, "record %s/%s of a container that is not live: %s", s.e.recordDir(), name, raw)
		}
	}
	chains := map[string]string{}
	s.mu.Lock()
	for cid := range s.ctrs {
		chains[s.e.masqChain(cid)] = cid
		chains[s.e.dnatChain(cid)] = cid
		chains[utils.MustFormatChainNameWithPrefix(s.e.netName, cid, "SN-")] = cid
	}
	s.mu.Unlock()
	for line := range strings.SplitSeq(strings.TrimSpace(s.e.networkNAT(t)), "\n") {
		if line == "" {
			continue
		}
		if cid := natOwner(line, chains); byCID[cid] == nil {
			problem(cid, "NAT of a container that is not live: %s", line)
		}
	}
	for _, c := range live {
		if leases[c.addr] != leaseContent(c.ns.cid) {
			problem(c.ns.cid, "live container without its lease %s/%s (it holds %q)", s.e.leaseDir(), c.addr, leases[c.addr])
		}
		if !records[c.ns.cid] {
			problem(c.ns.cid, "live container without its record %s", s.e.recordPath(c.ns.cid))
		}
	}
	if len(problems) > 0 {
		slices.Sort(problems)
		t.Errorf("%d thing(s) on the network are not those of the %d live container(s) (histories at the end):\n  %s", len(problems), len(live), strings.Join(problems, "\n  "))
	}
}

// natOwner is the container ID a line of networkNAT belongs to: the
// per-container chain it names, or the id in its comment.
func natOwner(line string, chains map[string]string) string {
	for _, f := range strings.Fields(line) {
		if cid, ok := chains[f]; ok {
			return cid
		}
	}
	if _, rest, ok := strings.Cut(line, `id: "`); ok {
		cid, _, _ := strings.Cut(rest, `"`)
		return cid
	}
	return ""
}

// report writes the operations log to NBC_STORM_LOG if set and, when the
// test failed, logs the history of every container a failure names and
// the killed gc runs.
func (s *storm) report(t *testing.T) {
	t.Helper()
	s.mu.Lock()
	events := slices.Clone(s.events)
	implicated := slices.Sorted(maps.Keys(s.implicated))
	s.mu.Unlock()
	if path := os.Getenv(stormLogEnv); path != "" {
		var b strings.Builder
		for _, ev := range events {
			b.WriteString(ev.String() + "\n")
		}
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			t.Errorf("write the operations log: %v", err)
		} else {
			t.Logf("operations log (%d events) written to %s", len(events), path)
		}
	}
	if !t.Failed() {
		return
	}
	s.watchSharedChains()
	s.mu.Lock()
	n := s.counts["host: shared chain removed by someone else"]
	s.mu.Unlock()
	if n > 0 {
		t.Logf("NOTE: portmap's shared chains were removed %d time(s) by something outside the storm: the failures may be that, not the product", n)
	}
	const maxHistories = 25
	if len(implicated) > maxHistories {
		t.Logf("%d containers are named by failures; the histories of the first %d follow (%s=FILE writes the whole log)", len(implicated), maxHistories, stormLogEnv)
		implicated = implicated[:maxHistories]
	}
	for _, cid := range implicated {
		var b strings.Builder
		for _, ev := range events {
			if ev.cid == cid {
				b.WriteString("  " + ev.String() + "\n")
			}
		}
		t.Logf("history of %s:\n%s", s.describe(cid), b.String())
	}
	var b strings.Builder
	for _, ev := range events {
		if ev.cid == "" && (strings.Contains(ev.text, "SIGKILLed (") || strings.Contains(ev.text, "FAILED") || strings.HasPrefix(ev.text, "host: ")) {
			b.WriteString("  " + ev.String() + "\n")
		}
	}
	t.Logf("gc runs killed or failed, and the host's shared chains removed:\n%s", b.String())
}
