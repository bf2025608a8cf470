package main

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/containernetworking/cni/libcni"
)

// RestoreCell is one restore size: N allocations restored, one CHECK each,
// one after another, total wall and CPU time of the N CHECKs, A against B
// and, with --floor, the plugin's added cost against the floor's (C).
type RestoreCell struct {
	N     int        `json:"n"`
	Pair  Pair       `json:"pair"`
	Floor *AddedCost `json:"floor,omitempty"`
	// OwnTime is, with --floor and perf, the own time of each CHECK's
	// plugin process (A) against the floor plugin's (C), traced as in the
	// latency cell (owntrace.go), the i-th CHECK of a rep paired with the
	// i-th of C's: a restore's sweeps are in A's.
	OwnTime *Pair `json:"ownTime,omitempty"`
	// OwnTimeNote says why OwnTime is missing, when it is.
	OwnTimeNote string `json:"ownTimeNote,omitempty"`
}

// benchRestore measures what a Nomad client restart costs: it sends one
// CHECK per restored allocation, one after another, and every CHECK of the
// plugin may sweep the whole network. For each size N and rep, N
// containers are added to every variant (untimed, a few at a time), the
// CHECKs are timed, and everything is deleted again (untimed).
//
// The CHECKs run in rounds: round i CHECKs the i-th container of each
// variant, the order rotating by one each round (A B C, B C A, C A B).
// Each network still gets its N CHECKs in order, one after another, as
// the restart sends them; a variant's total is the sum of its N. A
// process's own time on this VM drifts by a quarter within seconds (the
// floor plugin's median went 2.8 → 3.7 ms within one run of 50 identical
// CHECKs, and 2.9 → 4.2 ms between runs), so CHECKs of A and C taken a
// whole restore apart compared the machine's drift as much as the plugins;
// a round takes them a few tens of ms apart. A's CHECKs are spread over
// about three times as long as alone, so its checkSweepInterval lets
// through as many more sweeps: the interleaving does not flatter A.
func (e *Env) benchRestore(res *Results) error {
	sizes, reps, err := restorePlan(e.o.restoreSizes, e.o.restoreReps)
	if err != nil {
		return err
	}
	cfg := e.cni()
	vs := e.variants()
	var trace *schedTrace
	traceNote := ""
	if e.c != nil {
		if trace, err = startSchedTrace(e.o.work); err != nil {
			traceNote = "not traced: " + err.Error()
		} else {
			defer func() {
				if trace != nil {
					trace.stop()
				}
			}()
		}
	}
	// checks[i][j]: the CHECK windows of size i's reps of vs[j].
	checks := make([][][][2]int64, len(sizes))
	for i, n := range sizes {
		// wall[j], cpu[j]: the reps of vs[j].
		wall, cpu := make([][]float64, len(vs)), make([][]float64, len(vs))
		checks[i] = make([][][2]int64, len(vs))
		for r := range reps[i] {
			if err := e.canceled(); err != nil {
				return err
			}
			got, err := e.restoreOnce(cfg, vs, n, fmt.Sprintf("rs%d-%d", n, r))
			if err != nil {
				return err
			}
			for j, g := range got {
				wall[j], cpu[j] = append(wall[j], g.wall), append(cpu[j], g.cpu)
				checks[i][j] = append(checks[i][j], g.windows...)
			}
		}
		name := fmt.Sprintf("restore N=%d", n)
		cell := RestoreCell{N: n, Pair: makePair(name, wall[0], wall[1]).withCPU(cpu[0], cpu[1]), OwnTimeNote: traceNote}
		if e.c != nil {
			f := makeAddedCost(name, cell.Pair, makePair(name+" (floor)", wall[2], wall[1]).withCPU(cpu[2], cpu[1]))
			cell.Floor = &f
		}
		res.Restore = append(res.Restore, cell)
	}
	if trace != nil {
		e.restoreOwnTime(res.Restore[len(res.Restore)-len(sizes):], trace, checks)
		trace = nil
	}
	return nil
}

// restoreOwnTime stops the trace and sets each cell's own time per CHECK
// from it, or says why it has none; checks is per cell, per variant (A, B,
// C), the CHECK windows.
func (e *Env) restoreOwnTime(cells []RestoreCell, trace *schedTrace, checks [][][][2]int64) {
	err := trace.stop()
	var procs []tracedProcess
	if err == nil {
		procs, err = trace.processes()
	}
	for i := range cells {
		c := &cells[i]
		if err != nil {
			c.OwnTimeNote = "not traced: " + err.Error()
			continue
		}
		a, fl := checks[i][0], checks[i][2]
		ownA := ownTimes(procs, filepath.Join(e.o.bin, pluginType), delegateType, a)
		ownC := ownTimes(procs, e.o.floor, delegateType, fl)
		var pa, pc []float64
		for w := range min(len(a), len(fl)) {
			x, okA := ownA[w]
			y, okC := ownC[w]
			if okA && okC {
				pa, pc = append(pa, x.ms), append(pc, y.ms)
			}
		}
		if len(pa) == 0 {
			c.OwnTimeNote = "not traced: no CHECK had exactly one plugin process on each side"
			continue
		}
		own := makePair(fmt.Sprintf("restore N=%d own time per CHECK", c.N), pa, pc)
		own.Interval = ratioInterval(pa, pc)
		c.OwnTime = &own
	}
}

