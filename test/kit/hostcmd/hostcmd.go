// Package hostcmd runs the host commands (ip, iptables, mount, ...) the e2e
// tests and the benchmark harness set up and tear down with, each bounded
// by a timeout and failing with the command line and its stderr.
package hostcmd

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"
)

// Run runs name with args and returns an error carrying its output if it
// fails or outlives timeout.
func Run(timeout time.Duration, name string, args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// Output runs name with args and returns its stdout; on failure the error
// carries its stderr.
func Output(timeout time.Duration, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	return string(out), nil
}

// CNIEnv is the process environment without any CNI variables of the
// caller's (CNI_*, NETCONFPATH, CAP_ARGS), plus extra. PATH is kept: the
// plugins run iptables.
func CNIEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "CNI_") || strings.HasPrefix(kv, "NETCONFPATH=") || strings.HasPrefix(kv, "CAP_ARGS=") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, extra...)
}
