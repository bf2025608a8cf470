package main

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
)

// A ratio of medians from 40 rounds is a point, and the floor goal is judged
// on a difference of about a millisecond: on this kind of VM the rounds'
// spread can be wider than that. Each per-verb goal against the floor
// plugin is therefore judged on the ratio's bootstrap interval: met when the
// whole interval is under the goal, missed when the whole of it is over,
// and "not resolved" when the run cannot tell.

// bootstrapResamples is how many resamples an interval is drawn from.
const bootstrapResamples = 2000

// openEnd stands for a ratio without bound (a resample whose floor is not
// above zero): an interval end at or above it is open. Infinity would do
// the same in the sort but is not JSON, and interpolating between two
// infinities is NaN.
const openEnd = 1e9

// bootstrapInterval is the 90 % percentile interval of stat over resamples
// of the rounds 0..n-1, drawn with replacement; stat gets the rounds drawn
// (a round's A, B and C go together, as they ran together). The seed is
// fixed so that a report renders the same from the same samples.
func bootstrapInterval(n int, stat func(rounds []int) float64) [2]float64 {
	rng := rand.New(rand.NewPCG(23, 1))
	rounds := make([]int, n)
	vals := make([]float64, bootstrapResamples)
	for i := range vals {
		for j := range rounds {
			rounds[j] = rng.IntN(n)
		}
		vals[i] = min(stat(rounds), openEnd)
	}
	slices.Sort(vals)
	return [2]float64{quantile(vals, 0.05), quantile(vals, 0.95)}
}

// pick is xs at rounds.
func pick(xs []float64, rounds []int) []float64 {
	out := make([]float64, len(rounds))
	for i, r := range rounds {
		out[i] = xs[r]
	}
	return out
}

// addedCostInterval is the interval of (median(A)−median(B)) /
// (median(C)−median(B)) over rounds of a, b, c; a resample whose floor is
// not above zero has no ratio and counts as +Inf (it cannot show a pass).
func addedCostInterval(a, b, c []float64) *[2]float64 {
	n := min(len(a), len(b), len(c))
	if n < 2 {
		return nil
	}
	iv := bootstrapInterval(n, func(rounds []int) float64 {
		mb := median(pick(b, rounds))
		floor := median(pick(c, rounds)) - mb
		if floor <= 0 {
			return math.Inf(1)
		}
		return (median(pick(a, rounds)) - mb) / floor
	})
	return &iv
}

// ratioInterval is the interval of median(A)/median(C) over paired rounds.
func ratioInterval(a, c []float64) *[2]float64 {
	n := min(len(a), len(c))
	if n < 2 {
		return nil
	}
	iv := bootstrapInterval(n, func(rounds []int) float64 {
		mc := median(pick(c, rounds))
		if mc <= 0 {
			return math.Inf(1)
		}
		return median(pick(a, rounds)) / mc
	})
	return &iv
}

// verdict judges an interval against an upper goal.
type verdict int

const (
	unresolved verdict = iota
	met
	missed
)

// judge judges ratio against an upper goal by its interval iv; results
// written before intervals were computed have none and are judged on the
// point, as they were then. No ratio (a floor lost in the noise) is not
// resolved.
func judge(ratio *float64, iv *[2]float64, goal float64) verdict {
	switch {
	case ratio == nil:
		return unresolved
	case iv == nil && *ratio <= goal:
		return met
	case iv == nil:
		return missed
	case iv[1] <= goal:
		return met
	case iv[0] > goal:
		return missed
	}
	return unresolved
}

// intervalText prints an interval of ratios, "×1.10–×1.25"; an open end
// is "∞".
func intervalText(iv *[2]float64) string {
	end := func(v float64) string {
		if v >= openEnd {
			return "∞"
		}
		return fmt.Sprintf("×%.2f", v)
	}
	return end(iv[0]) + "–" + end(iv[1])
}
