// Package cniexec runs a plugin binary as a runtime does: the CNI
// environment libcni builds, the network configuration on stdin. Every
// test that execs a plugin (or the operator CLI) raw builds its
// environment here.
package cniexec

import (
	"bytes"
	"cmp"
	"context"
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

// DefaultTimeout kills a run that Opts gives no timeout: a hung plugin
// fails the test instead of hanging the whole run.
const DefaultTimeout = 60 * time.Second

// Opts is what differs between runs. The zero value runs the binary
// without arguments and with nothing on stdin, in a fresh working
// directory, killed after DefaultTimeout.
type Opts struct {
	Argv  []string // the operator CLI's, or a wrapper's (nsenter, strace) with the plugin in it
	Stdin []byte
	Dir   string
	// Env comes after the CNI variables: NAME=VALUE sets NAME, a bare NAME
	// removes it.
	Env []string
	// Base replaces the test's own environment (without its CNI
	// variables) under the CNI variables, when not nil.
	Base []string
	// Timeout (DefaultTimeout when zero), or Ctx being cancelled, kills
	// the run.
	Timeout time.Duration
	Ctx     context.Context
	// Group makes the run lead a process group of its own, and a kill take
	// the whole group (a runtime giving up on everything it started), not
	// only the plugin.
	Group bool
	// Combined sends stderr to stdout, as Nomad's fingerprint reads them.
	Combined bool
}

// Result is what one run did.
type Result struct {
	What           string // the command, for messages
	Stdout, Stderr string
	// ExitCode is the exit status, -1 when a signal ended the run (Signal
	// says which) or it did not start.
	ExitCode int
	Signal   syscall.Signal
	Killed   bool // by the timeout or Ctx
	Elapsed  time.Duration
	// Err is nil after exit status 0; else it wraps Wait's *exec.ExitError
	// (or Start's error) and carries stdout and stderr.
	Err error
}

// Run runs exe as libcni runs a plugin: args' CNI variables as
// invoke.Args.AsEnv sets them (none when args.Command is empty: the
// operator CLI, a fingerprint), on the test's environment without the
// caller's own CNI variables. It fails the test only when exe cannot be
// started: the caller decides what was expected.
func Run(t testing.TB, exe string, args invoke.Args, o Opts) Result {
	t.Helper()
	r := Result{What: strings.Join(append([]string{filepath.Base(exe)}, o.Argv...), " ")}
	if args.Command != "" {
		r.What += " " + args.Command + " " + args.ContainerID
	}
	cmd := Command(exe, args, o.Argv, o.Env...)
	if o.Base != nil {
		cmd.Env = env(o.Base, args, o.Env)
	}
	cmd.Dir = o.Dir
	if cmd.Dir == "" {
		cmd.Dir = t.TempDir()
	}
	cmd.Stdin = bytes.NewReader(o.Stdin)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: o.Group}
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
	if o.Combined {
		cmd.Stderr = stdout
	}
	ctx, cancel := context.WithTimeout(cmp.Or(o.Ctx, context.Background()), cmp.Or(o.Timeout, DefaultTimeout))
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
		r.Killed = true
		if o.Group {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		} else {
			_ = cmd.Process.Kill()
		}
		err = <-done
	}
	r.Elapsed = time.Since(start)
	ws := cmd.ProcessState.Sys().(syscall.WaitStatus)
	r.ExitCode = ws.ExitStatus()
	if ws.Signaled() {
		r.Signal = ws.Signal()
	}
	r.Stdout, r.Stderr = readOutput(t, stdout), readOutput(t, stderr)
	if err != nil {
		r.Err = fmt.Errorf("%s: %w\nstdout: %s\nstderr: %s", r.What, err, r.Stdout, r.Stderr)
	}
	return r
}

// Command is exe with argv and the environment Run gives it, for a test
// that needs the *exec.Cmd itself (to trace it, or to re-execute the test
// binary as a plugin).
func Command(exe string, args invoke.Args, argv []string, extra ...string) *exec.Cmd {
	cmd := exec.Command(exe, argv...)
	cmd.Env = env(nil, args, extra)
	return cmd
}

func (r Result) String() string {
	status := fmt.Sprintf("exit %d", r.ExitCode)
	if r.Signal != 0 {
		status = unix.SignalName(r.Signal)
	}
	return fmt.Sprintf("%s: %s after %v\nstdout: %s\nstderr: %s", r.What, status, r.Elapsed.Round(time.Millisecond), r.Stdout, r.Stderr)
}

// cniVars are the variables invoke.Args.AsEnv sets.
var cniVars = []string{"CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS", "CNI_ARGS", "CNI_IFNAME", "CNI_PATH"}

// env is base (hostcmd.CNIEnv's when nil), args' CNI variables, then
// extra: see Opts.Env.
func env(base []string, args invoke.Args, extra []string) []string {
	var set []string
	if args.Command != "" {
		for _, kv := range args.AsEnv() { // os.Environ(), then args'
			if name, _, _ := strings.Cut(kv, "="); slices.Contains(cniVars, name) {
				set = append(set, kv)
			}
		}
	}
	env := append(slices.Clone(base), set...)
	if base == nil {
		env = hostcmd.CNIEnv(set...)
	}
	for _, kv := range extra {
		if strings.Contains(kv, "=") {
			env = append(env, kv) // exec.Cmd takes the last of duplicates
			continue
		}
		env = slices.DeleteFunc(env, func(s string) bool { return strings.HasPrefix(s, kv+"=") })
	}
	return env
}

// notStarted fails the test without stopping it: runs also happen in a
// test's goroutines.
func (r Result) notStarted(t testing.TB, err error) Result {
	t.Helper()
	t.Errorf("start %s: %v", r.What, err)
	r.ExitCode, r.Err = -1, fmt.Errorf("%s: %w", r.What, err)
	return r
}

// outputFile is an unnamed file for one stream of a run.
func outputFile() (*os.File, error) {
	f, err := os.CreateTemp("", "nbc-cniexec-output-")
	if err != nil {
		return nil, err
	}
	if err := os.Remove(f.Name()); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

func readOutput(t testing.TB, f *os.File) string {
	t.Helper()
	_, err := f.Seek(0, io.SeekStart)
	raw, err2 := io.ReadAll(f)
	if err := errors.Join(err, err2); err != nil {
		t.Errorf("read the output of a run: %v", err)
	}
	return string(raw)
}
