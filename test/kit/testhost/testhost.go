// Package testhost is what every root-needing test suite of the repository
// (test/e2e, test/podman, the benchmark harness) asks of the host: where
// the repository and the built binaries are, whether a prerequisite is
// missing (a skip outside CI, a failure in CI), and which prefixes are
// already routed, so that a test network overlaps none of them.
package testhost

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// SkipOrFail skips the test with msg, or fails it when CI is set: a CI run
// must never pass by skipping.
func SkipOrFail(t testing.TB, msg string) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatal(msg + " (CI is set, so this is a failure, not a skip)")
	}
	t.Skip(msg)
}

// MissingTools lists the tools not in PATH, and root if the test is not
// running as root.
func MissingTools(tools ...string) []string {
	var missing []string
	if uid := os.Geteuid(); uid != 0 {
		missing = append(missing, fmt.Sprintf("root (running as uid %d)", uid))
	}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool+" in PATH")
		}
	}
	return missing
}

// RepoDir is the repository root: `go test` runs a test binary in its
// package's directory, two levels below it (test/<suite>).
func RepoDir(t testing.TB) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatalf("getwd: %v", err)
	}
	return filepath.Clean(filepath.Join(wd, "..", ".."))
}

// BinDir is NBC_BIN_DIR (set by the Makefile) or the repository's bin/.
func BinDir(t testing.TB) string {
	t.Helper()
	dir := os.Getenv("NBC_BIN_DIR")
	if dir == "" {
		dir = filepath.Join(RepoDir(t), "bin")
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		t.Fatalf("bin dir %q: %v", dir, err)
	}
	return abs
}

// RequireBinaries fails (never skips) when a binary is missing: missing
// build output is a broken build, not a host without prerequisites.
func RequireBinaries(t testing.TB, dir string, names ...string) {
	t.Helper()
	for _, name := range names {
		p := filepath.Join(dir, name)
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatalf("%s is missing (%v): run `make build plugins` or set NBC_BIN_DIR", p, err)
		}
		if fi.Mode()&0o111 == 0 {
			t.Fatalf("%s is not executable", p)
		}
	}
}

// RoutedPrefixes lists every destination in every routing table of the
// host, IPv4 and IPv6.
func RoutedPrefixes() ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, fam := range []string{"-4", "-6"} {
		raw, err := exec.Command("ip", "-j", fam, "route", "show", "table", "all").Output()
		if err != nil {
			return nil, fmt.Errorf("ip %s route: %w", fam, err)
		}
		var routes []struct {
			Dst string `json:"dst"`
		}
		if err := json.Unmarshal(raw, &routes); err != nil {
			return nil, fmt.Errorf("parse ip %s route: %w", fam, err)
		}
		for _, r := range routes {
			if p, err := netip.ParsePrefix(r.Dst); err == nil {
				out = append(out, p.Masked())
			} else if a, err := netip.ParseAddr(r.Dst); err == nil {
				out = append(out, netip.PrefixFrom(a, a.BitLen()))
			}
		}
	}
	return out, nil
}

// Prereqs is a suite's prerequisites, checked once per test binary: Check
// lists what is missing, What names the suite and Hint says how CI
// installs it.
type Prereqs struct {
	What, Hint string
	Check      func() []string
	once       sync.Once
	missing    []string
}

// Require skips the test (fails it in CI) when a prerequisite is missing.
func (p *Prereqs) Require(t testing.TB) {
	t.Helper()
	p.once.Do(func() { p.missing = p.Check() })
	if len(p.missing) > 0 {
		msg := p.What + " missing: " + strings.Join(p.missing, "; ")
		if p.Hint != "" {
			msg += " (" + p.Hint + ")"
		}
		SkipOrFail(t, msg)
	}
}
