package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
)

// Target is one benchmark goal, judged against a run.
type Target struct {
	What     string
	Measured string
	Met      bool
	// Unresolved is a goal this run's spread cannot judge either way.
	Unresolved bool
	Margin     string
}

// setVerdict sets t's Met and Unresolved from v.
func (t *Target) setVerdict(v verdict) {
	t.Met, t.Unresolved = v == met, v == unresolved
}

func (r *Results) cell(leases, stale int) *SweepCell {
	for i := range r.Sweep {
		if r.Sweep[i].Leases == leases && r.Sweep[i].Stale == stale {
			return &r.Sweep[i]
		}
	}
	return nil
}

func (r *Results) targets() []Target {
	var out []Target
	// What the plugin does on top of bridge's chain: CHECK may sweep.
	for _, p := range r.Latency {
		goal := latencyGoal
		t := Target{What: fmt.Sprintf("%s latency ratio ≤ %.2f of bare bridge", p.Name, goal), Measured: fmt.Sprintf("%.3f (CPU %.3f)", p.Ratio, p.cpu().Ratio), Met: p.Ratio <= goal}
		t.Margin = fmt.Sprintf("%+.1f%% vs bridge", (p.Ratio-1)*100)
		out = append(out, t)
	}
	// What the plugin adds against what one more exec of a do-nothing
	// delegating plugin adds (the floor of any wrapper): the rest is the
	// plugin's own work. Per verb; the sum is in the table. A floor not
	// above zero was lost in the noise: nothing is judged against it.
	for _, f := range r.LatencyFloor {
		if !slices.Contains(latencyVerbs[:3], f.Name) {
			continue
		}
		goal := floorGoal * f.FloorMs
		t := Target{
			What:     fmt.Sprintf("%s: added cost ≤ %.1f× the floor plugin's (C−B)", f.Name, floorGoal),
			Measured: fmt.Sprintf("A−B %+.1f ms, C−B %+.1f ms: %s (CPU %+.1f, %+.1f ms: %s)", f.PluginMs, f.FloorMs, timesRatio(f.Ratio), f.PluginCPUMs, f.FloorCPUMs, timesRatio(f.CPURatio)),
		}
		if f.Interval != nil {
			t.Measured += fmt.Sprintf("; 90 %% interval %s", intervalText(f.Interval))
		}
		t.setVerdict(judge(f.Ratio, f.Interval, floorGoal))
		t.Margin = fmt.Sprintf("%+.1f ms vs the goal (%.1f ms)", f.PluginMs-goal, goal)
		switch {
		case f.Ratio == nil:
			t.Margin = "not judged: C−B ≤ 0, more pairs needed"
		case t.Unresolved:
			t.Margin += "; the interval holds the goal: bridge's spread hides it (see own time)"
		}
		out = append(out, t)
	}
	for _, c := range r.Restore {
		t := Target{What: fmt.Sprintf("restore of %d allocations (%d CHECKs in a row) ≤ %.2f of bare bridge", c.N, c.N, latencyGoal), Measured: fmt.Sprintf("%.3f (CPU %.3f)", c.Pair.Ratio, c.Pair.cpu().Ratio), Met: c.Pair.Ratio <= latencyGoal}
		t.Margin = fmt.Sprintf("%+.1f%% vs bridge", (c.Pair.Ratio-1)*100)
		out = append(out, t)
	}
	if t, ok := restoreLinearTarget(r.Restore); ok {
		out = append(out, t)
	}
	if len(r.Node) == 2 {
		live, stale := r.Node[0], r.Node[1]
		// Against one bare CHECK of Nomad's chain in the same run: what
		// a CHECK that sweeps a full bridge costs over one that does not.
		if check := r.latency("CHECK"); check != nil && check.B.Median > 0 {
			goal := nodeSweepGoal * check.B.Median
			t := Target{What: fmt.Sprintf("CHECK-time sweep of %d live attachments with their NAT rules adds ≤ %.1f× one bare CHECK", live.Leases, nodeSweepGoal), Measured: fmt.Sprintf("%.1f ms, p90 %.1f (CPU %.1f ms) against a bare CHECK of %.1f ms: ×%.2f", live.InProc.Median, live.InProc.P90, live.InProcCPU.Median, check.B.Median, live.InProc.Median/check.B.Median), Met: live.InProc.Median <= goal}
			t.Margin = over(live.InProc.Median, goal, "ms")
			out = append(out, t)
		}
		t := Target{What: fmt.Sprintf("one gc releasing %d stale leases (a leaked /20) < 1 s", stale.Leases), Measured: fmt.Sprintf("%.0f ms, p90 %.0f (CPU %.0f ms)", stale.Process.Median, stale.Process.P90, stale.ProcessCPU.Median), Met: stale.Process.Median < 1000}
		t.Margin = over(stale.Process.Median, 1000, "ms")
		out = append(out, t)
		mib := float64(stale.MaxRSSKiB) / 1024
		t = Target{What: "peak RSS of that gc ≤ 16 MiB", Measured: fmt.Sprintf("%.1f MiB", mib), Met: mib <= 16}
		t.Margin = over(mib, 16, "MiB")
		out = append(out, t)
	}
	// Peak RSS, per lease count: the worst of its stale shares.
	var sizes []int
	worst := map[int]*SweepCell{}
	for i := range r.Sweep {
		c := &r.Sweep[i]
		if w, ok := worst[c.Leases]; !ok || c.MaxRSSKiB > w.MaxRSSKiB {
			if !ok {
				sizes = append(sizes, c.Leases)
			}
			worst[c.Leases] = c
		}
	}
	for _, n := range sizes {
		w := worst[n]
		mib := float64(w.MaxRSSKiB) / 1024
		t := Target{What: fmt.Sprintf("peak RSS of the sweep process ≤ 32 MiB, %d leases", n), Measured: fmt.Sprintf("%.1f MiB (worst: %d%% stale)", mib, w.Stale), Met: mib <= 32}
		t.Margin = over(mib, 32, "MiB")
		out = append(out, t)
	}
	if p := r.Release; p != nil && p.A.Median > 0 {
		x := p.B.Median / p.A.Median
		t := Target{What: "release of 254 stale leases ≥ 50× faster than 254 host-local DEL execs", Measured: fmt.Sprintf("%.1f× (CPU %.1f×)", x, p.cpu().B.Median/max(p.cpu().A.Median, 1e-9)), Met: x >= 50}
		if t.Met {
			t.Margin = fmt.Sprintf("%.1f× the goal", x/50)
		} else {
			t.Margin = fmt.Sprintf("%.0f%% of the goal", x/50*100)
		}
		out = append(out, t)
	}
	if f := r.ColdFloorPlugin; f != nil {
		t := Target{What: fmt.Sprintf("cold start (VERSION, exec to exit) ≤ %.2f× the do-nothing plugin (floor)", latencyGoal), Measured: fmt.Sprintf("%.3f (CPU %.3f)", f.Ratio, f.cpu().Ratio), Met: f.Ratio <= latencyGoal}
		t.Margin = fmt.Sprintf("%+.1f%% vs the goal", (f.Ratio/latencyGoal-1)*100)
		out = append(out, t)
	}
	for _, pct := range []int{0, 50, 100} {
		a, b := r.cell(4094, pct), r.cell(65534, pct)
		if a == nil || b == nil || a.InProc.Median == 0 {
			continue
		}
		pa := a.InProc.Median / 4094
		pb := b.InProc.Median / 65534
		g := pb / pa
		t := Target{
			What:     fmt.Sprintf("cost linear in lease count (%d%% stale): per-lease cost at 65534 within 1.5× of 4094", pct),
			Measured: fmt.Sprintf("%.1f → %.1f µs/lease (×%.2f)", pa*1000, pb*1000, g),
			Met:      g <= 1.5 && g >= 1/1.5,
		}
		t.Margin = fmt.Sprintf("×%.2f", g)
		out = append(out, t)
	}
	return out
}

