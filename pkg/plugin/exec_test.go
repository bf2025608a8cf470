package plugin

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/procwait"
)

func script(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "delegate")
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestDelegateExecTellsAnswersFromCrashes(t *testing.T) {
	e := &delegateExec{}
	for _, tc := range []struct {
		name     string
		body     string
		answered bool
		want     string
	}{
		{"cni error", `echo '{"code":11,"msg":"busy"}'; exit 1`, true, "busy"},
		{"garbage on stdout", `echo 'garbage{{'; exit 2`, false, "garbage{{"},
		{"silent failure", `exit 1`, false, "no output"},
		{"killed", `kill -KILL $$`, false, "signal: killed"},
		{"code 0 error", `echo '{"code":0,"msg":"x"}'; exit 1`, false, "code"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.ExecPlugin(context.Background(), script(t, tc.body), nil, os.Environ())
			if err == nil {
				t.Fatal("no error")
			}
			if (answer(err) != nil) != tc.answered || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v (answered %v), want answered=%v mentioning %q", err, answer(err) != nil, tc.answered, tc.want)
			}
		})
	}
	out, err := e.ExecPlugin(context.Background(), script(t, `echo '{"cniVersion":"1.0.0"}'`), nil, os.Environ())
	if err != nil || !strings.Contains(string(out), "1.0.0") {
		t.Errorf("success = %q, %v", out, err)
	}
}

// A delegate that hangs, with a child holding its stdout open, is killed
// with its whole process group when the context ends, and we return.
func TestDelegateExecKillsAHungDelegateAndItsChildren(t *testing.T) {
	e := &delegateExec{}
	pidFile := filepath.Join(t.TempDir(), "child.pid")
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := e.ExecPlugin(ctx, script(t, `sleep 3600 & echo $! > `+pidFile+`; wait`), nil, os.Environ())
	if err == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want a deadline error", err)
	}
	if answer(err) != nil {
		t.Error("a killed delegate counts as an answer")
	}
	if took := time.Since(start); took > waitDelay+5*time.Second {
		t.Errorf("returned after %v", took)
	}
	b, _ := os.ReadFile(pidFile)
	if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
		// SIGKILL is delivered asynchronously: wait for the exit.
		if running, err := procwait.Exit([]int{pid}, time.Now().Add(5*time.Second)); err != nil || len(running) > 0 {
			t.Errorf("child %d of the hung delegate still runs (%v)", pid, err)
		}
	}
	var cniErr *types.Error
	if errors.As(err, &cniErr) {
		t.Errorf("a killed delegate became a CNI error: %v", cniErr)
	}
}

// The delegate is looked up once per run: the up-front check finds it, and
// invoke.Delegate*'s own lookup is answered from memory, even if the file
// went away in between (the exec then fails, as it would have anyway).
func TestDelegateExecLooksUpOnce(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "bridge")
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	e := &delegateExec{}
	if got, err := e.FindInPath("bridge", []string{dir}); err != nil || got != path {
		t.Fatalf("first lookup = %q, %v", got, err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if got, err := e.FindInPath("bridge", []string{dir}); err != nil || got != path {
		t.Errorf("second lookup = %q, %v; want the first one's answer", got, err)
	}
	if _, err := e.FindInPath("bridge", []string{dir, "/nonexistent"}); err == nil {
		t.Errorf("a lookup in another CNI_PATH was answered from memory")
	}
}