// restoreTimes is one variant's restore: its N CHECKs' total wall and CPU
// time in ms, and each CHECK's window (CLOCK_MONOTONIC ns, for the
// own-time trace), in the order of its containers.
type restoreTimes struct {
	wall, cpu float64
	windows   [][2]int64
}

// restoreOnce adds n containers to each of vs, CHECKs them in rotating
// rounds (see benchRestore) and deletes them; it returns each variant's
// times, in the order of vs.
//
// Each variant's setup, each CHECK and each variant's teardown gets
// cmdTimeout: three networks of 250 take longer than that all together.
func (e *Env) restoreOnce(cfg *libcni.CNIConfig, vs []*variant, n int, tag string) ([]restoreTimes, error) {
	lists := make([]*libcni.NetworkConfigList, len(vs))
	atts := make([][]*attachment, len(vs))
	defer func() {
		for j, list := range lists {
			if list == nil {
				continue
			}
			ctx, cancel := cniContext()
			eachParallel(atts[j], func(at *attachment) error { return cfg.DelNetworkList(ctx, list, at.rt) })
			cancel()
			for _, at := range atts[j] {
				delNetns(at.nsName)
			}
		}
	}()
	for j, v := range vs {
		list, err := v.list()
		if err != nil {
			return nil, err
		}
		lists[j] = list
		for i := range n {
			at, err := e.newAttachment(v, fmt.Sprintf("%s-%03d", tag, i))
			if err != nil {
				return nil, err
			}
			atts[j] = append(atts[j], at)
		}
		// The first ADD runs alone: firewall creates its chains with a
		// check then a create, and under iptables-nft a lost race fails
		// with exit status 4 ("File exists"), which its EnsureChain does
		// not take for "already there" (it expects 1). A --only restore
		// run has no earlier ADD that made them.
		ctx, cancel := cniContext()
		add := func(at *attachment) error { _, err := cfg.AddNetworkList(ctx, list, at.rt); return err }
		err = add(atts[j][0])
		if err == nil {
			err = eachParallel(atts[j][1:], add)
		}
		cancel()
		if err != nil {
			return nil, fmt.Errorf("%s restore ADD: %w", v.label, err)
		}
	}
	got := make([]restoreTimes, len(vs))
	for j := range got {
		got[j].windows = make([][2]int64, 0, n)
	}
	for i := range n {
		for k := range vs {
			j := (i + k) % len(vs)
			at := atts[j][i]
			ctx, cancel := cniContext()
			c0, start := childrenCPU(), monoNow()
			err := cfg.CheckNetworkList(ctx, lists[j], at.rt)
			end, c1 := monoNow(), childrenCPU()
			cancel()
			if err != nil {
				return nil, fmt.Errorf("%s restore CHECK %s: %w", vs[j].label, at.rt.ContainerID, err)
			}
			got[j].windows = append(got[j].windows, [2]int64{start, end})
			got[j].wall += float64(end-start) / 1e6
			got[j].cpu += ms(c1 - c0)
		}
	}
	return got, nil
}

// eachParallel runs fn over atts, four at a time (setup and teardown, not
// timed), and returns the first error.
func eachParallel(atts []*attachment, fn func(*attachment) error) error {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	sem := make(chan struct{}, 4)
	for _, at := range atts {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := fn(at); err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return first
}

// restorePlan parses --restore-sizes and --restore-reps ("50,250" and
// "3,1"): a /24 holds at most 253 containers.
func restorePlan(sizes, reps string) ([]int, []int, error) {
	var ns, rs []int
	for _, s := range strings.Split(sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 || n > 253 {
			return nil, nil, fmt.Errorf("--restore-sizes: %q is not a count of 1-253 containers", s)
		}
		ns = append(ns, n)
	}
	for _, s := range strings.Split(reps, ",") {
		r, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || r < 1 {
			return nil, nil, fmt.Errorf("--restore-reps: %q is not a positive count", s)
		}
		rs = append(rs, r)
	}
	if len(rs) != len(ns) {
		return nil, nil, fmt.Errorf("--restore-reps needs one count per size (%d sizes)", len(ns))
	}
	return ns, rs, nil
}
