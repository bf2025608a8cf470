package main

import (
	"strings"
	"testing"
)

// restoreCell is a restore of n allocations whose N CHECKs took total ms
// in all (A), and, when own > 0, whose plugin's traced own time per CHECK
// was own ms.
func restoreCell(n int, total, own float64) RestoreCell {
	c := RestoreCell{N: n, Pair: Pair{A: Stat{Median: total}, B: Stat{Median: total}}}
	if own > 0 {
		c.OwnTime = &Pair{A: Stat{Median: own}, B: Stat{Median: own}}
	}
	return c
}

func TestRestoreLinearTarget(t *testing.T) {
	cases := []struct {
		name     string
		cells    []RestoreCell
		met      bool
		whatHas  string
		measured string
	}{
		{
			// The chain per CHECK grew ×1.7 with the other networks'
			// rules; the plugin's own time did not.
			name:     "traced: own time flat, chain grew",
			cells:    []RestoreCell{restoreCell(50, 2140, 3.49), restoreCell(250, 18050, 3.72)},
			met:      true,
			whatHas:  "own time per CHECK",
			measured: "3.49 → 3.72 ms per CHECK (×1.07)",
		},
		{
			// A sweep per CHECK: 1.4 ms more at 50, 7 ms more at 250.
			name:     "traced: a sweep per CHECK",
			cells:    []RestoreCell{restoreCell(50, 2200, 4.9), restoreCell(250, 19800, 10.7)},
			met:      false,
			whatHas:  "own time per CHECK",
			measured: "4.90 → 10.70 ms per CHECK (×2.18)",
		},
		{
			name:     "not traced: the whole chain",
			cells:    []RestoreCell{restoreCell(50, 2000, 0), restoreCell(250, 12500, 0)},
			met:      true,
			whatHas:  "whole chain",
			measured: "40.00 → 50.00 ms per CHECK (×1.25)",
		},
		{
			name:     "one traced, one not: the whole chain",
			cells:    []RestoreCell{restoreCell(50, 2000, 3.5), restoreCell(250, 17500, 0)},
			met:      false,
			whatHas:  "whole chain",
			measured: "40.00 → 70.00 ms per CHECK (×1.75)",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, ok := restoreLinearTarget(c.cells)
			if !ok {
				t.Fatal("no target")
			}
			if got.Met != c.met || !strings.Contains(got.What, c.whatHas) || got.Measured != c.measured {
				t.Errorf("got %+v, want met %v, what with %q, measured %q", got, c.met, c.whatHas, c.measured)
			}
		})
	}
	if _, ok := restoreLinearTarget([]RestoreCell{restoreCell(50, 2000, 3.5)}); ok {
		t.Error("a target from one restore size")
	}
}
