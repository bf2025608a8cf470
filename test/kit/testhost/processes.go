package testhost

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// Processes lists the pids of this host's processes (not this one) for
// which match, given the pid and a reader of its /proc files ("environ",
// "cmdline", ...), says yes. A process that exits meanwhile reads as
// nothing.
func Processes(match func(pid int, read func(name string) []byte) bool) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		read := func(name string) []byte {
			b, _ := os.ReadFile(filepath.Join("/proc", e.Name(), name))
			return b
		}
		if match(pid, read) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// ScriptLeavingAChild writes an executable script at path that prints out
// and leaves a child holding its output open, as a wrapper script's daemon
// does. The child is killed when the test ends: left to run, it would hold
// its working directory (a mount a CI step must unmount) for a minute.
func ScriptLeavingAChild(t testing.TB, path, out string) {
	t.Helper()
	pidFile := path + ".child"
	script := fmt.Sprintf("#!/bin/sh\necho '%s'\nsleep 60 &\necho $! > '%s'\n", out, pidFile)
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if b, err := os.ReadFile(pidFile); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
}
