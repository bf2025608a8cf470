package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const about = "CNI nomad-bridge-cni plugin v0.0.0-test"

func run4(t *testing.T, _ map[string]string, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := Run(args, &stdout, &stderr, about)
	return code, stdout.String(), stderr.String()
}

func TestCLI(t *testing.T) {
	cases := []struct {
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{args: []string{"--version"}, code: 0, stdout: "CNI nomad-bridge-cni plugin v"},
		{args: []string{"--help"}, code: 0, stdout: "Usage:"},
		{args: []string{"-h"}, code: 0, stdout: "--version"},
		{args: []string{"--bogus"}, code: 2, stderr: "unknown flag: --bogus"},
		{args: []string{"frobnicate"}, code: 2, stderr: `unknown command "frobnicate"`},
		// Was "stat : no such file or directory".
		{args: []string{"gc", "--data-dir="}, code: 1, stderr: "no data dir given (--data-dir is empty)"},
		{args: []string{"leases", "--data-dir", ""}, code: 1, stderr: "no data dir given"},
	}
	for _, tc := range cases {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, stdout, stderr := run4(t, nil, tc.args...)
			if code != tc.code {
				t.Errorf("exit = %d, want %d (stderr %q)", code, tc.code, stderr)
			}
			if tc.stdout != "" && !strings.Contains(stdout, tc.stdout) {
				t.Errorf("stdout = %q, want it to contain %q", stdout, tc.stdout)
			}
			if tc.stderr != "" && !strings.Contains(stderr, tc.stderr) {
				t.Errorf("stderr = %q, want it to contain %q", stderr, tc.stderr)
			}
			if strings.Contains(stdout, `"code"`) {
				t.Errorf("CLI printed a CNI error: %q", stdout)
			}
		})
	}
}

// One network whose directory is unsafe does not stop the others: gc,
// leases and metrics go through the good ones, say which one they skipped
// and why, and exit 1.
func TestCLISkipsOnlyTheBadNetwork(t *testing.T) {
	dataDir := t.TempDir()
	for _, dir := range []string{"good", "planted", ".nomad-bridge-cni"} {
		if err := os.Mkdir(filepath.Join(dataDir, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dataDir, "good", "10.1.2.3"), []byte("c1\r\neth0"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dataDir, "planted", "lock"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	// From before this boot: gc would release it.
	old := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	if err := os.Chtimes(filepath.Join(dataDir, "good", "10.1.2.3"), old, old); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(t.TempDir(), filepath.Join(dataDir, ".nomad-bridge-cni", "planted")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		good string
	}{
		{[]string{"leases", "--data-dir", dataDir}, "10.1.2.3"},
		{[]string{"gc", "--dry-run", "--data-dir", dataDir}, "would release good c1/eth0 10.1.2.3"},
		{[]string{"metrics", "--data-dir", dataDir}, `network="good"`},
	} {
		code, stdout, stderr := run4(t, nil, tc.args...)
		if code != 1 || !strings.Contains(stderr, "network planted skipped") || !strings.Contains(stdout, tc.good) {
			t.Errorf("%v: exit %d\nstdout: %s\nstderr: %s\nwant exit 1, planted skipped, and %q", tc.args, code, stdout, stderr, tc.good)
		}
	}
}
