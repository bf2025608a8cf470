package main

import (
	"encoding/json"
	"math"
	"os"
	"slices"
	"time"
)

// Stat summarises samples in milliseconds.
type Stat struct {
	N      int     `json:"n"`
	Median float64 `json:"median"`
	P90    float64 `json:"p90"`
	Min    float64 `json:"min"`
}

func ms(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }

func summarize(samples []float64) Stat {
	if len(samples) == 0 {
		return Stat{}
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	return Stat{N: len(s), Median: quantile(s, 0.5), P90: quantile(s, 0.9), Min: s[0]}
}

// quantile interpolates linearly between the closest ranks of sorted s.
func quantile(s []float64, q float64) float64 {
	if len(s) == 1 {
		return s[0]
	}
	pos := q * float64(len(s)-1)
	lo := int(math.Floor(pos))
	hi := int(math.Ceil(pos))
	return s[lo] + (s[hi]-s[lo])*(pos-float64(lo))
}

func median(samples []float64) float64 { return summarize(samples).Median }

// Pair is one A/B comparison.
type Pair struct {
	Name string `json:"name"`
	A    Stat   `json:"a"`
	B    Stat   `json:"b"`
	// Ratio is median(A)/median(B).
	Ratio float64 `json:"ratio"`
	// PairedRatio is the median of the per-pair ratios A_i/B_i.
	PairedRatio float64 `json:"pairedRatio"`
	// CPU is the same comparison in CPU time (user + system of every
	// process involved), which a busy machine distorts far less than
	// wall time.
	CPU *Pair `json:"cpu,omitempty"`
	// Interval is the 90 % bootstrap interval of Ratio over paired
	// rounds, where a goal is judged on it (interval.go).
	Interval *[2]float64 `json:"interval,omitempty"`
}

func (p Pair) withCPU(a, b []float64) Pair {
	c := makePair(p.Name+" (CPU)", a, b)
	p.CPU = &c
	return p
}

func makePair(name string, a, b []float64) Pair {
	p := Pair{Name: name, A: summarize(a), B: summarize(b)}
	if p.B.Median > 0 {
		p.Ratio = p.A.Median / p.B.Median
	}
	var r []float64
	for i := range min(len(a), len(b)) {
		if b[i] > 0 {
			r = append(r, a[i]/b[i])
		}
	}
	p.PairedRatio = median(r)
	return p
}

// AddedCost is what the plugin adds over bare bridge (A−B) against what the
// floor adds (C−B: bridge behind test/bench/cmd/floor, i.e. one more exec
// of a do-nothing delegating plugin), from the same interleaved runs, as
// differences of medians in ms: the floor is the least any plugin that
// delegates to bridge, written on the CNI library, can add.
type AddedCost struct {
	Name string `json:"name"`
	// Floor is C (in its A fields) against B.
	Floor       Pair    `json:"floor"`
	PluginMs    float64 `json:"pluginMs"`
	FloorMs     float64 `json:"floorMs"`
	PluginCPUMs float64 `json:"pluginCPUMs"`
	FloorCPUMs  float64 `json:"floorCPUMs"`
	// Ratio is PluginMs/FloorMs, CPURatio the same in CPU time; each is
	// absent when its floor is not above zero (lost in the noise of too
	// few samples), which no ratio describes.
	Ratio    *float64 `json:"ratio,omitempty"`
	CPURatio *float64 `json:"cpuRatio,omitempty"`
	// Interval is Ratio's 90 % bootstrap interval over the rounds
	// (interval.go).
	Interval *[2]float64 `json:"interval,omitempty"`
}

// makeAddedCost: ab is A against B, cb is C against B, over the same B.
func makeAddedCost(name string, ab, cb Pair) AddedCost {
	c := AddedCost{
		Name:        name,
		Floor:       cb,
		PluginMs:    ab.A.Median - ab.B.Median,
		FloorMs:     cb.A.Median - cb.B.Median,
		PluginCPUMs: ab.cpu().A.Median - ab.cpu().B.Median,
		FloorCPUMs:  cb.cpu().A.Median - cb.cpu().B.Median,
	}
	c.Ratio = ratioOver(c.PluginMs, c.FloorMs)
	c.CPURatio = ratioOver(c.PluginCPUMs, c.FloorCPUMs)
	return c
}

func ratioOver(v, floor float64) *float64 {
	if floor <= 0 {
		return nil
	}
	r := v / floor
	return &r
}

// SweepCell is one (lease count, stale share) cell of the sweep benchmark.
type SweepCell struct {
	Leases int `json:"leases"`
	Stale  int `json:"stalePercent"`
	// InProc is reclaim.Sweep timed inside this process (fresh Sweeper per
	// sweep, as in a CHECK process): what a CHECK adds.
	InProc    Stat `json:"inProcMs"`
	InProcCPU Stat `json:"inProcCPUMs"`
	// Process is `nomad-bridge-cni gc --network N` wall time, process
	// start included.
	Process    Stat `json:"processMs"`
	ProcessCPU Stat `json:"processCPUMs"`
	// MaxRSSKiB is the largest peak RSS of the gc process over the reps.
	MaxRSSKiB int64 `json:"maxRSSKiB"`
	// NATRules are the iptables rules the network's containers hold
	// (bridge's ipMasq: three each), swept with it (the node cell).
	NATRules int `json:"natRules,omitempty"`
}

// Results is everything one run measured.
type Results struct {
	Started string            `json:"started"`
	Machine map[string]string `json:"machine"`
	Command string            `json:"command"`
	Elapsed float64           `json:"elapsedSeconds"`
	Driver  string            `json:"driver"`
	// PageCache says how the binaries under test were put in the state
	// they have after a boot (evictBinaries).
	PageCache string `json:"pageCache,omitempty"`
	Latency   []Pair `json:"latency,omitempty"`
	Pairs     int    `json:"pairs,omitempty"`
	GCEmpty   Stat   `json:"gcEmptyMs"`
	// LatencyFloor is, per row of Latency, the plugin's added cost against
	// the floor plugin's (variant C, with --floor).
	LatencyFloor []AddedCost `json:"latencyFloor,omitempty"`
	// OwnTime is, per verb (ADD, CHECK, DEL) of the latency rounds, the
	// own time (exec to exit minus the delegate's lifetime, traced with
	// perf) of A's plugin process in A against the floor plugin's in C.
	OwnTime []Pair `json:"ownTime,omitempty"`
	// OwnTimeOthers is, per row of OwnTime, the processes A's plugin and
	// C's floor plugin ran besides the delegate over those rounds (their
	// time is in the own time), as "A: iptables ×3, ...", or "none".
	OwnTimeOthers []string `json:"ownTimeOthers,omitempty"`
	OwnTimeNote   string   `json:"ownTimeNote,omitempty"`
	// RSSFloorKiB is the peak RSS execrss reports for /bin/true: the most
	// of execrss's own RSS that can show in a measurement.
	RSSFloorKiB int64       `json:"rssFloorKiB"`
	Sweep       []SweepCell `json:"sweep,omitempty"`
	// Node is the sweep at a node's sizes (benchNode): 1023 live leases
	// (a CHECK's sweep), then 3000 stale ones (one gc).
	Node     []SweepCell `json:"node,omitempty"`
	Release  *Pair       `json:"release,omitempty"`
	Parallel int         `json:"parallel,omitempty"`
	// Throughput holds containers/s per round (A = plugin, B = bridge);
	// its Ratio is A/B throughput.
	Throughput *Pair `json:"throughput,omitempty"`
	ColdStart  *Pair `json:"coldStart,omitempty"`
	// Restore is N CHECKs back to back, as a Nomad client restart sends.
	Restore []RestoreCell `json:"restore,omitempty"`
	// ColdFloor compares the plugin's VERSION (A) with a minimal static Go
	// binary's (B), from the same interleaved runs as ColdStart.
	ColdFloor *Pair `json:"coldFloor,omitempty"`
	// ColdFloorPlugin compares the plugin's VERSION (A) with the floor
	// plugin's (B, test/bench/cmd/floor: a do-nothing delegating plugin on
	// the CNI library), from the same interleaved runs.
	ColdFloorPlugin *Pair `json:"coldFloorPlugin,omitempty"`
	// Startup is each cold-start binary's page faults and package init.
	Startup  []StartupStat `json:"startup,omitempty"`
	LoadAvg  string        `json:"loadAvg"`
	Warnings []string      `json:"warnings,omitempty"`
}

func writeJSON(path string, r *Results) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

func readJSON(path string) (*Results, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r Results
	return &r, json.Unmarshal(b, &r)
}