// The bounds: what a verb of the whole chain may cost against bare
// bridge's chain (A/B), and a cold start against the floor plugin's;
// what the plugin adds per verb (A−B) as a multiple of what the floor
// plugin adds (C−B); and what a sweep of a full bridge adds to a CHECK, as
// a multiple of one bare CHECK.
const (
	latencyGoal   = 1.10
	floorGoal     = 2.0
	nodeSweepGoal = 1.5
)

// latency is the latency pair of the verb name, if measured.
func (r *Results) latency(name string) *Pair {
	for i := range r.Latency {
		if r.Latency[i].Name == name {
			return &r.Latency[i]
		}
	}
	return nil
}

// fmtRatio prints an AddedCost ratio, "n/a" where the floor was not above
// zero.
func fmtRatio(r *float64) string {
	if r == nil {
		return "n/a"
	}
	return fmt.Sprintf("%.2f", *r)
}

// timesRatio is fmtRatio for prose: "×1.27" or "ratio n/a".
func timesRatio(r *float64) string {
	if r == nil {
		return "ratio n/a"
	}
	return fmt.Sprintf("×%.2f", *r)
}

func over(v, goal float64, unit string) string {
	if v <= goal {
		return fmt.Sprintf("%.1f %s under (%.0f%% of the goal)", goal-v, unit, v/goal*100)
	}
	return fmt.Sprintf("%.1f %s over (%.1f× the goal)", v-goal, unit, v/goal)
}

