package main

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

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
// plugin may sweep the whole network. For each size N, in interleaved reps
// A B A B (A B C with --floor): N containers are added (untimed, a few at
// a time), the N CHECKs are timed back to back, and everything is deleted
// again (untimed).
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
			for j, v := range vs {
				if err := e.canceled(); err != nil {
					return err
				}
				w, c, windows, err := e.restoreOnce(cfg, v, n, fmt.Sprintf("rs%d-%d", n, r))
				if err != nil {
					return err
				}
				wall[j], cpu[j] = append(wall[j], w), append(cpu[j], c)
				checks[i][j] = append(checks[i][j], windows...)
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

// restoreOnce adds n containers of v, times n CHECKs in a row, and deletes
// them; it returns the CHECKs' total wall and CPU time in ms and each
// CHECK's window (CLOCK_MONOTONIC ns, for the own-time trace).
func (e *Env) restoreOnce(cfg *libcni.CNIConfig, v *variant, n int, tag string) (float64, float64, [][2]int64, error) {
	list, err := v.list()
	if err != nil {
		return 0, 0, nil, err
	}
	atts := make([]*attachment, n)
	for i := range atts {
		if atts[i], err = e.newAttachment(v, fmt.Sprintf("%s-%03d", tag, i)); err != nil {
			return 0, 0, nil, err
		}
	}
	ctx, cancel := cniContext()
	defer cancel()
	defer func() {
		eachParallel(atts, func(at *attachment) error { return cfg.DelNetworkList(ctx, list, at.rt) })
		for _, at := range atts {
			delNetns(at.nsName)
		}
	}()
	if err := eachParallel(atts, func(at *attachment) error { _, err := cfg.AddNetworkList(ctx, list, at.rt); return err }); err != nil {
		return 0, 0, nil, fmt.Errorf("%s restore ADD: %w", v.label, err)
	}
	windows := make([][2]int64, 0, n)
	c0, t0 := childrenCPU(), time.Now()
	for _, at := range atts {
		start := monoNow()
		if err := cfg.CheckNetworkList(ctx, list, at.rt); err != nil {
			return 0, 0, nil, fmt.Errorf("%s restore CHECK %s: %w", v.label, at.rt.ContainerID, err)
		}
		windows = append(windows, [2]int64{start, monoNow()})
	}
	return ms(time.Since(t0)), ms(childrenCPU() - c0), windows, nil
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
