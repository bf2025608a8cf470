package main

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestJudge(t *testing.T) {
	r := func(v float64) *float64 { return &v }
	for _, c := range []struct {
		name  string
		ratio *float64
		iv    *[2]float64
		want  verdict
	}{
		{"interval under the goal", r(1.1), &[2]float64{1.0, 1.25}, met},
		{"interval over the goal", r(1.5), &[2]float64{1.35, 1.7}, missed},
		{"interval holds the goal", r(1.2), &[2]float64{1.0, 1.4}, unresolved},
		{"point under, interval open", r(1.2), &[2]float64{1.0, math.Inf(1)}, unresolved},
		{"no ratio", nil, &[2]float64{1.0, 1.1}, unresolved},
		{"no interval, point under", r(1.2), nil, met},
		{"no interval, point over", r(1.4), nil, missed},
	} {
		if got := judge(c.ratio, c.iv, 1.3); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// rounds of a chain whose verbs take base ms plus noise shared by the
// round's A, B and C (what the machine did meanwhile) plus noise of each.
func rounds(n int, shared, own float64) (a, b, c []float64) {
	rng := rand.New(rand.NewPCG(7, 7))
	for range n {
		s := rng.NormFloat64() * shared
		b = append(b, 100+s+rng.NormFloat64()*own)
		c = append(c, 110+s+rng.NormFloat64()*own) // the floor adds 10
		a = append(a, 111+s+rng.NormFloat64()*own) // the plugin 11: ×1.1
	}
	return a, b, c
}

func TestAddedCostInterval(t *testing.T) {
	// Quiet rounds: the interval is narrow around ×1.1 and under 1.3.
	a, b, c := rounds(40, 20, 0.5)
	iv := addedCostInterval(a, b, c)
	if iv == nil || iv[0] > 1.1 || iv[1] < 1.1 || iv[1] > 1.3 {
		t.Fatalf("quiet rounds: %v, want an interval around ×1.1 under ×1.3", iv)
	}
	if judge(new(1.1), iv, 1.3) != met {
		t.Errorf("quiet rounds: not met")
	}
	// Each verb's own spread far above the floor's 10 ms: the run cannot
	// tell ×1.1 from ×1.3.
	a, b, c = rounds(40, 20, 15)
	iv = addedCostInterval(a, b, c)
	if iv == nil || iv[0] > 1.1 || iv[1] <= 1.3 {
		t.Fatalf("noisy rounds: %v, want an interval that holds ×1.3", iv)
	}
	if judge(new(1.1), iv, 1.3) != unresolved {
		t.Errorf("noisy rounds: judged, want not resolved")
	}
	if iv := addedCostInterval(a[:1], b[:1], c[:1]); iv != nil {
		t.Errorf("one round: %v, want no interval", iv)
	}
}

func TestRatioInterval(t *testing.T) {
	var a, c []float64
	for i := range 40 {
		c = append(c, 3+float64(i%5)*0.01)
		a = append(a, 1.5*c[i])
	}
	iv := ratioInterval(a, c)
	if iv == nil || math.Abs(iv[0]-1.5) > 0.02 || math.Abs(iv[1]-1.5) > 0.02 {
		t.Fatalf("%v, want ×1.5 both ends", iv)
	}
	if judge(new(1.5), iv, 1.3) != missed {
		t.Errorf("×1.5: not missed")
	}
}

// A floor lost in the noise leaves resamples without a ratio; the run's
// results must still be written (a NaN or an infinity is not JSON), and the
// open end read back as open.
func TestOpenIntervalIsWrittenAndReadBack(t *testing.T) {
	a, b, c := rounds(40, 20, 15)
	for i := range c {
		c[i] -= 10 // the floor adds nothing: C−B is as often below zero as above
	}
	f := AddedCost{Name: "DEL", Interval: addedCostInterval(a, b, c)}
	if f.Interval == nil || intervalText(f.Interval)[len(intervalText(f.Interval))-len("∞"):] != "∞" {
		t.Fatalf("interval %v (%s), want an open upper end", f.Interval, intervalText(f.Interval))
	}
	path := t.TempDir() + "/results.json"
	if err := writeJSON(path, &Results{LatencyFloor: []AddedCost{f}}); err != nil {
		t.Fatalf("write: %v", err)
	}
	r, err := readJSON(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := r.LatencyFloor[0].Interval; got == nil || intervalText(got) != intervalText(f.Interval) {
		t.Errorf("read back %v, want %v", got, f.Interval)
	}
}
