package e2e

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/procwait"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/testhost"
)

// A runtime that gives up on an ADD kills the plugin, not its delegates:
// they run in their own process group and are orphaned. A test that kills
// plugins becomes a child subreaper, so the orphans are reparented to it
// rather than to PID 1: it can wait for them to finish (an event, not a
// sleep) and reap them (PID 1 of a container may not).

// becomeSubreaper makes the test process a child subreaper until the test
// ends. Its cleanup first kills and reaps whatever the test inherited and
// left running (a test that failed half-way), before the harness deletes
// the namespaces and rules those processes would otherwise still write.
func becomeSubreaper(t *testing.T) {
	t.Helper()
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		t.Fatalf("become child subreaper: %v", err)
	}
	t.Cleanup(func() {
		if err := reapChildren(0); err != nil {
			t.Errorf("cleanup: %v", err)
		}
		_ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
	})
}

// reapChildren waits until the test process has no child left, reaping
// each, including those reparented to it meanwhile (a killed bridge's
// host-local). After grace it kills whatever is left, and says so. It
// must run only while the test waits for no child of its own: wait4(-1)
// would take that child from exec.Cmd.Wait.
func reapChildren(grace time.Duration) error {
	var kill atomic.Bool
	done := make(chan error, 1)
	go func() { done <- waitAllChildren(&kill) }()
	select {
	case err := <-done:
		return err
	case <-time.After(grace):
	}
	left := liveProcesses(childPIDs())
	kill.Store(true)
	killAll(left) // wakes the wait4 below, which kills the rest
	if err := <-done; err != nil {
		return err
	}
	if len(left) == 0 {
		return nil
	}
	return fmt.Errorf("inherited processes still running after %v, killed: %s", grace, processLine(left))
}

// waitAllChildren reaps children until there are none (ECHILD); once kill
// is set it kills every child before each wait.
func waitAllChildren(kill *atomic.Bool) error {
	for {
		if kill.Load() {
			killAll(childPIDs())
		}
		_, err := unix.Wait4(-1, nil, 0, nil)
		switch {
		case errors.Is(err, unix.ECHILD):
			return nil
		case errors.Is(err, unix.EINTR):
		case err != nil:
			return fmt.Errorf("wait for inherited processes: %w", err)
		}
	}
}

// reapGroup reaps the members of process group pgid that the test
// inherited, as the runtime that killed them would: a plugin whose caller
// was killed with it is an orphan, and a zombie still has its pid.
// Children in other groups are left alone.
func reapGroup(pgid int) error {
	for {
		_, err := unix.Wait4(-pgid, nil, 0, nil)
		switch {
		case errors.Is(err, unix.ECHILD):
			return nil
		case errors.Is(err, unix.EINTR):
		case err != nil:
			return fmt.Errorf("reap process group %d: %w", pgid, err)
		}
	}
}

func killAll(pids []int) {
	for _, pid := range pids {
		_ = unix.Kill(pid, unix.SIGKILL)
	}
}

// childPIDs lists the test process's children, zombies included.
func childPIDs() []int {
	self := strconv.Itoa(os.Getpid())
	return testhost.Processes(func(_ int, read func(string) []byte) bool {
		// "pid (comm) state ppid ...": comm may hold spaces and parentheses.
		s := string(read("stat"))
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		return len(fields) > 1 && fields[1] == self
	})
}

// processesWithEnv lists the pids of processes whose environment holds
// kv exactly: every process a plugin run started (delegates, their
// children) inherits CNI_CONTAINERID, which is unique to a test.
func processesWithEnv(kv string) []int {
	return testhost.Processes(func(_ int, read func(string) []byte) bool {
		return slices.Contains(strings.Split(string(read("environ")), "\x00"), kv)
	})
}

// killProcessesWithEnv kills, by pid, what processesWithEnv finds, and
// waits until they are gone. It is the cleanup for delegates that hang.
func killProcessesWithEnv(t *testing.T, kv string) {
	t.Helper()
	for _, pid := range processesWithEnv(kv) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	if left := waitProcessesGone(kv, 10*time.Second); len(left) > 0 {
		t.Errorf("processes with %s still running after SIGKILL: %v", kv, left)
	}
}

// waitProcessesGone waits until no live process carries kv in its
// environment, at most timeout, and returns those still running then. It
// waits for their exit (procwait), then looks again for any started
// meanwhile.
func waitProcessesGone(kv string, timeout time.Duration) []int {
	deadline := time.Now().Add(timeout)
	for {
		left := liveProcesses(processesWithEnv(kv))
		if len(left) == 0 || !time.Now().Before(deadline) {
			return left
		}
		if _, err := procwait.Exit(left, deadline); err != nil {
			return left
		}
	}
}

// liveProcesses drops zombies (exited, waiting for their parent to reap
// them) from pids.
func liveProcesses(pids []int) []int {
	var out []int
	for _, pid := range pids {
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// The state follows the parenthesised command name.
		s := string(raw)
		if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) && s[i+2] == 'Z' {
			continue
		}
		out = append(out, pid)
	}
	return out
}

// processLine describes pids for an error message.
func processLine(pids []int) string {
	var parts []string
	for _, pid := range pids {
		raw, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		parts = append(parts, fmt.Sprintf("%d: %s", pid, strings.ReplaceAll(strings.TrimRight(string(raw), "\x00"), "\x00", " ")))
	}
	return strings.Join(parts, "; ")
}

// deadPID returns the pid of a process that ran and was reaped: no
// process has it (pids are reused only after wrapping around pid_max).
func deadPID(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatalf("run true: %v", err)
	}
	pid := cmd.Process.Pid
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
		t.Fatalf("pid %d of an exited process is in use again", pid)
	}
	return pid
}