func printTable(w io.Writer, r *Results) { renderMarkdown(w, r) }

// renderMarkdown prints the generated block of BENCHMARKS.md.
func renderMarkdown(w io.Writer, r *Results) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	m := r.Machine
	p("Run %s: `%s`, %.0f s in total; load average (1/5/15 min) %s.", r.Started, r.Command, r.Elapsed, r.LoadAvg)
	if r.PageCache != "" {
		p("")
		p("Page cache: %s.", r.PageCache)
	}
	p("")
	p("![verb ratios against bare bridge](docs/bench-verbs.svg)")
	p("")
	p("![sweep cost and peak RSS against the lease count](docs/bench-sweep.svg)")
	p("")
	p("| machine | |")
	p("|---|---|")
	for _, k := range []string{"cpu", "cores", "memory", "kernel", "go", "iptables", "plugin"} {
		if m[k] != "" {
			p("| %s | %s |", k, m[k])
		}
	}
	p("")
	if len(r.Latency) > 0 {
		floor := len(r.LatencyFloor) == len(r.Latency)
		head := "| verb | A median | A p90 | B median | B p90 | A/B (medians) | A/B (median of pairs) | CPU A | CPU B | CPU A/B |"
		rule := "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
		if floor {
			p("**1. Latency, Nomad's chain (loopback, bridge, firewall, portmap), A = `nomad-bridge-cni`, B = bare `bridge`, C = `bridge` behind the floor plugin** — %d rounds A B C, fresh namespace per container, driven through libcni; ms.", r.Pairs)
			head += " C median | A−B | C−B | (A−B)/(C−B) | CPU C | CPU A−B | CPU C−B | CPU (A−B)/(C−B) |"
			rule += "---:|---:|---:|---:|---:|---:|---:|---:|"
		} else {
			p("**1. Latency, Nomad's chain (loopback, bridge, firewall, portmap), A = `nomad-bridge-cni`, B = bare `bridge`** — %d pairs A B A B, fresh namespace per container, driven through libcni; ms.", r.Pairs)
		}
		p("")
		p("%s", head)
		p("%s", rule)
		for i, x := range r.Latency {
			c := x.cpu()
			row := fmt.Sprintf("| %s | %.1f | %.1f | %.1f | %.1f | %.3f | %.3f | %.1f | %.1f | %.3f |", x.Name, x.A.Median, x.A.P90, x.B.Median, x.B.P90, x.Ratio, x.PairedRatio, c.A.Median, c.B.Median, c.Ratio)
			if floor {
				f := r.LatencyFloor[i]
				row += fmt.Sprintf(" %.1f | %+.1f | %+.1f | %s | %.1f | %+.1f | %+.1f | %s |", f.Floor.A.Median, f.PluginMs, f.FloorMs, fmtRatio(f.Ratio), f.Floor.cpu().A.Median, f.PluginCPUMs, f.FloorCPUMs, fmtRatio(f.CPURatio))
			}
			p("%s", row)
		}
		p("")
		p("CPU = median user + system time of every process the verb ran (plugins and their iptables), from RUSAGE_CHILDREN.")
		if floor {
			p("C is B's chain with `nbc-floor` (test/bench/cmd/floor, a plugin that only passes its stdin to bridge) in bridge's place: C−B is one more exec of a do-nothing delegating plugin, the floor of what any wrapper adds. A−B and C−B are differences of medians; (A−B)/(C−B) is n/a where C−B ≤ 0.")
		}
		p("")
	}
	if len(r.OwnTime) > 0 {
		p("**1c. Own time per verb** — the same rounds as 1, traced with perf's sched tracepoints: each `nomad-bridge-cni` process of A and `nbc-floor` process of C from its exec to its exit, minus the lifetime of the delegate it ran (bridge and what bridge runs; processes the plugin runs itself, such as a sweep's iptables listings, count as its own); ms.")
		p("")
		p("| verb | A: plugin median | p90 | C: floor plugin median | p90 | A/C (medians) | A/C (median of pairs) | rounds | processes run besides bridge, all rounds |")
		p("|---|---:|---:|---:|---:|---:|---:|---:|---|")
		for i, o := range r.OwnTime {
			others := "n/a"
			if i < len(r.OwnTimeOthers) {
				others = r.OwnTimeOthers[i]
			}
			p("| %s | %.2f | %.2f | %.2f | %.2f | %.3f | %.3f | %d | %s |", o.Name, o.A.Median, o.A.P90, o.B.Median, o.B.P90, o.Ratio, o.PairedRatio, o.A.N, others)
		}
		p("")
	} else if r.OwnTimeNote != "" {
		p("**1c. Own time per verb** — %s", r.OwnTimeNote)
		p("")
	}
	if len(r.Restore) > 0 {
		floor := r.Restore[0].Floor != nil
		order := "A B, then B A"
		if floor {
			order = "A B C, then B C A, then C A B (C = B's chain with the floor plugin in bridge's place, see 1)"
		}
		p("**1b. Restore** — N containers added to each network, then one CHECK each, in order, as a Nomad client restart sends them (A = `nomad-bridge-cni` with its default checkSweepInterval, B = bare `bridge`); total ms of each network's N CHECKs. The networks' CHECKs are interleaved one by one, the i-th of each in round i, the order rotating: %s.", order)
		p("")
		head := "| N | reps | A total | B total | A/B | A ms per CHECK | B ms per CHECK | CPU A/B |"
		rule := "|---:|---:|---:|---:|---:|---:|---:|---:|"
		if floor {
			head += " C total | (A−B)/(C−B) | CPU (A−B)/(C−B) |"
			rule += "---:|---:|---:|"
		}
		p("%s", head)
		p("%s", rule)
		for _, c := range r.Restore {
			x, n := c.Pair, float64(c.N)
			row := fmt.Sprintf("| %d | %d | %.0f | %.0f | %.3f | %.1f | %.1f | %.3f |", c.N, x.A.N, x.A.Median, x.B.Median, x.Ratio, x.A.Median/n, x.B.Median/n, x.cpu().Ratio)
			if f := c.Floor; floor && f != nil {
				row += fmt.Sprintf(" %.0f | %s | %s |", f.Floor.A.Median, fmtRatio(f.Ratio), fmtRatio(f.CPURatio))
			}
			p("%s", row)
		}
		p("")
		writeRestoreOwnTime(p, r.Restore)
	}
	if len(r.Sweep) > 0 {
		p("**2. Sweep cost vs lease count** — synthetic host-local directories on tmpfs (real lease files, lock, records; live records name one real netns). *in-process*: `reclaim.Sweep` as CHECK runs it, median; *gc process*: `nomad-bridge-cni gc --network N`, wall, median; an empty network's gc takes %.1f ms (process start); peak RSS is wait4's maxrss of the gc process (and of any iptables it ran), measured through test/bench/cmd/execrss, whose floor (/bin/true) is %.1f MiB.", r.GCEmpty.Median, float64(r.RSSFloorKiB)/1024)
		p("")
		p("| leases | stale | in-process ms (p90) | µs/lease | in-process CPU ms | CPU µs/lease | gc process ms | gc CPU ms | peak RSS MiB | reps |")
		p("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
		for _, c := range r.Sweep {
			n := float64(c.Leases)
			p("| %d | %d%% | %.1f (%.1f) | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %d |", c.Leases, c.Stale, c.InProc.Median, c.InProc.P90, c.InProc.Median*1000/n,
				c.InProcCPU.Median, c.InProcCPU.Median*1000/n, c.Process.Median, c.ProcessCPU.Median, float64(c.MaxRSSKiB)/1024, c.InProc.N)
		}
		p("")
	}
	if len(r.Node) == 2 {
		live, stale := r.Node[0], r.Node[1]
		p("**2b. At a node's size** — bridge gives a bridge at most 1024 ports, so a CHECK sweeps at most %d live attachments; a /20 leaked for a while is %d stale leases for one gc. Same synthetic directories as above. The live network's containers each have bridge's ipMasq rules (%d iptables rules in all, in a network namespace of the cell's own), as on a node: the sweep lists them; in-process and gc %d reps interleaved. The %d stale leases have no rules (see below why); that network is rebuilt for each of its %d reps.", live.Leases, stale.Leases, live.NATRules, live.InProc.N, stale.Leases, stale.Process.N)
		p("")
		p("| network | in-process ms (p90) | in-process CPU ms | gc process ms (p90) | gc CPU ms | peak RSS MiB |")
		p("|---|---:|---:|---:|---:|---:|")
		p("| %d live | %.1f (%.1f) | %.1f | %.1f (%.1f) | %.1f | %.1f |", live.Leases, live.InProc.Median, live.InProc.P90, live.InProcCPU.Median, live.Process.Median, live.Process.P90, live.ProcessCPU.Median, float64(live.MaxRSSKiB)/1024)
		p("| %d stale | | | %.1f (%.1f) | %.1f | %.1f |", stale.Leases, stale.Process.Median, stale.Process.P90, stale.ProcessCPU.Median, float64(stale.MaxRSSKiB)/1024)
		p("")
	}
	if x := r.Release; x != nil {
		p("**3. Releasing 254 stale leases** — A: one `nomad-bridge-cni gc` (leases, NAT lookup, records), B: 254 `host-local` DEL execs; %d reps interleaved; ms.", x.A.N)
		p("")
		p("| | A: gc | B: 254 DELs | B/A |")
		p("|---|---:|---:|---:|")
		c := x.cpu()
		p("| median | %.1f | %.1f | %.1f× |", x.A.Median, x.B.Median, x.B.Median/x.A.Median)
		p("| p90 | %.1f | %.1f | |", x.A.P90, x.B.P90)
		p("| CPU median | %.1f | %.1f | %.1f× |", c.A.Median, c.B.Median, c.B.Median/max(c.A.Median, 1e-9))
		p("")
	}
	if x := r.Throughput; x != nil {
		p("**4. Concurrent ADD** — %d containers started at once through Nomad's chain, %d rounds A B A B; containers/s.", r.Parallel, x.A.N)
		p("")
		p("| | A: plugin | B: bridge | A/B |")
		p("|---|---:|---:|---:|")
		c := x.cpu()
		p("| median | %.1f | %.1f | %.3f |", x.A.Median, x.B.Median, x.Ratio)
		p("| min | %.1f | %.1f | |", x.A.Min, x.B.Min)
		p("| CPU ms per container | %.1f | %.1f | %.3f |", c.A.Median, c.B.Median, c.Ratio)
		p("")
	}
	if x := r.ColdStart; x != nil {
		writeCold(p, r)
	}
	if t := r.targets(); len(t) > 0 {
		p("**Targets**")
		p("")
		p("| target | measured | | margin |")
		p("|---|---|---|---|")
		for _, x := range t {
			v := "met"
			switch {
			case x.Unresolved:
				v = "not resolved"
			case !x.Met:
				v = "**missed**"
			}
			p("| %s | %s | %s | %s |", x.What, x.Measured, v, x.Margin)
		}
		p("")
	}
	if len(r.Warnings) > 0 {
		p("Warnings: %s", strings.Join(r.Warnings, "; "))
	}
}

