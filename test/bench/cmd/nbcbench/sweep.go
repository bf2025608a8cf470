package main

import (
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/netfilter"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/reclaim"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/sysinfo"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/bench/internal/synth"
)

// synthNet is one synthetic network of the sweep benchmarks.
type synthNet struct {
	spec    synth.Spec
	built   bool
	live    int
	stale   []string
	liveIDs []string
}

func (e *Env) synthNet(name string, leases, pct int) *synthNet {
	return &synthNet{spec: synth.Spec{
		DataDir:      filepath.Join(e.tmpfs, "sweep"),
		Network:      "nbcb-" + e.o.id + "-" + name,
		Leases:       leases,
		StalePercent: pct,
		Base:         netip.MustParseAddr("10.0.0.0"),
		LiveNetns:    e.liveNetns,
		GonePrefix:   filepath.Join(netnsDir, "nbcb-"+e.o.id+"-gone"),
		Seed:         e.o.id + name,
	}}
}

// ensure (re)builds the directory unless it is intact from a sweep that
// released nothing.
func (s *synthNet) ensure() error {
	if s.built {
		return nil
	}
	if err := synth.Remove(s.spec.DataDir, s.spec.Network); err != nil {
		return err
	}
	r, err := synth.Build(s.spec)
	if err != nil {
		return err
	}
	s.live, s.stale, s.liveIDs = r.Live, r.StaleIDs, r.LiveIDs
	s.built = true
	return nil
}

// swept marks the directory as changed and checks that exactly the live
// leases are left.
func (s *synthNet) swept() error {
	if len(s.stale) > 0 {
		s.built = false
	}
	n, err := synth.CountLeases(s.spec.DataDir, s.spec.Network)
	if err != nil {
		return err
	}
	if n != s.live {
		return fmt.Errorf("sweep of %s left %d leases, want the %d live ones", s.spec.Network, n, s.live)
	}
	return nil
}

// sweepInProc times reclaim.Sweep in this process with a fresh Sweeper,
// as a CHECK process has one: the cost a CHECK adds after its delegate
// (its orphan listing skipped while the NAT ruleset is unchanged, as a
// CHECK's is: the first rep lists, the others find it unchanged).
func (e *Env) sweepInProc(s *synthNet) (wall, cpu float64, err error) {
	if err := s.ensure(); err != nil {
		return 0, 0, err
	}
	runtime.GC()
	sw := &reclaim.Sweeper{Env: reclaim.Env{Host: &sysinfo.Real{}, Netfilter: netfilter.New(), Log: io.Discard}}
	c0, t0 := cpuNow(), time.Now()
	rep, err := sw.Sweep(reclaim.Request{Dir: ipamdir.New(s.spec.DataDir, s.spec.Network), SkipUnchangedNAT: true})
	d, c := time.Since(t0), cpuNow()-c0
	if err != nil {
		return 0, 0, fmt.Errorf("sweep %s: %w", s.spec.Network, err)
	}
	if rep.Released != len(s.stale) {
		return 0, 0, fmt.Errorf("sweep %s released %d, want %d", s.spec.Network, rep.Released, len(s.stale))
	}
	return ms(d), ms(c), s.swept()
}

// sweepProcess runs `nomad-bridge-cni gc` on the network: wall time and
// peak RSS in KiB (see rss.go for why through exec-rss).
func (e *Env) sweepProcess(s *synthNet) (wall float64, rss int64, cpu float64, err error) {
	if err := s.ensure(); err != nil {
		return 0, 0, 0, err
	}
	d, rss, c, err := execRSS(cniEnv(), filepath.Join(e.o.bin, pluginType), "gc", "--data-dir", s.spec.DataDir, "--network", s.spec.Network)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("gc %s: %w", s.spec.Network, err)
	}
	return ms(d), rss, ms(c), s.swept()
}

