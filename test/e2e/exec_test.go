package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/internal/testhost"
)

// pluginCmd prepares the binary `plugin` of the bin dir as a runtime runs
// it: CNI_* environment, the config on stdin.
func (e *testEnv) pluginCmd(ctx context.Context, plugin, command, cid, netnsPath string, stdin []byte) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(e.bin, plugin))
	cmd.Env = cniEnv(
		"CNI_COMMAND="+command,
		"CNI_CONTAINERID="+cid,
		"CNI_NETNS="+netnsPath,
		"CNI_IFNAME="+ifName,
		"CNI_PATH="+e.bin,
	)
	cmd.Stdin = bytes.NewReader(stdin)
	return cmd
}

// runPlugin runs a plugin binary directly, without CNI_ARGS (see
// execPlugin), and returns stdout and stderr.
func (e *testEnv) runPlugin(plugin, command, cid, netnsPath string, stdin []byte) (string, string, error) {
	return e.execPlugin(plugin, command, cid, netnsPath, "", stdin)
}

// releaseLines are the plugin's "released" lines on stderr for the test's
// network.
func (e *testEnv) releaseLines(stderr string) []string {
	var out []string
	prefix := "nomad-bridge-cni: " + e.netName + ": released "
	for line := range strings.SplitSeq(stderr, "\n") {
		if strings.Contains(line, prefix) {
			out = append(out, line)
		}
	}
	return out
}

// assertReleased checks that stderr has exactly one release line for
// cid's eth0 attachment and that it contains every want string.
func (e *testEnv) assertReleased(t *testing.T, stderr, cid string, want ...string) {
	t.Helper()
	var mine []string
	for _, l := range e.releaseLines(stderr) {
		if strings.Contains(l, "released "+cid+"/") {
			mine = append(mine, l)
		}
	}
	if len(mine) != 1 {
		t.Errorf("want one release line for %s on stderr, got %q\nstderr: %s", cid, mine, stderr)
		return
	}
	for _, w := range want {
		if !strings.Contains(mine[0], w) {
			t.Errorf("release line %q does not mention %q", mine[0], w)
		}
	}
}

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

// execPlugin runs a plugin binary with stdin and the CNI_* variables a
// runtime sets, including CNI_ARGS.
func (e *testEnv) execPlugin(plugin, command, cid, nsPath, cniArgs string, stdin []byte) (string, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	cmd := e.pluginCmd(ctx, plugin, command, cid, nsPath, stdin)
	if cniArgs != "" {
		cmd.Env = append(cmd.Env, "CNI_ARGS="+cniArgs)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), errb.String(), fmt.Errorf("%s %s %s: %w\nstdout: %s\nstderr: %s", plugin, command, cid, err, out.String(), errb.String())
	}
	return out.String(), errb.String(), nil
}

// k8sArgs are the CNI_ARGS containerd's CRI plugin (and CRI-O's ocicni)
// pass for a pod sandbox.
func k8sArgs(t *testing.T, cid string) [][2]string {
	return [][2]string{
		{"IgnoreUnknown", "1"},
		{"K8S_POD_NAMESPACE", "default"},
		{"K8S_POD_NAME", "web-" + cid[:8]},
		{"K8S_POD_INFRA_CONTAINER_ID", cid},
		{"K8S_POD_UID", podUID(t)},
	}
}

func joinArgs(args [][2]string) string {
	var parts []string
	for _, kv := range args {
		parts = append(parts, kv[0]+"="+kv[1])
	}
	return strings.Join(parts, ";")
}
