package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/internal/procwait"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/internal/testhost"
)

// Helpers for the hardening tests: running the plugin binary with
// an exact CNI environment, reading its CNI error, and proving that a run
// changed nothing on the host.

// requireTool skips the test when a tool is missing (fails with CI set),
// like requireHost does for the tools every e2e test needs.
func requireTool(t *testing.T, name string) {
	t.Helper()
	if _, err := exec.LookPath(name); err != nil {
		testhost.SkipOrFail(t, fmt.Sprintf("e2e prerequisite missing: %s in PATH", name))
	}
}

// rawRun is what one run of a binary did.
type rawRun struct {
	stdout, stderr string
	// exitCode is the exit status, -1 when the process was killed by a
	// signal (then signal says which).
	exitCode int
	signal   syscall.Signal
	elapsed  time.Duration
	// timedOut is set when the guard timeout killed the process.
	timedOut bool
}

// rawOpts is how to run a binary: env is the complete CNI part of the
// environment (cniEnv drops the caller's CNI_* variables), dir the working
// directory, timeout the guard (cmdTimeout when zero). With setpgid the
// process leads its own process group, and the guard kills that group.
type rawOpts struct {
	env     []string
	stdin   []byte
	dir     string
	timeout time.Duration
	setpgid bool
}

// runBinary runs argv as a runtime would and reports what happened. It never
// fails the test itself: the callers decide what was expected.
func runBinary(t *testing.T, argv []string, o rawOpts) rawRun {
	t.Helper()
	timeout := o.timeout
	if timeout == 0 {
		timeout = cmdTimeout
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = cniEnv(o.env...)
	cmd.Dir = o.dir
	cmd.Stdin = bytes.NewReader(o.stdin)
	// A grandchild holding a pipe must not hang the test after the guard
	// fired.
	cmd.WaitDelay = 5 * time.Second
	if o.setpgid {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	r := rawRun{stdout: stdout.String(), stderr: stderr.String(), elapsed: time.Since(start), timedOut: ctx.Err() != nil}
	var exitErr *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exitErr):
		r.exitCode = exitErr.ExitCode()
		if ws, ok := exitErr.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			r.signal = ws.Signal()
		}
	case errors.Is(err, exec.ErrWaitDelay):
		r.exitCode = cmd.ProcessState.ExitCode()
	default:
		t.Fatalf("run %q: %v\nstdout: %s\nstderr: %s", argv, err, r.stdout, r.stderr)
	}
	return r
}

func (r rawRun) String() string {
	return fmt.Sprintf("exit %d (signal %v, %v)\nstdout: %s\nstderr: %s", r.exitCode, r.signal, r.elapsed.Round(time.Millisecond), r.stdout, r.stderr)
}

// cniEnvFor is the CNI environment a runtime passes for one attachment.
func cniEnvFor(command, cid, netnsPath, ifname, cniPath string) []string {
	return []string{
		"CNI_COMMAND=" + command,
		"CNI_CONTAINERID=" + cid,
		"CNI_NETNS=" + netnsPath,
		"CNI_IFNAME=" + ifname,
		"CNI_PATH=" + cniPath,
	}
}

// cniErrorObj is the error object a CNI plugin prints on stdout.
type cniErrorObj struct {
	Code    *int   `json:"code"`
	Msg     string `json:"msg"`
	Details string `json:"details"`
}

func (c cniErrorObj) code() int {
	if c.Code == nil {
		return -1
	}
	return *c.Code
}

// parseCNIError requires stdout to be exactly one JSON object, a CNI error
// with a code and a message, and nothing after it.
func parseCNIError(stdout string) (cniErrorObj, error) {
	dec := json.NewDecoder(strings.NewReader(stdout))
	var ce cniErrorObj
	if err := dec.Decode(&ce); err != nil {
		return ce, fmt.Errorf("stdout is not a JSON CNI error: %w", err)
	}
	var extra json.RawMessage
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return ce, fmt.Errorf("stdout holds more than one JSON value (next: %s, %v)", extra, err)
	}
	if ce.Code == nil {
		return ce, errors.New("CNI error without a code")
	}
	if ce.Msg == "" {
		return ce, errors.New("CNI error without a msg")
	}
	return ce, nil
}

// assertCNIFailure checks a run that must fail: exit status non-zero (not
// killed), no panic, and stdout a single CNI error whose code is one of
// codes. It returns the error (zero when stdout held none); the caller
// goes on to check the state either way.
func assertCNIFailure(t *testing.T, r rawRun, codes ...int) cniErrorObj {
	t.Helper()
	assertNoPanic(t, r)
	if r.timedOut {
		t.Errorf("the plugin did not return within its guard timeout (%v) and was killed\n%s", r.elapsed.Round(time.Millisecond), r)
	}
	if r.exitCode == 0 {
		t.Errorf("exit status 0, want non-zero\n%s", r)
	}
	if r.signal != 0 {
		t.Errorf("killed by %v, want a normal non-zero exit\n%s", r.signal, r)
	}
	ce, err := parseCNIError(r.stdout)
	if err != nil {
		t.Errorf("%v\n%s", err, r)
		return ce
	}
	if !slices.Contains(codes, ce.code()) {
		t.Errorf("CNI error code %d, want %v: msg %q details %q", ce.code(), codes, ce.Msg, ce.Details)
	}
	return ce
}

