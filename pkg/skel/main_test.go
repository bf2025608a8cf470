package skel

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
)

func run4(t *testing.T, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(PluginName, args, func(k string) string { return env[k] }, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// Nomad runs every executable in cni_path with no arguments and records the
// first semver it prints; the reference plugins print the same shape.
func TestNoArgumentsPrintsAboutLine(t *testing.T) {
	code, stdout, stderr := run4(t, nil)
	if code != 0 {
		t.Fatalf("exit = %d, want 0", code)
	}
	if !regexp.MustCompile(`^CNI nomad-bridge-cni plugin v\d+\.\d+\.\d+\S*\n$`).MatchString(stdout) {
		t.Errorf("stdout = %q, want the about line", stdout)
	}
	if !strings.Contains(stderr, "CNI protocol versions supported: 0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0") {
		t.Errorf("stderr = %q, want the supported versions", stderr)
	}
}

func TestAboutCarriesStampedVersion(t *testing.T) {
	old := Version
	t.Cleanup(func() { Version = old })
	Version = "v9.8.7-rc.1"
	if got := About(); got != "CNI nomad-bridge-cni plugin v9.8.7-rc.1" {
		t.Errorf("About() = %q", got)
	}
}

func TestSupportedVersions(t *testing.T) {
	got := strings.Join(SupportedVersions.SupportedVersions(), ",")
	if got != "0.3.0,0.3.1,0.4.0,1.0.0,1.1.0" {
		t.Errorf("supported versions = %s", got)
	}
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

func TestCapStdin(t *testing.T) {
	r, err := capStdin(strings.NewReader(`{"name":"n"}`), 64)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(r)
	if string(got) != `{"name":"n"}` {
		t.Errorf("passed on %q", got)
	}
	if _, err := capStdin(strings.NewReader(strings.Repeat("x", 65)), 64); err == nil || err.Code != types.ErrDecodingFailure || !strings.Contains(err.Msg, "larger than 64 bytes") {
		t.Errorf("oversized stdin: %v", err)
	}
	// Was reported by skel as config version "0.1.0".
	if _, err := capStdin(strings.NewReader(`{"cniVersion":"","name":"n"}`), 64); err == nil || err.Code != types.ErrIncompatibleCNIVersion || !strings.Contains(err.Msg, `"cniVersion" is empty`) || strings.Contains(err.Msg, "0.1.0") {
		t.Errorf("empty cniVersion: %v", err)
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