func (p Pair) cpu() Pair {
	if p.CPU == nil {
		return Pair{}
	}
	return *p.CPU
}

// writeRestoreOwnTime prints each restore's traced own time per CHECK, A's
// plugin against C's floor plugin, or why it was not traced.
func writeRestoreOwnTime(p func(string, ...any), cells []RestoreCell) {
	var rows, notes []string
	for _, c := range cells {
		if o := c.OwnTime; o != nil {
			iv := "n/a"
			if o.Interval != nil {
				iv = intervalText(o.Interval)
			}
			rows = append(rows, fmt.Sprintf("| %d | %.2f | %.2f | %.2f | %.2f | %.3f | %s | %d |", c.N, o.A.Median, o.A.P90, o.B.Median, o.B.P90, o.Ratio, iv, o.A.N))
		} else if c.OwnTimeNote != "" {
			notes = append(notes, fmt.Sprintf("N=%d: %s", c.N, c.OwnTimeNote))
		}
	}
	if len(rows) > 0 {
		p("Own time per CHECK of the restores above, traced as in 1c (A's and C's CHECKs of the same round paired; A's include the sweeps its checkSweepInterval lets through); ms.")
		p("")
		p("| N | A: plugin median | p90 | C: floor plugin median | p90 | A/C (medians) | 90 %% interval | CHECKs |")
		p("|---:|---:|---:|---:|---:|---:|---|---:|")
		for _, r := range rows {
			p("%s", r)
		}
		p("")
	}
	if len(notes) > 0 {
		p("Own time per CHECK of the restores: %s.", strings.Join(notes, "; "))
		p("")
	}
}

