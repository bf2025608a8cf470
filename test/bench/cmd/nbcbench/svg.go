package main

import (
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// The pictures of BENCHMARKS.md, written as plain SVG from a run's
// results: the verb ratios against bare bridge (and, with the floor
// plugin, each verb's added cost against the floor's), and the sweep's
// cost and peak RSS against the lease count.

func cmdSVG(args []string) error {
	fs := flag.NewFlagSet("svg", flag.ExitOnError)
	in := fs.String("in", "", "results JSON written by run")
	dir := fs.String("out-dir", ".", "write bench-verbs.svg and bench-sweep.svg here")
	fs.Parse(args)
	res, err := readJSON(*in)
	if err != nil {
		return err
	}
	for name, draw := range map[string]func(io.Writer, *Results){"bench-verbs.svg": drawVerbs, "bench-sweep.svg": drawSweep} {
		f, err := os.Create(filepath.Join(*dir, name))
		if err != nil {
			return err
		}
		draw(f, res)
		if err := f.Close(); err != nil {
			return err
		}
	}
	return nil
}

type svg struct {
	w io.Writer
}

func (s svg) p(format string, args ...any) { fmt.Fprintf(s.w, format+"\n", args...) }

func (s svg) text(x, y float64, anchor, size, body string) {
	s.p(`<text x="%.1f" y="%.1f" text-anchor="%s" font-size="%s" font-family="sans-serif">%s</text>`, x, y, anchor, size, escapeXML(body))
}

func escapeXML(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}

// drawVerbs: one bar per verb, the ratio of medians ours/bare (wall and
// CPU), with the line at 1.0 (bare bridge); below it, when the run had the
// floor plugin, drawAdded.
func drawVerbs(w io.Writer, r *Results) {
	var bars []Pair
	bars = append(bars, r.Latency...)
	if r.ColdStart != nil {
		c := *r.ColdStart
		c.Name = "cold start"
		bars = append(bars, c)
	}
	const width, height, left, top, bottom = 720.0, 300.0, 60.0, 40.0, 60.0
	const addedHeight = 280.0
	total := height
	if len(r.LatencyFloor) > 0 {
		total += addedHeight
	}
	if len(r.OwnTime) > 0 {
		total += addedHeight
	}
	maxR := 1.2
	for _, b := range bars {
		maxR = math.Max(maxR, b.Ratio*1.05)
		if b.CPU != nil {
			maxR = math.Max(maxR, b.CPU.Ratio*1.05)
		}
	}
	plotH := height - top - bottom
	y := func(v float64) float64 { return top + plotH*(1-v/maxR) }
	s := svg{w}
	s.p(`<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f">`, width, total, width, total)
	s.p(`<rect width="100%%" height="100%%" fill="white"/>`)
	s.text(width/2, 20, "middle", "14", "nomad-bridge-cni / bare bridge, medians (blue: wall, grey: CPU) — "+r.Started)
	for _, v := range []float64{0, 0.25, 0.5, 0.75, 1, 1.25} {
		if v > maxR {
			break
		}
		s.p(`<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#ddd"/>`, left, width-10, y(v), y(v))
		s.text(left-6, y(v)+4, "end", "11", fmt.Sprintf("%.2f", v))
	}
	s.p(`<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="black" stroke-dasharray="4 3"/>`, left, width-10, y(1), y(1))
	slot := (width - left - 10) / float64(max(len(bars), 1))
	for i, b := range bars {
		x := left + slot*float64(i) + slot*0.15
		bw := slot * 0.35
		s.p(`<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#3b73b9"/>`, x, y(b.Ratio), bw, y(0)-y(b.Ratio))
		s.text(x+bw/2, y(b.Ratio)-4, "middle", "10", fmt.Sprintf("%.3f", b.Ratio))
		if b.CPU != nil {
			s.p(`<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#999"/>`, x+bw, y(b.CPU.Ratio), bw, y(0)-y(b.CPU.Ratio))
		}
		s.text(x+bw, height-bottom+16, "middle", "11", b.Name)
	}
	y0 := height
	if len(r.LatencyFloor) > 0 {
		bars := make([]floorBar, 0, len(r.LatencyFloor))
		for _, c := range r.LatencyFloor {
			bars = append(bars, floorBar{c.Name, c.PluginMs, c.FloorMs, fmt.Sprintf("%s (CPU %s)", timesRatio(c.Ratio), timesRatio(c.CPURatio))})
		}
		drawAgainstFloor(s, bars, y0, width, addedHeight,
			"added cost over bare bridge per verb, median ms (wall)",
			fmt.Sprintf("blue: plugin (A−B), orange: floor plugin (C−B), dashed: %.1f × C−B (the goal); above: (A−B)/(C−B), wall (CPU)", floorGoal))
		y0 += addedHeight
	}
	if len(r.OwnTime) > 0 {
		bars := make([]floorBar, 0, len(r.OwnTime))
		for _, o := range r.OwnTime {
			bars = append(bars, floorBar{o.Name, o.A.Median, o.B.Median, fmt.Sprintf("×%.2f (pairs ×%.2f)", o.Ratio, o.PairedRatio)})
		}
		drawAgainstFloor(s, bars, y0, width, addedHeight,
			"own time per verb (perf-traced, exec to exit minus the delegate), median ms",
			fmt.Sprintf("blue: plugin (A), orange: floor plugin (C), dashed: %.1f × C (the goal); above: A/C of the medians (median of the per-round A/C)", floorGoal))
	}
	s.p(`</svg>`)
}

// floorBar is one verb of a band drawn against the floor plugin: the
// plugin's ms, the floor plugin's ms, and the label above them.
type floorBar struct {
	name          string
	plugin, floor float64
	label         string
}

// drawAgainstFloor draws, in the band from y0 down by height, per verb
// the plugin's ms next to the floor plugin's, with the goal (floorGoal ×
// the floor's) dashed across the plugin's bar and each bar's label above.
// Values below zero (an added cost lost in noise) go below the zero line.
func drawAgainstFloor(s svg, bars []floorBar, y0, width, height float64, title, legend string) {
	const left, titleH, bottom = 60.0, 44.0, 40.0
	lo, hi := 0.0, 0.0
	for _, c := range bars {
		for _, v := range []float64{c.plugin, c.floor, floorGoal * c.floor} {
			lo, hi = math.Min(lo, v), math.Max(hi, v)
		}
	}
	s.text(width/2, y0+16, "middle", "13", title)
	s.text(width/2, y0+32, "middle", "11", legend)
	if hi == lo {
		return
	}
	// Room above the bars for the ratio labels.
	span := hi - lo
	hi += span * 0.15
	if lo < 0 {
		lo -= span * 0.05
	}
	top, base := y0+titleH+10, y0+height-bottom
	y := func(v float64) float64 { return top + (base-top)*(hi-v)/(hi-lo) }
	ticks := []float64{0, hi / 2, hi}
	if lo < 0 {
		ticks = append(ticks, lo)
	}
	for _, v := range ticks {
		s.p(`<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#ddd"/>`, left, width-10, y(v), y(v))
		s.text(left-6, y(v)+4, "end", "11", fmt.Sprintf("%.1f", v))
	}
	s.p(`<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="black"/>`, left, width-10, y(0), y(0))
	bar := func(x, bw, v float64, fill string) {
		s.p(`<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>`, x, math.Min(y(0), y(v)), bw, math.Abs(y(0)-y(v)), fill)
	}
	slot := (width - left - 10) / float64(len(bars))
	for i, c := range bars {
		x := left + slot*float64(i) + slot*0.2
		bw := slot * 0.3
		bar(x, bw, c.plugin, "#3b73b9")
		bar(x+bw, bw, c.floor, "#e08a2c")
		g := y(floorGoal * c.floor)
		s.p(`<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="black" stroke-width="1.5" stroke-dasharray="4 3"/>`, x-3, x+bw+3, g, g)
		s.text(x+bw, y(math.Max(math.Max(c.plugin, c.floor), math.Max(0, floorGoal*c.floor)))-6, "middle", "10", c.label)
		s.text(x+bw, base+16, "middle", "11", c.name)
	}
}

// drawSweep: in-process sweep cost per lease, and the gc process's peak
// RSS, against the lease count (log scale), one line per stale share.
func drawSweep(w io.Writer, r *Results) {
	const width, height = 720.0, 320.0
	s := svg{w}
	s.p(`<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f">`, width, height, width, height)
	s.p(`<rect width="100%%" height="100%%" fill="white"/>`)
	s.text(width/2, 20, "middle", "14", "sweep vs lease count — "+r.Started)
	panel := func(x0 float64, title string, value func(c SweepCell) float64) {
		const top, bottom, pw = 50.0, 50.0, 300.0
		ph := height - top - bottom
		var leases []int
		byStale := map[int][]SweepCell{}
		maxV := 0.0
		for _, c := range r.Sweep {
			byStale[c.Stale] = append(byStale[c.Stale], c)
			if !containsInt(leases, c.Leases) {
				leases = append(leases, c.Leases)
			}
			maxV = math.Max(maxV, value(c))
		}
		sort.Ints(leases)
		if len(leases) == 0 || maxV == 0 {
			return
		}
		maxV *= 1.1
		lx := func(n int) float64 {
			lo, hi := math.Log(float64(leases[0])), math.Log(float64(leases[len(leases)-1]))
			if hi == lo {
				return x0 + pw/2
			}
			return x0 + pw*(math.Log(float64(n))-lo)/(hi-lo)
		}
		ly := func(v float64) float64 { return top + ph*(1-v/maxV) }
		s.text(x0+pw/2, top-10, "middle", "12", title)
		s.p(`<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="black"/>`, x0, x0+pw, ly(0), ly(0))
		s.p(`<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="black"/>`, x0, x0, top, ly(0))
		for _, n := range leases {
			s.text(lx(n), ly(0)+16, "middle", "11", fmt.Sprint(n))
		}
		for _, v := range []float64{0, maxV / 2, maxV} {
			s.text(x0-4, ly(v)+4, "end", "10", fmt.Sprintf("%.0f", v))
		}
		colors := map[int]string{0: "#2e8b57", 50: "#d2691e", 100: "#b22222"}
		var stales []int
		for st := range byStale {
			stales = append(stales, st)
		}
		sort.Ints(stales)
		for i, st := range stales {
			cells := byStale[st]
			sort.Slice(cells, func(a, b int) bool { return cells[a].Leases < cells[b].Leases })
			var pts []string
			for _, c := range cells {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", lx(c.Leases), ly(value(c))))
			}
			color := colors[st]
			if color == "" {
				color = "#555"
			}
			s.p(`<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`, color, strings.Join(pts, " "))
			s.text(x0+pw-4, top+14*float64(i+1), "end", "10", fmt.Sprintf("%d%% stale", st))
			s.p(`<rect x="%.1f" y="%.1f" width="10" height="3" fill="%s"/>`, x0+pw-80, top+14*float64(i+1)-4, color)
		}
	}
	panel(60, "in-process sweep, µs per lease", func(c SweepCell) float64 { return c.InProc.Median * 1000 / float64(c.Leases) })
	panel(400, "gc process peak RSS, MiB", func(c SweepCell) float64 { return float64(c.MaxRSSKiB) / 1024 })
	s.text(width/2, height-10, "middle", "11", "leases on the network (log scale)")
	s.p(`</svg>`)
}

func containsInt(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
