package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

type doctorDoc struct {
	OK       bool `json:"ok"`
	Findings []struct {
		Level   string `json:"level"`
		Check   string `json:"check"`
		Subject string `json:"subject"`
		Message string `json:"message"`
	} `json:"findings"`
}

func (e *testEnv) doctor(t *testing.T) (doctorDoc, int) {
	t.Helper()
	cmd := exec.Command(filepath.Join(e.bin, pluginType), "doctor", "--json", "--conf-dir", e.confDir, "--cni-path", e.bin)
	cmd.Env = cniEnv()
	out, err := cmd.Output()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("doctor: %v", err)
	}
	var doc doctorDoc
	if err := json.Unmarshal(out, &doc); err != nil {
		t.Fatalf("doctor --json: %v\n%s", err, out)
	}
	return doc, code
}

// TestDoctor runs `doctor` on this host with the test's conflist: the
// network, its plugins (the bin dir's, stamped) and its tmpfs dataDir are
// fine; a second network on the same bridge and subnet is a clash, exit 1.
func TestDoctor(t *testing.T) {
	e := newEnv(t)
	e.requirePlugin(t)
	conf := e.reclaimConf(t, "nomad.conflist")
	e.writeConflist(t, conf)
	ns := e.addNetns(t, "a")
	e.mustCNI(t, "add", ns, "")

	doc, _ := e.doctor(t)
	mine := func(f string) bool {
		return strings.Contains(f, e.netName) || strings.Contains(f, e.bridge) || strings.Contains(f, e.dataDir)
	}
	seen := map[string]bool{}
	for _, f := range doc.Findings {
		if !mine(f.Subject+" "+f.Message) && !strings.HasPrefix(f.Subject, e.bin) {
			continue
		}
		seen[f.Check] = true
		if f.Level != "ok" {
			t.Errorf("doctor finds a problem with the test's own setup: %+v", f)
		}
	}
	for _, c := range []string{"conflist", "plugin", "dataDir", "state"} {
		if !seen[c] {
			t.Errorf("doctor said nothing of the test's %s: %+v", c, doc.Findings)
		}
	}

	other := e.confFor(t, "minimal.conflist")
	other["name"] = e.netName + "-x"
	bareBridge(t, other, e.persistDir)
	raw, _ := json.Marshal(other)
	if err := os.WriteFile(filepath.Join(e.confDir, "99-clash.conflist"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	doc, code := e.doctor(t)
	clash := false
	for _, f := range doc.Findings {
		if f.Check == "clash" && f.Level == "error" && strings.Contains(f.Message, e.netName+"-x") {
			clash = true
		}
	}
	if code != 1 || doc.OK || !clash {
		t.Errorf("doctor with two networks on bridge %s: exit %d, ok %v, clash found %v", e.bridge, code, doc.OK, clash)
	}
	e.mustCNI(t, "del", ns, "")
}