// writeCold prints the cold-start table: the plugin against bridge and,
// when measured, against a minimal Go binary and the floor plugin, with
// each one's page faults and package init.
func writeCold(p func(string, ...any), r *Results) {
	x := r.ColdStart
	// One column per binary after the plugin (A), each a Pair of A against
	// it from the same interleaved rounds, lettered B, C, ... in run order.
	type column struct {
		name string
		vs   Pair
	}
	cols := []column{{"bridge", *x}}
	var about []string
	if f := r.ColdFloor; f != nil {
		cols = append(cols, column{"minimal Go", *f})
		about = append(about, fmt.Sprintf("%c is test/bench/cmd/minimal, a static Go binary that only prints the answer (the floor of any Go program)", 'A'+len(cols)))
	}
	if f := r.ColdFloorPlugin; f != nil {
		cols = append(cols, column{"nbc-floor", *f})
		about = append(about, fmt.Sprintf("%c is test/bench/cmd/floor, the do-nothing delegating plugin of 1 (the floor of any plugin on the CNI library)", 'A'+len(cols)))
	}
	letters := "A"
	for i := range cols {
		letters += fmt.Sprintf(" %c", 'B'+i)
	}
	intro := fmt.Sprintf("**5. Cold start** — `CNI_COMMAND=VERSION`, exec to exit, %d rounds %s interleaved", x.A.N, letters)
	for _, a := range about {
		intro += "; " + a
	}
	intro += "; ms."
	traced := len(r.Startup) == 1+len(cols)
	if traced {
		intro += fmt.Sprintf(" Package init from %d runs each with `GODEBUG=inittrace=1` (sums over all packages, medians).", tracedRuns)
	}
	p("%s", intro)
	p("")
	head, rule := "| | A: nomad-bridge-cni |", "|---|---:|"
	for i, c := range cols {
		head += fmt.Sprintf(" %c: %s |", 'B'+i, c.name)
		rule += "---:|"
	}
	for i := range cols {
		head += fmt.Sprintf(" A/%c |", 'B'+i)
		rule += "---:|"
	}
	p("%s", head)
	p("%s", rule)
	// row prints one line: A's value, each column's, then A's ratio to each
	// (blank where ratio is nil).
	row := func(label, format string, a float64, others []float64, ratio func(i int) float64) {
		line := fmt.Sprintf("| %s | "+format+" |", label, a)
		for _, v := range others {
			line += fmt.Sprintf(" "+format+" |", v)
		}
		for i := range others {
			if ratio == nil {
				line += " |"
			} else {
				line += fmt.Sprintf(" %.3f |", ratio(i))
			}
		}
		p("%s", line)
	}
	each := func(f func(c column) float64) []float64 {
		var out []float64
		for _, c := range cols {
			out = append(out, f(c))
		}
		return out
	}
	row("median", "%.2f", x.A.Median, each(func(c column) float64 { return c.vs.B.Median }), func(i int) float64 { return cols[i].vs.Ratio })
	row("p90", "%.2f", x.A.P90, each(func(c column) float64 { return c.vs.B.P90 }), nil)
	row("CPU median", "%.2f", x.cpu().A.Median, each(func(c column) float64 { return c.vs.cpu().B.Median }), func(i int) float64 { return cols[i].vs.cpu().Ratio })
	if traced {
		s := r.Startup
		stat := func(f func(StartupStat) float64) []float64 {
			var out []float64
			for _, t := range s[1:] {
				out = append(out, f(t))
			}
			return out
		}
		faults := stat(func(t StartupStat) float64 { return t.PageFaults })
		row("page faults", "%.0f", s[0].PageFaults, faults, func(i int) float64 { return s[0].PageFaults / faults[i] })
		row("packages initialised", "%.0f", float64(s[0].Packages), stat(func(t StartupStat) float64 { return float64(t.Packages) }), nil)
		row("init clock, ms", "%.3f", s[0].InitMs, stat(func(t StartupStat) float64 { return t.InitMs }), nil)
		row("init allocations", "%.0f", s[0].InitAllocs, stat(func(t StartupStat) float64 { return t.InitAllocs }), nil)
		row("init KiB", "%.1f", s[0].InitKiB, stat(func(t StartupStat) float64 { return t.InitKiB }), nil)
	}
	p("")
}

