package main

import (
	"bufio"
	"bytes"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// StartupStat is what one binary's start-up costs besides time: page
// faults (on a VM, each costs microseconds, and they are what a larger
// binary and its package init add) and the runtime's own account of
// package initialisation (GODEBUG=inittrace=1).
type StartupStat struct {
	Binary string `json:"binary"`
	// PageFaults is the median ru_minflt of a VERSION run.
	PageFaults float64 `json:"pageFaults"`
	// Packages is the number of packages the runtime initialised.
	Packages int `json:"packages"`
	// InitMs, InitAllocs and InitKiB are the medians over the traced runs
	// of the sums over all packages of inittrace's clock, allocations and
	// bytes.
	InitMs     float64 `json:"initMs"`
	InitAllocs float64 `json:"initAllocs"`
	InitKiB    float64 `json:"initKiB"`
}

// coldRun is one exec of a binary with CNI_COMMAND=VERSION.
type coldRun struct {
	wall, cpu, minflt float64
	stderr            string
}

// tracedRuns is how many GODEBUG=inittrace=1 runs each binary gets.
const tracedRuns = 21

// benchCold times the VERSION verb of our binary against bridge's, with
// --minimal against a minimal static Go binary (the floor any Go program
// pays) and with --floor against the floor plugin (what a plugin that only
// delegates, on the CNI library, pays), runs interleaved: exec to exit, i.e.
// process start-up and the runtime's init. Then it traces the package init
// of each.
func (e *Env) benchCold(res *Results) error {
	bins := []string{filepath.Join(e.o.bin, pluginType), filepath.Join(e.o.bin, "bridge")}
	// The index in bins of --minimal and --floor, when given.
	minimal, floor := -1, -1
	if e.o.minimal != "" {
		minimal = len(bins)
		bins = append(bins, e.o.minimal)
	}
	if e.o.floor != "" {
		floor = len(bins)
		bins = append(bins, e.o.floor)
	}
	// Warm the page cache with every binary.
	for range 3 {
		for _, b := range bins {
			if _, err := runVersion(b, false); err != nil {
				return err
			}
		}
	}
	wall := make([][]float64, len(bins))
	cpu := make([][]float64, len(bins))
	faults := make([][]float64, len(bins))
	// Each round runs the binaries in a new random order: in a fixed order
	// each binary would always follow the same one, and whatever one exec
	// leaves behind (the CPU's caches, the page cache's LRU, a thread still
	// exiting) would weigh on one side only.
	order := make([]int, len(bins))
	for i := range order {
		order[i] = i
	}
	for range e.o.coldPairs {
		if err := e.canceled(); err != nil {
			return err
		}
		rand.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		for _, i := range order {
			b := bins[i]
			r, err := runVersion(b, false)
			if err != nil {
				return err
			}
			wall[i], cpu[i], faults[i] = append(wall[i], r.wall), append(cpu[i], r.cpu), append(faults[i], r.minflt)
		}
	}
	p := makePair("VERSION", wall[0], wall[1]).withCPU(cpu[0], cpu[1])
	res.ColdStart = &p
	if minimal >= 0 {
		f := makePair("VERSION vs minimal Go binary", wall[0], wall[minimal]).withCPU(cpu[0], cpu[minimal])
		res.ColdFloor = &f
	}
	if floor >= 0 {
		f := makePair("VERSION vs floor plugin", wall[0], wall[floor]).withCPU(cpu[0], cpu[floor])
		res.ColdFloorPlugin = &f
	}
	traces := make([][]initTrace, len(bins))
	for range tracedRuns {
		if err := e.canceled(); err != nil {
			return err
		}
		for i, b := range bins {
			r, err := runVersion(b, true)
			if err != nil {
				return err
			}
			traces[i] = append(traces[i], parseInitTrace(r.stderr))
		}
	}
	for i, b := range bins {
		s := StartupStat{Binary: filepath.Base(b), PageFaults: median(faults[i])}
		var ms, allocs, kib []float64
		for _, t := range traces[i] {
			s.Packages = max(s.Packages, t.packages)
			ms, allocs, kib = append(ms, t.ms), append(allocs, float64(t.allocs)), append(kib, float64(t.bytes)/1024)
		}
		s.InitMs, s.InitAllocs, s.InitKiB = median(ms), median(allocs), median(kib)
		res.Startup = append(res.Startup, s)
	}
	return nil
}

// runVersion execs bin with CNI_COMMAND=VERSION and checks its answer.
func runVersion(bin string, trace bool) (coldRun, error) {
	cmd := exec.Command(bin)
	cmd.Env = cniEnv("CNI_COMMAND=VERSION")
	if trace {
		cmd.Env = append(cmd.Env, "GODEBUG=inittrace=1")
	}
	cmd.Stdin = strings.NewReader(`{"cniVersion":"1.0.0"}`)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	t0 := time.Now()
	err := cmd.Run()
	d := time.Since(t0)
	if err != nil || !strings.Contains(out.String(), "supportedVersions") {
		return coldRun{}, fmt.Errorf("%s VERSION: %v: %s%s", bin, err, out.String(), errOut.String())
	}
	r := coldRun{wall: ms(d), cpu: ms(procCPU(cmd.ProcessState)), stderr: errOut.String()}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		r.minflt = float64(ru.Minflt)
	}
	return r, nil
}

// initTrace sums one run's GODEBUG=inittrace=1 lines:
// "init <pkg> @<t> ms, <clock> ms clock, <bytes> bytes, <allocs> allocs".
type initTrace struct {
	packages      int
	ms            float64
	bytes, allocs int
}

func parseInitTrace(stderr string) initTrace {
	var t initTrace
	sc := bufio.NewScanner(strings.NewReader(stderr))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 11 || f[0] != "init" || f[5] != "ms" || f[6] != "clock," {
			continue
		}
		clock, err1 := strconv.ParseFloat(f[4], 64)
		bytes, err2 := strconv.Atoi(f[7])
		allocs, err3 := strconv.Atoi(f[9])
		if err1 != nil || err2 != nil || err3 != nil {
			continue
		}
		t.packages++
		t.ms += clock
		t.bytes += bytes
		t.allocs += allocs
	}
	return t
}
