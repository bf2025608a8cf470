package skel

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/testhost"
)

// firstSemver is what Nomad's fingerprint records: the first token of the
// combined output that parses as a version.
func firstSemver(out string) string {
	re := regexp.MustCompile(`^v?\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$`)
	for _, tok := range strings.Fields(out) {
		if re.MatchString(tok) {
			return tok
		}
	}
	return ""
}

func TestAboutUnderTheDelegatesNameLeadsWithTheDelegatesVersion(t *testing.T) {
	dir := t.TempDir()
	bridge := filepath.Join(dir, "bridge")
	script := "#!/bin/sh\necho 'CNI bridge plugin v1.10.0' >&2\necho 'CNI protocol versions supported: 0.1.0, 0.2.0, 1.1.0' >&2\n"
	if err := os.WriteFile(bridge, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"CNI_PATH": dir}
	// One buffer for both streams, as Nomad's CombinedOutput reads them.
	var combined bytes.Buffer
	code := runTool("bridge", nil, func(k string) string { return env[k] }, &combined, &combined)
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, combined.String())
	}
	if got := firstSemver(combined.String()); got != "v1.10.0" {
		t.Errorf("first version printed = %q, want the delegate's v1.10.0:\n%s", got, combined.String())
	}
	if !strings.Contains(combined.String(), About()+", in front of "+bridge) {
		t.Errorf("the plugin's own line is missing:\n%s", combined.String())
	}

	// An unstamped delegate: the runtime reads what it would read without
	// the plugin (Nomad takes 1.1.0 from the protocol line), not ours.
	script = "#!/bin/sh\necho 'CNI bridge plugin version unknown' >&2\necho 'CNI protocol versions supported: 0.1.0, 0.2.0, 1.1.0' >&2\n"
	if err := os.WriteFile(bridge, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	combined.Reset()
	runTool("bridge", nil, func(k string) string { return env[k] }, &combined, &combined)
	if got := firstSemver(combined.String()); got == Version {
		t.Errorf("unstamped delegate: the first version printed is the plugin's own:\n%s", combined.String())
	}
}

func TestAboutUnderAnotherNameWithoutADelegateIsItsOwn(t *testing.T) {
	env := map[string]string{"CNI_PATH": t.TempDir()}
	var out, errOut bytes.Buffer
	code := runTool("nbc", nil, func(k string) string { return env[k] }, &out, &errOut)
	if code != 0 || out.String() != About()+"\n" {
		t.Errorf("exit %d, stdout %q; want the plugin's own about line", code, out.String())
	}
}

// Without CNI_PATH (Nomad's fingerprint sets none) the front copy cannot
// know which bridge the runtime's path makes it call: it names none and
// prints no token that parses as a version, so Nomad keeps the version of
// the reference bridge in cni_path; with a stamped bridge in what would
// have been the default directories, it still names none.
func TestAboutUnderTheDelegatesNameWithoutCNIPathNamesNoDelegate(t *testing.T) {
	var combined bytes.Buffer
	code := runTool("bridge", nil, func(string) string { return "" }, &combined, &combined)
	out := combined.String()
	if code != 0 || !strings.Contains(out, "installed as bridge") || !strings.Contains(out, "none is set here") {
		t.Errorf("exit %d:\n%s", code, out)
	}
	nomadSemver := regexp.MustCompile(`^v?[0-9]+(\.[0-9]+){0,2}(-[0-9A-Za-z\-~]+(\.[0-9A-Za-z\-~]+)*|-?[A-Za-z\-~]+[0-9A-Za-z\-~]*(\.[0-9A-Za-z\-~]+)*)?(\+[0-9A-Za-z\-~]+(\.[0-9A-Za-z\-~]+)*)?$`)
	for _, tok := range strings.Fields(out) {
		if nomadSemver.MatchString(tok) {
			t.Errorf("token %q parses as a version (Nomad would record it):\n%s", tok, out)
		}
	}
	if strings.Contains(out, "in front of") {
		t.Errorf("names a delegate it cannot know:\n%s", out)
	}
}

// A delegate that leaves a child holding its output open does not keep
// the about line (Nomad's fingerprint waits for it) past its bound
// (regression: it waited for the child to exit).
func TestAboutDoesNotWaitForTheDelegatesChildren(t *testing.T) {
	dir := t.TempDir()
	testhost.ScriptLeavingAChild(t, filepath.Join(dir, "bridge"), "CNI bridge plugin v1.10.0")
	var out bytes.Buffer
	start := time.Now()
	runTool("bridge", nil, func(k string) string { return map[string]string{"CNI_PATH": dir}[k] }, &out, &out)
	if took := time.Since(start); took > 15*time.Second {
		t.Errorf("the about line took %v", took)
	}
	if !strings.Contains(out.String(), "v1.10.0") {
		t.Errorf("about line %q lacks what the delegate printed", out.String())
	}
}