// restoreLinearTarget is "a restore grows linearly in N": the plugin's
// per-CHECK cost at the largest N within 1.5× of the smallest. With the
// trace it is the plugin's own time per CHECK, where a sweep per CHECK
// (N² in all) would show: 1.4 ms at 50 allocations, 7 ms at 250 (see
// "Restore" in BENCHMARKS.md). Without it, it is the whole chain's per
// CHECK, which also grows with the rules of every network's N containers
// (the networks are restored side by side) and hides a quadratic sweep in
// bridge's tens of ms.
func restoreLinearTarget(cells []RestoreCell) (Target, bool) {
	n := len(cells)
	if n < 2 || cells[0].Pair.A.Median <= 0 {
		return Target{}, false
	}
	lo, hi := cells[0], cells[n-1]
	what := fmt.Sprintf("restore linear in N: own time per CHECK at N=%d within 1.5× of N=%d (perf-traced)", hi.N, lo.N)
	a, b := 0.0, 0.0
	if lo.OwnTime != nil && hi.OwnTime != nil && lo.OwnTime.A.Median > 0 {
		a, b = lo.OwnTime.A.Median, hi.OwnTime.A.Median
	} else {
		what = fmt.Sprintf("restore linear in N: per-CHECK cost of the whole chain at N=%d within 1.5× of N=%d (not traced)", hi.N, lo.N)
		a, b = lo.Pair.A.Median/float64(lo.N), hi.Pair.A.Median/float64(hi.N)
	}
	g := b / a
	t := Target{What: what, Measured: fmt.Sprintf("%.2f → %.2f ms per CHECK (×%.2f)", a, b, g), Met: g <= 1.5}
	t.Margin = fmt.Sprintf("×%.2f", g)
	return t, true
}
