package skel

import (
	"bytes"
	"io"
	"regexp"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/conflists"
)

func run4(t *testing.T, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := runTool(conflists.PluginName, args, func(k string) string { return env[k] }, &stdout, &stderr)
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

// With arguments the binary is the operator's CLI (pkg/cli), never CNI.
func TestArgumentsRunTheCLI(t *testing.T) {
	code, stdout, stderr := run4(t, nil, "--version")
	if code != 0 || stdout != About()+"\n" || stderr != "" {
		t.Errorf("--version: exit %d, stdout %q, stderr %q; want the about line", code, stdout, stderr)
	}
	code, stdout, _ = run4(t, nil, "--bogus")
	if code != 2 || strings.Contains(stdout, `"code"`) {
		t.Errorf("--bogus: exit %d, stdout %q; want a usage error, no CNI error", code, stdout)
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
	// An in-memory file, not a pipe fed by a goroutine: every verb pays
	// for what it starts (BENCHMARKS.md, own time per verb).
	if st, err := r.Stat(); err != nil || !st.Mode().IsRegular() {
		t.Errorf("stdin passed on in a %v (%v), want a memfd", st.Mode(), err)
	}
	if _, err := capStdin(strings.NewReader(strings.Repeat("x", 65)), 64); err == nil || err.Code != types.ErrDecodingFailure || !strings.Contains(err.Msg, "larger than 64 bytes") {
		t.Errorf("oversized stdin: %v", err)
	}
	// Was reported by skel as config version "0.1.0".
	if _, err := capStdin(strings.NewReader(`{"cniVersion":"","name":"n"}`), 64); err == nil || err.Code != types.ErrIncompatibleCNIVersion || !strings.Contains(err.Msg, `"cniVersion" is empty`) || strings.Contains(err.Msg, "0.1.0") {
		t.Errorf("empty cniVersion: %v", err)
	}
}

// The fallback where memfd_create is refused passes the same bytes on.
func TestPipeWithPassesTheBytesOn(t *testing.T) {
	r, err := pipeWith([]byte(`{"name":"n"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if got, _ := io.ReadAll(r); string(got) != `{"name":"n"}` {
		t.Errorf("passed on %q", got)
	}
}
