package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The latency table's added cost (A−B against C−B) is a difference of two
// medians of ≈ 100–200 ms verbs whose spread is mostly bridge's, firewall's
// and iptables' own: with 40 rounds it moves by several ms between runs,
// more than a goal of a few tenths of C−B would allow. What the plugin and the
// floor plugin each add is their process's own time: from its exec to its
// exit, minus the lifetime of the delegate it runs (bridge, and whatever
// bridge runs); processes the plugin runs itself count as its own. perf's sched tracepoints give both for every process of
// the run, without touching them, so the latency cell (with --floor and
// perf on the machine) traces them and reports the own time per verb of A's
// plugin and C's floor plugin side by side.

// schedTrace is a system-wide perf recording of process forks, execs and
// exits on CLOCK_MONOTONIC, the clock monoNow reads.
type schedTrace struct {
	cmd      *exec.Cmd
	data     string
	ctl, ack *os.File
}

// startSchedTrace starts perf with its events disabled, enables them over
// its control FIFO and returns once perf has acknowledged: every exec
// after that is in the recording.
func startSchedTrace(dir string) (*schedTrace, error) {
	perf, err := exec.LookPath("perf")
	if err != nil {
		return nil, fmt.Errorf("perf not found (Debian: linux-perf): %w", err)
	}
	t := &schedTrace{data: filepath.Join(dir, "sched.perf")}
	ctl, ack := filepath.Join(dir, "perf.ctl"), filepath.Join(dir, "perf.ack")
	for _, f := range []string{ctl, ack} {
		// An earlier trace of the run (latency, then restore) left its FIFOs.
		if err := os.Remove(f); err != nil && !os.IsNotExist(err) {
			return nil, err
		}
		if err := unix.Mkfifo(f, 0o600); err != nil {
			return nil, fmt.Errorf("mkfifo %s: %w", f, err)
		}
	}
	t.cmd = exec.Command(perf, "record", "-q", "-D", "-1", "--control=fifo:"+ctl+","+ack,
		"-k", "CLOCK_MONOTONIC", "-a", "-o", t.data,
		"-e", "sched:sched_process_fork", "-e", "sched:sched_process_exec", "-e", "sched:sched_process_exit")
	// A driver killed mid-run must not leave a system-wide recording on.
	t.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var stderr bytes.Buffer
	t.cmd.Stderr = &stderr
	if err := t.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start perf: %w", err)
	}
	// The FIFOs are opened read-write so that neither open waits for perf
	// (which may have failed before opening them).
	if t.ctl, err = os.OpenFile(ctl, os.O_RDWR, 0); err == nil {
		t.ack, err = os.OpenFile(ack, os.O_RDWR, 0)
	}
	if err == nil {
		_, err = t.ctl.WriteString("enable\n")
	}
	if err == nil {
		_ = t.ack.SetReadDeadline(time.Now().Add(30 * time.Second))
		var line string
		line, err = bufio.NewReader(t.ack).ReadString('\n')
		if err == nil && strings.TrimSpace(line) != "ack" {
			err = fmt.Errorf("perf answered %q", line)
		}
	}
	if err != nil {
		t.stop()
		return nil, fmt.Errorf("enable perf's events: %w: %s", err, bytes.TrimSpace(stderr.Bytes()))
	}
	return t, nil
}

// stop ends the recording (perf writes its file on SIGINT).
func (t *schedTrace) stop() error {
	_ = t.cmd.Process.Signal(syscall.SIGINT)
	err := t.cmd.Wait()
	for _, f := range []*os.File{t.ctl, t.ack} {
		if f != nil {
			f.Close()
		}
	}
	var exit *exec.ExitError
	if errors.As(err, &exit) && exit.Sys().(syscall.WaitStatus).Signal() == syscall.SIGINT {
		return nil
	}
	return err
}

// monoNow is CLOCK_MONOTONIC in ns, the clock of perf's timestamps.
func monoNow() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

