// Package prometheus tests the shipped alerting rules
// (packaging/prometheus/nomad-bridge-cni.rules.yml) with promtool (Debian's
// prometheus package): `promtool check rules`, then `promtool test rules`
// over input series built from testdata/*.prom, the plugin's `metrics`
// output in each situation (test/e2e/prometheus_test.go checks that a real
// network's output has the same series), as node_exporter's textfile
// collector exposes them.
package prometheus

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/testhost"
)

const (
	instance = `instance="node1:9100",job="node"`
	textfile = "/var/lib/prometheus/node-exporter/nomad-bridge-cni.prom"
	minutes  = 40
)

// alert is one expected firing alert: its name and labels beyond
// alertname and the scrape's instance and job.
type alert struct {
	name   string
	labels map[string]string
}

type scenario struct {
	fixture string
	// mtime is the textfile's node_textfile_mtime_seconds values (promtool
	// expanding notation); "" drops the series.
	mtime string
	// counter is the values of add_refusals_total ("": the fixture's).
	counter string
	// firing maps an evaluation time to the alerts firing then; every
	// other alert must not fire then.
	firing map[string][]alert
}

var web = map[string]string{"network": "web"}

func TestRules(t *testing.T) {
	// promtool needs no root: MissingTools would ask for it.
	if _, err := exec.LookPath("promtool"); err != nil {
		testhost.SkipOrFail(t, "promtool (Debian package prometheus) is not installed: make test-prom installs it")
	}
	repo := testhost.RepoDir(t)
	rules := filepath.Join(repo, "packaging/prometheus/nomad-bridge-cni.rules.yml")
	if out, err := exec.Command("promtool", "check", "rules", rules).CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	fresh := fmt.Sprintf("0+60x%d", minutes) // rewritten every minute
	with := func(m map[string]string, k, v string) map[string]string {
		out := map[string]string{k: v}
		for a, b := range m {
			out[a] = b
		}
		return out
	}
	scenarios := map[string]scenario{
		"healthy": {fixture: "healthy", mtime: fresh, firing: map[string][]alert{"30m": nil}},
		// Free 19 of 254: warning after its 5 minutes, never critical.
		"filling": {fixture: "filling", mtime: fresh, firing: map[string][]alert{
			"4m": nil, "6m": {{"NomadBridgeCNIAddressesLow", web}}, "30m": {{"NomadBridgeCNIAddressesLow", web}}}},
		"exhausted": {fixture: "exhausted", mtime: fresh, firing: map[string][]alert{
			"1m": nil, "3m": {{"NomadBridgeCNIAddressesExhausted", web}},
			"6m": {{"NomadBridgeCNIAddressesExhausted", web}, {"NomadBridgeCNIAddressesLow", web}}}},
		// Two gc periods: nothing at 9 minutes, both at 11.
		"leak": {fixture: "leak", mtime: fresh, firing: map[string][]alert{
			"9m":  nil,
			"11m": {{"NomadBridgeCNIStaleAttachments", with(web, "state", "stale")}, {"NomadBridgeCNIOrphanNATRules", web}}}},
		// The timer died at once: the file is 300 s old at 5 minutes.
		"dead timer": {fixture: "healthy", mtime: fmt.Sprintf("0x%d", minutes), firing: map[string][]alert{
			"5m": nil, "7m": {{"NomadBridgeCNIMetricsStale", map[string]string{"file": textfile}}}}},
		// Written until minute 10, then gone: 5 minutes of lookback, 5 of for.
		"absent": {fixture: "healthy", mtime: "0+60x10", firing: map[string][]alert{
			"12m": nil, "25m": {{"NomadBridgeCNIMetricsAbsent", map[string]string{"file": textfile}}}}},
		"not tmpfs": {fixture: "notmpfs", mtime: fresh, firing: map[string][]alert{
			"4m": nil, "6m": {{"NomadBridgeCNIDataDirNotTmpfs", with(web, "data_dir", "/var/lib/cni/networks")}}}},
		// 0 until minute 10, then 2: fires while the 15 minutes see the rise.
		"refused": {fixture: "refused", mtime: fresh, counter: fmt.Sprintf("0x10 2x%d", minutes-10), firing: map[string][]alert{
			"9m": nil, "11m": {{"NomadBridgeCNILiveNamespaceRefusals", with(web, "reason", "live-namespace")}}, "30m": nil}},
	}
	alerts := alertNames(t, rules)
	var b strings.Builder
	// The annotations aside (promtool compares them whole): check rules
	// has parsed their templates; here the expressions, for and labels.
	stripped := filepath.Join(t.TempDir(), "rules.yml")
	if err := os.WriteFile(stripped, []byte(withoutAnnotations(t, rules)), 0o644); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(&b, "rule_files: [%q]\nevaluation_interval: 1m\ntests:\n", stripped)
	names := make([]string, 0, len(scenarios))
	for n := range scenarios {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		sc := scenarios[n]
		fmt.Fprintf(&b, "  # %s\n  - interval: 1m\n    input_series:\n", n)
		for _, s := range readFixture(t, filepath.Join(repo, "test/prometheus/testdata", sc.fixture+".prom")) {
			values := fmt.Sprintf("%sx%d", s.value, minutes)
			if sc.counter != "" && strings.HasPrefix(s.series, "nomad_bridge_cni_add_refusals_total") {
				values = sc.counter
			}
			fmt.Fprintf(&b, "      - series: '%s'\n        values: '%s'\n", withInstance(s.series), values)
		}
		fmt.Fprintf(&b, "      - series: 'node_textfile_scrape_error{%s}'\n        values: '0x%d'\n", instance, minutes)
		if sc.mtime != "" {
			fmt.Fprintf(&b, "      - series: 'node_textfile_mtime_seconds{file=%q,%s}'\n        values: '%s'\n", textfile, instance, sc.mtime)
		}
		b.WriteString("    alert_rule_test:\n")
		for at, firing := range sc.firing {
			for _, name := range alerts {
				fmt.Fprintf(&b, "      - eval_time: %s\n        alertname: %s\n        exp_alerts:", at, name)
				n := 0
				for _, a := range firing {
					if a.name != name {
						continue
					}
					n++
					fmt.Fprintf(&b, "\n          - exp_labels: {severity: %s, instance: \"node1:9100\", job: node", severityOf(name))
					for k, v := range a.labels {
						fmt.Fprintf(&b, ", %s: %q", k, v)
					}
					b.WriteString("}")
				}
				if n == 0 {
					b.WriteString(" []")
				}
				b.WriteString("\n")
			}
		}
	}
	test := filepath.Join(t.TempDir(), "rules.test.yml")
	if err := os.WriteFile(test, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("promtool", "test", "rules", test).CombinedOutput(); err != nil {
		t.Fatalf("promtool test rules: %v\n%s\ntest file:\n%s", err, out, b.String())
	}
}

func severityOf(alert string) string {
	if alert == "NomadBridgeCNIAddressesExhausted" {
		return "critical"
	}
	return "warning"
}

// withInstance adds the scrape's labels to a series.
func withInstance(series string) string {
	if i := strings.Index(series, "{"); i >= 0 {
		return series[:i+1] + instance + "," + series[i+1:]
	}
	return series + "{" + instance + "}"
}

type sample struct{ series, value string }

// readFixture reads the samples of a `metrics` output.
func readFixture(t *testing.T, path string) []sample {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []sample
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		out = append(out, sample{series: line[:i], value: line[i+1:]})
	}
	if err := sc.Err(); err != nil || len(out) == 0 {
		t.Fatalf("%s: %v, %d samples", path, err, len(out))
	}
	return out
}

// alertNames are the rules file's alerts, so that a new alert is checked
// not to fire in every scenario without being listed here.
func alertNames(t *testing.T, rules string) []string {
	t.Helper()
	b, err := os.ReadFile(rules)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for line := range strings.Lines(string(b)) {
		if n, ok := strings.CutPrefix(strings.TrimSpace(line), "- alert: "); ok {
			names = append(names, n)
		}
	}
	return names
}

// withoutAnnotations is the rules file without its annotations blocks.
func withoutAnnotations(t *testing.T, rules string) string {
	t.Helper()
	b, err := os.ReadFile(rules)
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	skip := -1
	for line := range strings.Lines(string(b)) {
		indent := len(line) - len(strings.TrimLeft(line, " "))
		if skip >= 0 && (indent > skip || strings.TrimSpace(line) == "") {
			continue
		}
		skip = -1
		if strings.TrimSpace(line) == "annotations:" {
			skip = indent
			continue
		}
		out.WriteString(line)
	}
	return out.String()
}
