package doctor

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/dirstate"
)

func TestPrometheusRulesFinding(t *testing.T) {
	dir := t.TempDir()
	rules := filepath.Join(dir, "share/nomad-bridge-cni.rules.yml")
	config := filepath.Join(dir, "prometheus.yml")
	write := func(p, s string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	check := func(what string, want Level) {
		t.Helper()
		fs := checkPrometheus(rules, config)
		if len(fs) != 1 || fs[0].Level != want {
			t.Errorf("%s: %+v, want one %s finding", what, fs, want)
		}
	}
	check("no rules file", Warn)
	write(rules, "groups: []\n")
	check("no prometheus.yml", OK)
	write(config, "global:\n  scrape_interval: 15s\nscrape_configs:\n  - job_name: node\n    rule_files_note: "+rules+"\n")
	check("rule_files missing", Warn)
	write(config, "rule_files:\n  - /etc/prometheus/other.yml\n")
	check("rule_files without ours", Warn)
	write(config, "# ours\nrule_files:\n  - /etc/prometheus/other.yml\n  - \""+rules+"\"\nscrape_configs: []\n")
	check("rule_files with ours", OK)
	write(config, "rule_files:\n  - '"+filepath.Join(dir, "share/*.yml")+"'\n")
	check("rule_files with a glob", OK)
	write(config, "rule_files:\n  - /etc/prometheus/other.yml\nscrape_configs:\n  - "+rules+"\n")
	check("ours outside rule_files", Warn)

	// Valid YAML a line scan misread (regression: each was a warning).
	write(config, "rule_files:\n- /etc/prometheus/other.yml\n- "+rules+"\nscrape_configs: []\n")
	check("items at the key's own indent", OK)
	write(config, "rule_files:\n  - "+rules+" # nomad-bridge-cni\n")
	check("an item with a comment", OK)
	write(config, "rule_files:\n  - '"+rules+"' # nomad-bridge-cni\n")
	check("a quoted item with a comment", OK)
	write(config, "rule_files: [/etc/prometheus/other.yml, \""+rules+"\"] # ours\n")
	check("the flow form", OK)
	write(config, "rule_files:\n  - share/nomad-bridge-cni.rules.yml\n")
	check("an entry relative to prometheus.yml's directory", OK)
	write(config, "rule_files:\n  - 'share/*.yml'\n")
	check("a relative glob", OK)
	// And no match where there is none.
	write(config, "rule_files:\n- /etc/prometheus/other.yml\nscrape_configs:\n- "+rules+"\n")
	check("ours at column 0 under another key", Warn)
	write(config, "rule_files:\n  - /etc/prometheus/other.yml # "+rules+"\n")
	check("ours in a comment only", Warn)
	write(config, "rule_files: [/etc/prometheus/other.yml]\n")
	check("the flow form without ours", Warn)
	write(config, "rule_files:\n  - nomad-bridge-cni.rules.yml\n")
	check("ours relative to another directory", Warn)
	// A form the scan does not read is no warning: it says it cannot tell.
	write(config, "rule_files: [\n  "+rules+"\n]\n")
	if fs := checkPrometheus(rules, config); len(fs) != 1 || fs[0].Level != OK || !strings.Contains(fs[0].Message, "could not tell") {
		t.Errorf("a flow list over lines: %+v, want one OK finding that could not tell", fs)
	}
}

// The doctor reads Nomad's configuration files and prometheus.yml within
// bounds: a huge file is not read whole, and a FIFO in prometheus.yml's
// place never hangs it (regression: os.ReadFile read either whole, and
// blocked on the FIFO for ever).
func TestDoctorReadsConfigFilesWithinBounds(t *testing.T) {
	huge := func(path string) {
		t.Helper()
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := f.Truncate(512 << 20); err != nil { // sparse: nothing on disk
			t.Fatal(err)
		}
	}
	allocated := func(fn func()) uint64 {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		fn()
		runtime.ReadMemStats(&after)
		return after.TotalAlloc - before.TotalAlloc
	}

	nomad := t.TempDir()
	if err := os.WriteFile(filepath.Join(nomad, "10-client.hcl"), []byte("client {\n  cni_path = \"/opt/nbc/bin\"\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	huge(filepath.Join(nomad, "20-huge.hcl"))
	var nc NomadClient
	if n := allocated(func() { nc, _ = readNomadConfigDir(nomad) }); n > 32<<20 {
		t.Errorf("reading Nomad's configuration allocated %d MiB", n>>20)
	}
	if strings.Join(nc.CNIPath, ":") != "/opt/nbc/bin" {
		t.Errorf("cni_path %v, want the one of 10-client.hcl", nc.CNIPath)
	}

	dir := t.TempDir()
	rules, config := filepath.Join(dir, "rules.yml"), filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(rules, []byte("groups: []\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	huge(config)
	if n := allocated(func() { checkPrometheus(rules, config) }); n > 32<<20 {
		t.Errorf("reading a huge prometheus.yml allocated %d MiB", n>>20)
	}
	if err := os.Remove(config); err != nil {
		t.Fatal(err)
	}
	dirstate.PlantFIFO(t, config)
	done := make(chan []Finding, 1)
	go func() { done <- checkPrometheus(rules, config) }()
	select {
	case fs := <-done:
		if len(fs) != 1 || !strings.Contains(fs[0].Message, "not a regular file") {
			t.Errorf("a FIFO as prometheus.yml: %+v, want one finding that says what it is", fs)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the doctor hangs on a FIFO as prometheus.yml")
	}
}
