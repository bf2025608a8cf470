package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// execRSSPath is the execrss helper (test/bench/cmd/execrss): by default
// next to this binary.
func execRSSPath() string {
	if p := os.Getenv("NBCB_EXECRSS"); p != "" {
		return p
	}
	self, err := os.Executable()
	if err != nil {
		return "execrss"
	}
	return filepath.Join(filepath.Dir(self), "execrss")
}

// execRSS runs prog through execrss and returns its wall time (measured
// by execrss, so execrss's own start is not in it), peak RSS in KiB and
// CPU time.
func execRSS(env []string, prog string, args ...string) (time.Duration, int64, time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, execRSSPath(), append([]string{prog}, args...)...)
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return 0, 0, 0, fmt.Errorf("%w: %s", err, strings.TrimSpace(stderr.String()))
	}
	f := strings.Fields(stdout.String())
	if len(f) != 3 {
		return 0, 0, 0, fmt.Errorf("execrss printed %q", stdout.String())
	}
	ns, err1 := strconv.ParseInt(f[0], 10, 64)
	rss, err2 := strconv.ParseInt(f[1], 10, 64)
	cpu, err3 := strconv.ParseInt(f[2], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return 0, 0, 0, fmt.Errorf("execrss printed %q", stdout.String())
	}
	return time.Duration(ns), rss, time.Duration(cpu), nil
}

// cpuNow is this process's CPU time plus that of the children it has
// waited for (plugins, and the iptables they ran).
func cpuNow() time.Duration {
	var self, kids syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &self)
	syscall.Getrusage(syscall.RUSAGE_CHILDREN, &kids)
	return time.Duration(self.Utime.Nano() + self.Stime.Nano() + kids.Utime.Nano() + kids.Stime.Nano())
}

// childrenCPU is the CPU time of the children this process waited for.
func childrenCPU() time.Duration {
	var kids syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_CHILDREN, &kids)
	return time.Duration(kids.Utime.Nano() + kids.Stime.Nano())
}

// procCPU is the CPU time of an exited child (and its waited-for children).
func procCPU(ps *os.ProcessState) time.Duration {
	if ps == nil {
		return 0
	}
	return ps.UserTime() + ps.SystemTime()
}
