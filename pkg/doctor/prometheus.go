package doctor

import (
	"os"
	"path/filepath"
	"strings"
)

// The packaged alerting rules, and where Debian's Prometheus reads its
// configuration.
const (
	PrometheusRules  = "/usr/share/nomad-bridge-cni/prometheus/nomad-bridge-cni.rules.yml"
	PrometheusConfig = "/etc/prometheus/prometheus.yml"
)

// checkPrometheus says whether the rules file is installed and whether a
// local Prometheus names it in rule_files: a warning at most, since the
// Prometheus that alerts may well run elsewhere. prometheus.yml is scanned
// line by line (no YAML parser is linked for this): the entries of a
// top-level rule_files list, each a path or a glob.
func checkPrometheus(rules, config string) []Finding {
	if _, err := os.Stat(rules); err != nil {
		return []Finding{{Level: Warn, Check: "prometheus", Subject: rules, Message: "the alerting rules are not installed (a tarball or package older than them?)", Fix: "install the package, or copy packaging/prometheus/nomad-bridge-cni.rules.yml there"}}
	}
	b, err := os.ReadFile(config)
	if err != nil {
		return []Finding{{Level: OK, Check: "prometheus", Subject: rules, Message: "alerting rules installed; no local Prometheus (" + config + "): add them to rule_files where Prometheus runs"}}
	}
	in := false
	for line := range strings.Lines(string(b)) {
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "#") {
			continue
		}
		top := !strings.HasPrefix(line, " ") && !strings.HasPrefix(line, "\t")
		if top {
			in = strings.HasPrefix(trimmed, "rule_files:")
			continue
		}
		item, ok := strings.CutPrefix(trimmed, "- ")
		if !in || !ok {
			continue
		}
		item = strings.Trim(strings.TrimSpace(item), `"'`)
		if match, _ := filepath.Match(item, rules); match || item == rules {
			return []Finding{{Level: OK, Check: "prometheus", Subject: config, Message: "rule_files names the alerting rules " + rules}}
		}
	}
	return []Finding{{Level: Warn, Check: "prometheus", Subject: config, Message: "rule_files does not name the alerting rules " + rules, Fix: "add it to rule_files, then systemctl reload prometheus (docs/operator.md#prometheus-alerts)"}}
}
