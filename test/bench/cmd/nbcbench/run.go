package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"
)

func (e *Env) runAll() (*Results, error) {
	res := &Results{
		Started: time.Now().UTC().Format(time.RFC3339),
		Machine: machine(e.o.bin),
		Command: e.o.command,
		Driver:  "libcni (in-process, as cnitool/Nomad/containerd use it) for ADD/CHECK/DEL; exec for gc, host-local DEL and VERSION",
		LoadAvg: loadAvg(),
	}
	want := func(name string) bool {
		return e.o.only == "" || slices.Contains(strings.Split(e.o.only, ","), name)
	}
	if err := e.setup(); err != nil {
		return res, err
	}
	note, err := evictBinaries(e.o.bin, e.o.minimal, e.o.floor)
	if err != nil {
		return res, fmt.Errorf("evicting the binaries from the page cache: %w", err)
	}
	res.PageCache = note
	steps := []struct {
		name string
		fn   func(*Results) error
	}{
		{"latency", e.benchLatency},
		{"restore", e.benchRestore},
		{"concurrent", e.benchConcurrent},
		{"cold", e.benchCold},
		{"release", e.benchRelease},
		{"node", e.benchNode},
		{"sweep", e.benchSweep},
	}
	for _, s := range steps {
		if !want(s.name) {
			continue
		}
		t0 := time.Now()
		fmt.Fprintf(os.Stderr, "nbcbench: %s ...\n", s.name)
		if err := s.fn(res); err != nil {
			return res, fmt.Errorf("%s: %w", s.name, err)
		}
		fmt.Fprintf(os.Stderr, "nbcbench: %s done in %.1fs (load %s)\n", s.name, time.Since(t0).Seconds(), loadAvg())
	}
	res.LoadAvg += " → " + loadAvg()
	return res, nil
}

func machine(bin string) map[string]string {
	m := map[string]string{
		"cores": fmt.Sprint(runtime.NumCPU()),
		"go":    runtime.Version(),
	}
	if raw, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.SplitSeq(string(raw), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m["cpu"] = strings.TrimSpace(v)
				break
			}
		}
	}
	if raw, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m["kernel"] = strings.TrimSpace(string(raw))
	}
	if raw, err := os.ReadFile("/proc/meminfo"); err == nil {
		for line := range strings.SplitSeq(string(raw), "\n") {
			if strings.HasPrefix(line, "MemTotal:") {
				m["memory"] = strings.Join(strings.Fields(line)[1:], " ")
			}
		}
	}
	if out, err := exec.Command(filepath.Join(bin, pluginType), "--version").Output(); err == nil {
		m["plugin"] = strings.TrimSpace(string(out))
	}
	if out, err := exec.Command("iptables", "--version").Output(); err == nil {
		m["iptables"] = strings.TrimSpace(string(out))
	}
	return m
}

func loadAvg() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(raw))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