// tracedProcess is one exec: its program, its lifetime (exec to the last
// exit of a thread of it, in ns) and the process that ran it.
type tracedProcess struct {
	path       string
	start, end int64
	parent     int // index in processes, -1 when it began before the trace
}

// processes reads the recording into one entry per exec. A fork makes the
// child part of its parent's process until the child execs (a thread, or
// os/exec's child between clone and execve).
func (t *schedTrace) processes() ([]tracedProcess, error) {
	perf, err := exec.LookPath("perf")
	if err != nil {
		return nil, err
	}
	out, err := exec.Command(perf, "script", "-i", t.data, "--ns", "-F", "tid,time,event,trace").Output()
	if err != nil {
		return nil, fmt.Errorf("perf script: %w", err)
	}
	return parseSchedScript(out)
}

// parseSchedScript reads `perf script --ns -F tid,time,event,trace` of
// the three sched events, in time order.
func parseSchedScript(out []byte) ([]tracedProcess, error) {
	var procs []tracedProcess
	of := map[int]int{} // thread → index in procs
	for line := range strings.SplitSeq(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 4 {
			continue
		}
		tid, err1 := strconv.Atoi(f[0])
		at, err2 := parseNsTime(strings.TrimSuffix(f[1], ":"))
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("perf script line %q: not tid and time", line)
		}
		kv := map[string]string{}
		for _, field := range f[3:] {
			if k, v, ok := strings.Cut(field, "="); ok {
				kv[k] = v
			}
		}
		switch f[2] {
		case "sched:sched_process_fork:":
			child, err := strconv.Atoi(kv["child_pid"])
			if err != nil {
				return nil, fmt.Errorf("perf script line %q: no child_pid", line)
			}
			if p, ok := of[tid]; ok {
				of[child] = p
			}
		case "sched:sched_process_exec:":
			parent, ok := of[tid]
			if !ok {
				parent = -1
			}
			procs = append(procs, tracedProcess{path: kv["filename"], start: at, end: at, parent: parent})
			of[tid] = len(procs) - 1
		case "sched:sched_process_exit:":
			if p, ok := of[tid]; ok {
				procs[p].end = max(procs[p].end, at)
				delete(of, tid)
			}
		}
	}
	return procs, nil
}

// parseNsTime reads perf's "seconds.nanoseconds".
func parseNsTime(s string) (int64, error) {
	sec, nsec, ok := strings.Cut(s, ".")
	if !ok || len(nsec) != 9 {
		return 0, fmt.Errorf("time %q", s)
	}
	a, err1 := strconv.ParseInt(sec, 10, 64)
	b, err2 := strconv.ParseInt(nsec, 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("time %q", s)
	}
	return a*1e9 + b, nil
}

// ownRun is one plugin process's own time and the processes it ran
// itself (their files' base names), which that time includes.
type ownRun struct {
	ms     float64
	others []string
}

// ownTimes is, for each process of program that began inside one of
// windows, its lifetime minus the lifetimes of the delegate processes it
// ran (those whose file's base name is delegate), in ms, by the window's
// index; a window without exactly one such process has none. Any other
// process it ran (a sweep's iptables listing) is its own cost and stays
// in.
func ownTimes(procs []tracedProcess, program, delegate string, windows [][2]int64) map[int]ownRun {
	inDelegate := map[int]int64{}
	others := map[int][]string{}
	for _, p := range procs {
		if p.parent < 0 {
			continue
		}
		if base := filepath.Base(p.path); base == delegate {
			inDelegate[p.parent] += p.end - p.start
		} else {
			others[p.parent] = append(others[p.parent], base)
		}
	}
	found := map[int]int{}
	own := map[int]ownRun{}
	for i, p := range procs {
		if p.path != program {
			continue
		}
		for w, win := range windows {
			if p.start >= win[0] && p.start <= win[1] {
				found[w]++
				own[w] = ownRun{ms: float64(p.end-p.start-inDelegate[i]) / 1e6, others: others[i]}
			}
		}
	}
	for w, n := range found {
		if n != 1 {
			delete(own, w)
		}
	}
	return own
}