// assertNoPanic fails when the Go runtime printed a panic or a goroutine
// dump.
func assertNoPanic(t *testing.T, r rawRun) {
	t.Helper()
	for _, s := range []string{r.stdout, r.stderr} {
		if strings.Contains(s, "panic:") || strings.Contains(s, "goroutine ") {
			t.Errorf("the plugin panicked:\n%s", r)
			return
		}
	}
}

// ---------------------------------------------------------------------------
// Host state: before/after snapshots

// hostState is what a run must not change: directory trees (every entry
// with its type, mode, owner, size, mtime and content hash or link target),
// the entries of the shared default directories, and the links and the
// nat and filter tables of both families of the namespace the plugin ran
// in. Other test runs may share the host, so in the host's own namespace
// only the lines that name something of the test (its footprint) count.
type hostState map[string]string

// stateScope says where a snapshot looks. pluginNS is the namespace the
// plugin runs in (its "host"; every line counts there), footprint the
// strings that mark the test's own lines in the real host namespace.
type stateScope struct {
	pluginNS  string
	footprint []string
	trees     []string
}

// takeHostState snapshots what scope names.
func takeHostState(t *testing.T, scope stateScope) hostState {
	t.Helper()
	s := hostState{}
	for _, root := range scope.trees {
		s["tree "+root] = treeState(t, root)
	}
	for _, d := range []string{hostLocalDefaultDir, pluginDefaultDataDir} {
		s["entries "+d] = dirEntries(t, d)
	}
	if scope.pluginNS != "" {
		for k, v := range netState(t, scope.pluginNS) {
			s["plugin netns: "+k] = v
		}
	}
	if len(scope.footprint) > 0 {
		for k, v := range netState(t, "") {
			var mine []string
			for line := range strings.SplitSeq(v, "\n") {
				if slices.ContainsFunc(scope.footprint, func(f string) bool { return strings.Contains(line, f) }) {
					mine = append(mine, line)
				}
			}
			s["host netns (test's lines): "+k] = strings.Join(mine, "\n")
		}
	}
	return s
}

// netState is the link list and the nat and filter tables of both
// families in the namespace at nsPath ("" for the test's own).
func netState(t *testing.T, nsPath string) map[string]string {
	t.Helper()
	in := func(name string, args ...string) string {
		if nsPath != "" {
			args = append([]string{"--net=" + nsPath, "--", name}, args...)
			name = "nsenter"
		}
		out, err := output(name, args...)
		if err != nil {
			t.Fatalf("%v", err)
		}
		return out
	}
	s := map[string]string{}
	var names []string
	for line := range strings.SplitSeq(in("ip", "-o", "link", "show"), "\n") {
		if f := strings.Fields(line); len(f) > 1 {
			names = append(names, f[1])
		}
	}
	s["links"] = strings.Join(names, "\n")
	for _, fam := range ipFamilies {
		for _, table := range []string{"nat", "filter"} {
			s[fam+" -t "+table] = in(fam, "-w", "-t", table, "-S")
		}
	}
	return s
}

// assertUnchanged reports every part of the host state that differs from
// before, with a line diff.
func (before hostState) assertUnchanged(t *testing.T, after hostState) {
	t.Helper()
	keys := make([]string, 0, len(before))
	for k := range before {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if before[k] != after[k] {
			t.Errorf("%s changed:\n%s", k, lineDiff(before[k], after[k]))
		}
	}
}

// lineDiff lists the lines only in a (-) and only in b (+).
func lineDiff(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	var out strings.Builder
	for _, l := range al {
		if !slices.Contains(bl, l) {
			out.WriteString("  - " + l + "\n")
		}
	}
	for _, l := range bl {
		if !slices.Contains(al, l) {
			out.WriteString("  + " + l + "\n")
		}
	}
	return out.String()
}

// treeState describes every entry under root without following symlinks.
func treeState(t *testing.T, root string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		b.WriteString(entryState(t, p) + "\n")
		return nil
	})
	if errors.Is(err, fs.ErrNotExist) {
		return "(absent)"
	}
	if err != nil {
		t.Fatalf("walk %s: %v", root, err)
	}
	return b.String()
}

// entryState is one line describing path (not following a symlink).
func entryState(t *testing.T, p string) string {
	t.Helper()
	fi, err := os.Lstat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return p + " (absent)"
	}
	if err != nil {
		t.Fatalf("lstat %s: %v", p, err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	line := fmt.Sprintf("%s %v uid=%d gid=%d size=%d mtime=%d", p, fi.Mode(), st.Uid, st.Gid, fi.Size(), fi.ModTime().UnixNano())
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		target, err := os.Readlink(p)
		if err != nil {
			t.Fatalf("readlink %s: %v", p, err)
		}
		line += " -> " + target
	case fi.Mode().IsRegular():
		raw, err := os.ReadFile(p)
		if err != nil {
			t.Fatalf("read %s: %v", p, err)
		}
		line += fmt.Sprintf(" sha256=%x", sha256.Sum256(raw))
	}
	return line
}

// dirEntries lists the names in dir, or "(absent)".
func dirEntries(t *testing.T, dir string) string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return "(absent)"
	}
	if err != nil {
		t.Fatalf("read %s: %v", dir, err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return strings.Join(names, "\n")
}

// ---------------------------------------------------------------------------
// Processes a test started

// processesWithEnv lists the pids of processes whose environment holds
// kv exactly: every process a plugin run started (delegates, their
// children) inherits CNI_CONTAINERID, which is unique to a test.
func processesWithEnv(kv string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil {
			continue
		}
		if slices.Contains(strings.Split(string(raw), "\x00"), kv) {
			pids = append(pids, pid)
		}
	}
	return pids
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