func parseInts(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return nil, fmt.Errorf("bad number %q", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func (e *Env) ensureLiveNetns() error {
	if e.liveNetns != "" {
		return nil
	}
	_, path, err := e.addNetns("live")
	if err != nil {
		return err
	}
	e.liveNetns = path
	return nil
}

// benchSweep measures the sweep over 0/50/100% stale networks of each
// size. Cells run round-robin, one rep of every cell per round, so that
// noise spreads over all of them; an empty network's gc is the baseline
// for process start.
func (e *Env) benchSweep(res *Results) error {
	if err := e.ensureLiveNetns(); err != nil {
		return err
	}
	sizes, err := parseInts(e.o.sizes)
	if err != nil {
		return err
	}
	reps, err := parseInts(e.o.reps)
	if err != nil || len(reps) != len(sizes) {
		return fmt.Errorf("--sweep-reps must give one count per size")
	}
	type cell struct {
		size, pct, reps          int
		net                      *synthNet
		in, proc, inCPU, procCPU []float64
		rss                      int64
	}
	var cells []*cell
	maxReps := 0
	for i, n := range sizes {
		for _, pct := range []int{0, 50, 100} {
			cells = append(cells, &cell{size: n, pct: pct, reps: reps[i], net: e.synthNet(fmt.Sprintf("s%d-%d", n, pct), n, pct)})
		}
		maxReps = max(maxReps, reps[i])
	}
	if _, floor, _, err := execRSS(cniEnv(), "/bin/true"); err == nil {
		res.RSSFloorKiB = floor
	}
	empty := e.synthNet("empty", 0, 0)
	var emptyMs []float64
	var lastRound time.Duration
	for r := range maxReps {
		roundStart := time.Now()
		if err := e.canceled(); err != nil {
			return err
		}
		// Optional rounds only start if one more, as long as the last,
		// still ends within the budget.
		if r > 0 && time.Now().Add(lastRound).After(e.deadline) {
			w := fmt.Sprintf("sweep benchmark stopped after %d of %d rounds: the run's time budget (--budget) was used up", r, maxReps)
			res.Warnings = append(res.Warnings, w)
			fmt.Fprintln(os.Stderr, "nbcbench: "+w)
			break
		}
		d, _, _, err := e.sweepProcess(empty)
		if err != nil {
			return err
		}
		emptyMs = append(emptyMs, d)
		for _, c := range cells {
			if r >= c.reps {
				continue
			}
			d, cpu, err := e.sweepInProc(c.net)
			if err != nil {
				return err
			}
			c.in, c.inCPU = append(c.in, d), append(c.inCPU, cpu)
			d, rss, cpu, err := e.sweepProcess(c.net)
			if err != nil {
				return err
			}
			c.proc, c.procCPU = append(c.proc, d), append(c.procCPU, cpu)
			c.rss = max(c.rss, rss)
		}
		lastRound = time.Since(roundStart)
		fmt.Fprintf(os.Stderr, "nbcbench: sweep round %d/%d done in %.0fs (load %s)\n", r+1, maxReps, lastRound.Seconds(), loadAvg())
	}
	res.GCEmpty = summarize(emptyMs)
	for _, c := range cells {
		res.Sweep = append(res.Sweep, SweepCell{Leases: c.size, Stale: c.pct, InProc: summarize(c.in), InProcCPU: summarize(c.inCPU),
			Process: summarize(c.proc), ProcessCPU: summarize(c.procCPU), MaxRSSKiB: c.rss})
		synth.Remove(c.net.spec.DataDir, c.net.spec.Network)
	}
	return nil
}

// benchRelease compares releasing 254 stale leases with one gc (the sweep
// CHECK runs) against 254 host-local DEL execs, reps interleaved.
func (e *Env) benchRelease(res *Results) error {
	if err := e.ensureLiveNetns(); err != nil {
		return err
	}
	const n = 254
	ours := e.synthNet("rel-a", n, 100)
	theirs := e.synthNet("rel-b", n, 100)
	hostLocal := filepath.Join(e.o.bin, "host-local")
	var a, b, ca, cb []float64
	for range e.o.releaseReps {
		if err := e.canceled(); err != nil {
			return err
		}
		d, _, cpu, err := e.sweepProcess(ours)
		if err != nil {
			return err
		}
		a, ca = append(a, d), append(ca, cpu)

		if err := theirs.ensure(); err != nil {
			return err
		}
		conf := fmt.Sprintf(`{"cniVersion":"0.4.0","name":%q,"type":"bridge","ipam":{"type":"host-local","dataDir":%q,"ranges":[[{"subnet":"10.0.0.0/16"}]]}}`,
			theirs.spec.Network, theirs.spec.DataDir)
		t0 := time.Now()
		var cpuB time.Duration
		for _, cid := range theirs.stale {
			cmd := exec.Command(hostLocal)
			cmd.Env = cniEnv("CNI_COMMAND=DEL", "CNI_CONTAINERID="+cid, "CNI_NETNS=", "CNI_IFNAME="+ifName, "CNI_PATH="+e.o.bin)
			cmd.Stdin = strings.NewReader(conf)
			if out, err := cmd.CombinedOutput(); err != nil {
				return fmt.Errorf("host-local DEL %s: %w: %s", cid, err, out)
			}
			cpuB += procCPU(cmd.ProcessState)
		}
		b, cb = append(b, ms(time.Since(t0))), append(cb, ms(cpuB))
		theirs.built = false
		if left, err := synth.CountLeases(theirs.spec.DataDir, theirs.spec.Network); err != nil || left != 0 {
			return fmt.Errorf("host-local DELs left %d leases (%v)", left, err)
		}
	}
	synth.Remove(ours.spec.DataDir, ours.spec.Network)
	synth.Remove(theirs.spec.DataDir, theirs.spec.Network)
	p := makePair("release 254 stale leases", a, b).withCPU(ca, cb)
	res.Release = &p
	return nil
}

// Sizes a node really holds: bridge gives a bridge at most 1024 ports, so
// a CHECK sweeps at most 1023 live attachments besides its own; a /20
// leaked for a while (containers that died without a DEL) is 3000 stale
// leases for one gc.
const (
	nodeLiveLeases  = 1023
	nodeStaleLeases = 3000
)

// benchNode measures the sweep at a node's sizes: the sweep a CHECK adds
// over 1023 live attachments that each have bridge's ipMasq rules
// (in-process, as in a CHECK process, and as a gc process, reps
// interleaved, in a namespace of its own: nodenat.go), then one gc that
// releases 3000 stale leases (wall time and peak RSS; the network is
// rebuilt for each rep).
func (e *Env) benchNode(res *Results) error {
	if err := e.ensureLiveNetns(); err != nil {
		return err
	}
	// Owned, as a network the plugin has added to: its sweeps list
	// the NAT rules for orphans even when nothing is stale.
	live := e.synthNet("node-live", nodeLiveLeases, 0)
	stale := e.synthNet("node-stale", nodeStaleLeases, 100)
	live.spec.Owned, stale.spec.Owned = true, true
	defer synth.Remove(live.spec.DataDir, live.spec.Network)
	defer synth.Remove(stale.spec.DataDir, stale.spec.Network)
	if err := e.canceled(); err != nil {
		return err
	}
	lr, err := e.runNodeLive(live)
	if err != nil {
		return err
	}
	liveCell := SweepCell{Leases: nodeLiveLeases, Stale: 0, NATRules: lr.NATRules, MaxRSSKiB: lr.MaxRSSKiB}
	liveCell.InProc, liveCell.InProcCPU = summarize(lr.In), summarize(lr.InCPU)
	liveCell.Process, liveCell.ProcessCPU = summarize(lr.Proc), summarize(lr.ProcCPU)
	staleCell := SweepCell{Leases: nodeStaleLeases, Stale: 100}
	var sproc, sprocCPU []float64
	for range e.o.nodeReps {
		if err := e.canceled(); err != nil {
			return err
		}
		d, rss, c, err := e.sweepProcess(stale)
		if err != nil {
			return err
		}
		sproc, sprocCPU = append(sproc, d), append(sprocCPU, c)
		staleCell.MaxRSSKiB = max(staleCell.MaxRSSKiB, rss)
	}
	staleCell.Process, staleCell.ProcessCPU = summarize(sproc), summarize(sprocCPU)
	res.Node = []SweepCell{liveCell, staleCell}
	return nil
}
