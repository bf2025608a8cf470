package main

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/cni/libcni"
)

// The CNI verbs are driven in-process through libcni, the library cnitool,
// Nomad (through go-cni), containerd and CRI-O all use: the same plugin
// execs as `cnitool add|check|del`, without timing cnitool's own start-up
// (which would be the same for A and B and only dilute the ratio). The
// floor plugin's directory comes after --bin: every other plugin, and the
// floor's delegate, is found in the first directory, as without it.
func (e *Env) cni() *libcni.CNIConfig {
	path := []string{e.o.bin}
	if e.o.floor != "" {
		path = append(path, filepath.Dir(e.o.floor))
	}
	return libcni.NewCNIConfigWithCacheDir(path, filepath.Join(e.o.work, "libcni-cache"), nil)
}

// variants are the sides the latency and restore benchmarks interleave:
// A B, or A B C with --floor.
func (e *Env) variants() []*variant {
	if e.c == nil {
		return []*variant{e.a, e.b}
	}
	return []*variant{e.a, e.b, e.c}
}

func (v *variant) list() (*libcni.NetworkConfigList, error) {
	return libcni.NetworkConfFromBytes(v.confList)
}

func cniContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), cmdTimeout)
}

// attachment is one container of a benchmark: namespace + runtime conf.
type attachment struct {
	nsName string
	rt     *libcni.RuntimeConf
}

func (e *Env) newAttachment(v *variant, tag string) (*attachment, error) {
	name, path, err := e.addNetns(v.label)
	if err != nil {
		return nil, err
	}
	return &attachment{nsName: name, rt: &libcni.RuntimeConf{
		ContainerID: e.containerID(v, tag),
		NetNS:       path,
		IfName:      ifName,
	}}, nil
}

// verbTimes is one container's ADD, CHECK and DEL, wall and CPU, in ms.
type verbTimes struct {
	add, check, del          float64
	addCPU, checkCPU, delCPU float64
	// marks are CLOCK_MONOTONIC (ns) before ADD, CHECK and DEL and after
	// DEL: the windows in which each verb's processes started.
	marks [4]int64
}

func (e *Env) addCheckDel(cfg *libcni.CNIConfig, v *variant, tag string) (verbTimes, error) {
	var t verbTimes
	list, err := v.list()
	if err != nil {
		return t, err
	}
	a, err := e.newAttachment(v, tag)
	if err != nil {
		return t, err
	}
	defer delNetns(a.nsName)
	ctx, cancel := cniContext()
	defer cancel()

	// CPU: the plugins' (and their iptables') user + system time, from
	// RUSAGE_CHILDREN: libcni waits for every plugin it runs.
	t.marks[0] = monoNow()
	c0, t0 := childrenCPU(), time.Now()
	if _, err := cfg.AddNetworkList(ctx, list, a.rt); err != nil {
		return t, fmt.Errorf("%s ADD: %w", v.label, err)
	}
	c1, t1 := childrenCPU(), time.Now()
	t.marks[1] = monoNow()
	if err := cfg.CheckNetworkList(ctx, list, a.rt); err != nil {
		cfg.DelNetworkList(ctx, list, a.rt)
		return t, fmt.Errorf("%s CHECK: %w", v.label, err)
	}
	c2, t2 := childrenCPU(), time.Now()
	t.marks[2] = monoNow()
	if err := cfg.DelNetworkList(ctx, list, a.rt); err != nil {
		return t, fmt.Errorf("%s DEL: %w", v.label, err)
	}
	c3, t3 := childrenCPU(), time.Now()
	t.marks[3] = monoNow()
	t.add, t.check, t.del = ms(t1.Sub(t0)), ms(t2.Sub(t1)), ms(t3.Sub(t2))
	t.addCPU, t.checkCPU, t.delCPU = ms(c1-c0), ms(c2-c1), ms(c3-c2)
	return t, nil
}

// latencyVerbs are the rows of the latency benchmark: each verb, then the
// three of one container summed.
var latencyVerbs = [4]string{"ADD", "CHECK", "DEL", "ADD+CHECK+DEL"}

// latencySeries is one variant's samples per row of latencyVerbs, in ms.
type latencySeries struct {
	wall, cpu [4][]float64
}

func (s *latencySeries) add(t verbTimes) {
	for k, x := range [4]float64{t.add, t.check, t.del, t.add + t.check + t.del} {
		s.wall[k] = append(s.wall[k], x)
	}
	for k, x := range [4]float64{t.addCPU, t.checkCPU, t.delCPU, t.addCPU + t.checkCPU + t.delCPU} {
		s.cpu[k] = append(s.cpu[k], x)
	}
}

