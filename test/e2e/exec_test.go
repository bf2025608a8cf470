package e2e

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/invoke"
	"golang.org/x/sys/unix"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/hostcmd"
)

// Running a plugin binary as a runtime does (the CNI environment libcni
// builds, the config on stdin), what came out, and the CNI error a failed
// run must print.

// cniArgs is what a runtime passes a plugin for ns's eth0: the bin dir as
// CNI_PATH, no CNI_ARGS.
func (e *testEnv) cniArgs(command string, ns netns) invoke.Args {
	return invoke.Args{Command: command, ContainerID: ns.cid, NetNS: ns.path, IfName: ifName, Path: e.bin}
}

// binary is the path of a binary of the bin dir.
func (e *testEnv) binary(name string) string { return filepath.Join(e.bin, name) }

// runOpts is what differs between runs. The zero value runs the binary
// without arguments and with nothing on stdin, in a fresh working
// directory, killed after cmdTimeout.
type runOpts struct {
	argv  []string // the operator CLI's, or nsenter's with the plugin last
	stdin []byte
	dir   string
	// env comes after the CNI variables: NAME=VALUE sets NAME, a bare NAME
	// removes it.
	env []string
	// timeout (cmdTimeout when zero), or ctx being cancelled, kills the
	// run.
	timeout time.Duration
	ctx     context.Context
	// group makes the run lead a process group of its own, and a kill take
	// the whole group (a runtime giving up on everything it started), not
	// only the plugin.
	group bool
	// combined sends stderr to stdout, as Nomad's fingerprint reads them.
	combined bool
}

// pluginRun is what one run did.
type pluginRun struct {
	what           string // the command, for messages
	stdout, stderr string
	// exitCode is the exit status, -1 when a signal ended the run (signal
	// says which) or it did not start.
	exitCode int
	signal   syscall.Signal
	killed   bool // by the timeout or ctx
	elapsed  time.Duration
	// err is nil after exit status 0; else it wraps Wait's *exec.ExitError
	// (or Start's error) and carries stdout and stderr.
	err error
}

// runPlugin runs exe as libcni runs a plugin: args' CNI variables as
// invoke.Args.AsEnv sets them (none when args.Command is empty: the
// operator CLI, a fingerprint), on the test's environment without the
// caller's own CNI variables (hostcmd.CNIEnv; PATH is kept, the plugins
// run iptables). It fails the test only when exe cannot be started: the
// callers decide what was expected.
func runPlugin(t *testing.T, exe string, args invoke.Args, o runOpts) pluginRun {
	t.Helper()
	r := pluginRun{what: strings.Join(append([]string{filepath.Base(exe)}, o.argv...), " ")}
	if args.Command != "" {
		r.what += " " + args.Command + " " + args.ContainerID
	}
	cmd := exec.Command(exe, o.argv...)
	cmd.Env = pluginEnv(args, o.env)
	cmd.Dir = o.dir
	if cmd.Dir == "" {
		cmd.Dir = t.TempDir()
	}
	cmd.Stdin = bytes.NewReader(o.stdin)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: o.group}
	// Files, not pipes: the run is over when the plugin exits, whatever it
	// left holding its stdout or stderr (a killed plugin's delegates).
	stdout, err := outputFile()
	if err != nil {
		return r.notStarted(t, err)
	}
	defer stdout.Close()
	stderr, err := outputFile()
	if err != nil {
		return r.notStarted(t, err)
	}
	defer stderr.Close()
	cmd.Stdout, cmd.Stderr = stdout, stderr
	if o.combined {
		cmd.Stderr = stdout
	}
	ctx, cancel := context.WithTimeout(cmp.Or(o.ctx, context.Background()), cmp.Or(o.timeout, cmdTimeout))
	defer cancel()
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return r.notStarted(t, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-ctx.Done():
		r.killed = true
		if o.group {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		} else {
			_ = cmd.Process.Kill()
		}
		err = <-done
	}
	r.elapsed = time.Since(start)
	ws := cmd.ProcessState.Sys().(syscall.WaitStatus)
	r.exitCode = ws.ExitStatus()
	if ws.Signaled() {
		r.signal = ws.Signal()
	}
	r.stdout, r.stderr = readOutput(t, stdout), readOutput(t, stderr)
	if err != nil {
		r.err = fmt.Errorf("%s: %w\nstdout: %s\nstderr: %s", r.what, err, r.stdout, r.stderr)
	}
	return r
}

func (r pluginRun) String() string {
	status := fmt.Sprintf("exit %d", r.exitCode)
	if r.signal != 0 {
		status = unix.SignalName(r.signal)
	}
	return fmt.Sprintf("%s: %s after %v\nstdout: %s\nstderr: %s", r.what, status, r.elapsed.Round(time.Millisecond), r.stdout, r.stderr)
}

// cniVars are the variables invoke.Args.AsEnv sets.
var cniVars = []string{"CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS", "CNI_ARGS", "CNI_IFNAME", "CNI_PATH"}

// pluginEnv is the environment of a run: see runPlugin and runOpts.env.
func pluginEnv(args invoke.Args, extra []string) []string {
	var set []string
	if args.Command != "" {
		for _, kv := range args.AsEnv() { // os.Environ(), then args'
			if name, _, _ := strings.Cut(kv, "="); slices.Contains(cniVars, name) {
				set = append(set, kv)
			}
		}
	}
	env := hostcmd.CNIEnv(set...)
	for _, kv := range extra {
		if strings.Contains(kv, "=") {
			env = append(env, kv) // exec.Cmd takes the last of duplicates
			continue
		}
		env = slices.DeleteFunc(env, func(s string) bool { return strings.HasPrefix(s, kv+"=") })
	}
	return env
}

// notStarted fails the test without stopping it: the operator CLI also
// runs in the tests' goroutines.
func (r pluginRun) notStarted(t *testing.T, err error) pluginRun {
	t.Helper()
	t.Errorf("start %s: %v", r.what, err)
	r.exitCode, r.err = -1, fmt.Errorf("%s: %w", r.what, err)
	return r
}

// outputFile is an unnamed file for one stream of a run.
func outputFile() (*os.File, error) {
	f, err := os.CreateTemp("", "nbc-e2e-output-")
	if err != nil {
		return nil, err
	}
	if err := os.Remove(f.Name()); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

func readOutput(t *testing.T, f *os.File) string {
	t.Helper()
	_, err := f.Seek(0, io.SeekStart)
	raw, err2 := io.ReadAll(f)
	if err := errors.Join(err, err2); err != nil {
		t.Errorf("read the output of a run: %v", err)
	}
	return string(raw)
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
func assertCNIFailure(t *testing.T, r pluginRun, codes ...int) cniErrorObj {
	t.Helper()
	assertNoPanic(t, r)
	if r.killed {
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
func assertNoPanic(t *testing.T, r pluginRun) {
	t.Helper()
	for _, s := range []string{r.stdout, r.stderr} {
		if strings.Contains(s, "panic:") || strings.Contains(s, "goroutine ") {
			t.Errorf("the plugin panicked:\n%s", r)
			return
		}
	}
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
