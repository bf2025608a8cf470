package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// With "logFile" in the entry, the real plugin writes what a sweep
// released and what it refused as JSON lines there, each naming the verb
// and attachment, besides its stderr; without it, no file appears.
func TestLogFileRecordsReleasesAndRefusals(t *testing.T) {
	e := newEnv(t)
	e.requirePlugin(t)
	logFile := filepath.Join(t.TempDir(), "logs", "nbc.log")
	if err := os.MkdirAll(filepath.Dir(logFile), 0o755); err != nil {
		t.Fatal(err)
	}
	conf := e.reclaimConf(t, "nomad.conflist")
	entry := entryOfType(t, conf, pluginType)
	entry["logFile"] = logFile
	entry["checkSweepInterval"] = "0s"
	// The plugin first in the chain: loopback would refuse the host's
	// namespace below before the plugin sees it.
	var chain []any
	for _, p := range pluginEntries(t, conf) {
		if p["type"] != "loopback" {
			chain = append(chain, p)
		}
	}
	conf["plugins"] = chain
	e.writeConflist(t, conf)

	a, b := e.addNetns(t, "a"), e.addNetns(t, "b")
	pa, _ := parseResult(t, e.mustCNI(t, "add", a, "")).addrIn(t, e.subnet4)
	e.mustCNI(t, "add", b, "")
	e.mustKillNetns(t, a)
	if _, stderr, err := e.cnitool("check", b, ""); err != nil {
		t.Fatalf("CHECK of B: %v\n%s", err, stderr)
	}
	// A re-ADD into the host's own namespace is refused by every verb.
	host := netns{name: "host", path: "/proc/1/ns/net", cid: "host-" + e.netName}
	_, refusedErr, err := e.cnitool("add", host, "")
	if err == nil {
		t.Fatal("ADD into the host's namespace succeeded")
	}

	b2, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	var release, refusal map[string]any
	for line := range strings.Lines(string(b2)) {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		switch m["event"] {
		case "release":
			release = m
		case "refusal":
			refusal = m
		}
	}
	if release == nil || release["command"] != "CHECK" || release["containerID"] != b.cid ||
		!strings.Contains(release["message"].(string), "released "+a.cid+"/eth0 "+pa.Addr().String()) {
		t.Errorf("no release of A by B's CHECK in the log:\n%s", b2)
	}
	if refusal == nil || refusal["command"] != "ADD" || refusal["code"] == nil {
		t.Errorf("no refusal with its code in the log (the ADD said %v: %s):\n%s", err, refusedErr, b2)
	}
}