// benchLatency runs warm-up pairs, then `pairs` pairs A B A B ... (with
// --floor, triples A B C A B C ...), each container in a fresh namespace.
func (e *Env) benchLatency(res *Results) error {
	cfg := e.cni()
	vs := e.variants()
	var trace *schedTrace
	if e.c != nil {
		var err error
		if trace, err = startSchedTrace(e.o.work); err != nil {
			res.OwnTimeNote = "not traced: " + err.Error()
		} else {
			defer func() {
				if trace != nil {
					trace.stop()
				}
			}()
		}
	}
	// Warm-up: the first ADD of a network creates its bridge, the first
	// plugin ADD writes the migration marker, the page cache fills.
	for i := range 2 {
		for _, v := range vs {
			if _, err := e.addCheckDel(cfg, v, fmt.Sprintf("warm%d", i)); err != nil {
				return err
			}
		}
	}
	series := make([]latencySeries, len(vs))
	windows := make([][][2]int64, len(vs)) // per variant: a window per round and verb
	for i := range e.o.pairs {
		if err := e.canceled(); err != nil {
			return err
		}
		for j, v := range vs {
			t, err := e.addCheckDel(cfg, v, fmt.Sprintf("lat%03d", i))
			if err != nil {
				return err
			}
			series[j].add(t)
			for k := range 3 {
				windows[j] = append(windows[j], [2]int64{t.marks[k], t.marks[k+1]})
			}
		}
	}
	res.Pairs = e.o.pairs
	a, b := series[0], series[1]
	for k, verb := range latencyVerbs {
		ab := makePair(verb, a.wall[k], b.wall[k]).withCPU(a.cpu[k], b.cpu[k])
		res.Latency = append(res.Latency, ab)
		if e.c != nil {
			c := series[2]
			cb := makePair(verb+" (floor)", c.wall[k], b.wall[k]).withCPU(c.cpu[k], b.cpu[k])
			added := makeAddedCost(verb, ab, cb)
			added.Interval = addedCostInterval(a.wall[k], b.wall[k], c.wall[k])
			res.LatencyFloor = append(res.LatencyFloor, added)
		}
	}
	if trace != nil {
		err := trace.stop()
		if err == nil {
			err = e.ownTime(res, trace, windows[0], windows[2])
		}
		trace = nil
		if err != nil {
			res.OwnTimeNote = "not traced: " + err.Error()
		}
	}
	return nil
}

// ownTime reports, per verb, the own time of A's plugin processes against
// C's floor plugin processes (see owntrace.go), round by round.
func (e *Env) ownTime(res *Results, trace *schedTrace, a, c [][2]int64) error {
	procs, err := trace.processes()
	if err != nil {
		return err
	}
	ownA := ownTimes(procs, filepath.Join(e.o.bin, pluginType), delegateType, a)
	ownC := ownTimes(procs, e.o.floor, delegateType, c)
	for k, verb := range latencyVerbs[:3] {
		var pa, pc []float64
		others := map[string]int{}
		for w := k; w < len(a) && w < len(c); w += 3 {
			x, okA := ownA[w]
			y, okC := ownC[w]
			if okA && okC {
				pa, pc = append(pa, x.ms), append(pc, y.ms)
				for _, o := range x.others {
					others["A: "+o]++
				}
				for _, o := range y.others {
					others["C: "+o]++
				}
			}
		}
		res.OwnTimeOthers = append(res.OwnTimeOthers, countsText(others))
		if len(pa) == 0 {
			return fmt.Errorf("no round of %s has exactly one %s and one %s process", verb, filepath.Join(e.o.bin, pluginType), e.o.floor)
		}
		own := makePair(verb, pa, pc)
		own.Interval = ratioInterval(pa, pc)
		res.OwnTime = append(res.OwnTime, own)
	}
	return nil
}

// benchConcurrent starts `parallel` containers at once through each chain,
// rounds A B A B ..., and reports containers per second.
func (e *Env) benchConcurrent(res *Results) error {
	cfg := e.cni()
	n := e.o.parallel
	var a, b, ca, cb []float64
	for r := range e.o.rounds {
		for _, v := range []*variant{e.a, e.b} {
			if err := e.canceled(); err != nil {
				return err
			}
			list, err := v.list()
			if err != nil {
				return err
			}
			atts := make([]*attachment, n)
			for i := range atts {
				if atts[i], err = e.newAttachment(v, fmt.Sprintf("par%d-%02d", r, i)); err != nil {
					return err
				}
			}
			ctx, cancel := cniContext()
			errs := make([]error, n)
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i, at := range atts {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					_, errs[i] = cfg.AddNetworkList(ctx, list, at.rt)
				}()
			}
			c0, t0 := childrenCPU(), time.Now()
			close(start)
			wg.Wait()
			elapsed := time.Since(t0)
			cpu := ms(childrenCPU()-c0) / float64(n)
			// Tear down (untimed), in parallel too.
			for _, at := range atts {
				wg.Add(1)
				go func() {
					defer wg.Done()
					cfg.DelNetworkList(ctx, list, at.rt)
				}()
			}
			wg.Wait()
			cancel()
			for _, at := range atts {
				delNetns(at.nsName)
			}
			for i, err := range errs {
				if err != nil {
					return fmt.Errorf("%s parallel ADD %d: %w", v.label, i, err)
				}
			}
			rate := float64(n) / elapsed.Seconds()
			if v == e.a {
				a, ca = append(a, rate), append(ca, cpu)
			} else {
				b, cb = append(b, rate), append(cb, cpu)
			}
		}
	}
	p := makePair("containers/s", a, b).withCPU(ca, cb)
	res.Parallel = n
	res.Throughput = &p
	return nil
}

// countsText is "name ×n, ..." in name order, or "none".
func countsText(counts map[string]int) string {
	if len(counts) == 0 {
		return "none"
	}
	var parts []string
	for _, name := range slices.Sorted(maps.Keys(counts)) {
		parts = append(parts, fmt.Sprintf("%s ×%d", name, counts[name]))
	}
	return strings.Join(parts, ", ")
}
