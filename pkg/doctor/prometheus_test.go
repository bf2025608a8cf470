package doctor

import (
	"os"
	"path/filepath"
	"testing"
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
}
