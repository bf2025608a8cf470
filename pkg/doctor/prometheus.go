package doctor

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/internal/statefile"
)

// The packaged alerting rules, and where Debian's Prometheus reads its
// configuration.
const (
	PrometheusRules  = "/usr/share/nomad-bridge-cni/prometheus/nomad-bridge-cni.rules.yml"
	PrometheusConfig = "/etc/prometheus/prometheus.yml"
)

// maxPrometheusConfig bounds what is read of prometheus.yml, a few KiB
// on most hosts: a larger one is not scanned, and the finding says why.
const maxPrometheusConfig = 4 << 20

// checkPrometheus says whether the rules file is installed and whether a
// local Prometheus names it in rule_files: a warning at most, since the
// Prometheus that alerts may well run elsewhere. prometheus.yml is scanned
// line by line (no YAML parser is linked for this): the entries of a
// top-level rule_files list, each a path or a glob, relative ones to the
// file's directory as Prometheus resolves them. The list is read in block
// form (its items indented or not) or in flow form on the key's line;
// another form is said to be one it could not tell, not warned about.
func checkPrometheus(rules, config string) []Finding {
	if _, err := os.Stat(rules); err != nil {
		return []Finding{{Level: Warn, Check: "prometheus", Subject: rules, Message: "the alerting rules are not installed (a tarball or package older than them?)", Fix: "install the package, or copy packaging/prometheus/nomad-bridge-cni.rules.yml there"}}
	}
	b, err := statefile.ReadConfig(config, maxPrometheusConfig)
	if errors.Is(err, fs.ErrNotExist) {
		return []Finding{{Level: OK, Check: "prometheus", Subject: rules, Message: "alerting rules installed; no local Prometheus (" + config + "): add them to rule_files where Prometheus runs"}}
	}
	if err != nil {
		return []Finding{{Level: OK, Check: "prometheus", Subject: config, Message: "could not tell whether rule_files names the alerting rules " + rules + " (" + err.Error() + "): see that it does"}}
	}
	names := func(entry string) bool {
		entry = scalar(entry)
		if !filepath.IsAbs(entry) {
			entry = filepath.Join(filepath.Dir(config), entry)
		}
		match, _ := filepath.Match(entry, rules)
		return match || entry == rules
	}
	named := []Finding{{Level: OK, Check: "prometheus", Subject: config, Message: "rule_files names the alerting rules " + rules}}
	in, unsure := false, false
	for line := range strings.Lines(string(b)) {
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "#") {
			continue
		}
		// A list's items may sit at its key's indent: a top-level key is
		// a line at column 0 that is no item.
		item, isItem := strings.CutPrefix(trimmed, "- ")
		if !isItem && !strings.HasPrefix(line, " ") && !strings.HasPrefix(line, "\t") {
			var rest string
			rest, in = strings.CutPrefix(trimmed, "rule_files:")
			switch rest = scalar(rest); {
			case !in || rest == "":
			case strings.HasPrefix(rest, "[") && strings.HasSuffix(rest, "]"):
				if slices.ContainsFunc(strings.Split(rest[1:len(rest)-1], ","), names) {
					return named
				}
			default:
				unsure = true
			}
			continue
		}
		switch {
		case !in:
		case !isItem:
			unsure = true
		case names(item):
			return named
		}
	}
	if unsure {
		return []Finding{{Level: OK, Check: "prometheus", Subject: config, Message: "could not tell whether rule_files names the alerting rules " + rules + " (a form of YAML this check does not read): see that it does"}}
	}
	return []Finding{{Level: Warn, Check: "prometheus", Subject: config, Message: "rule_files does not name the alerting rules " + rules, Fix: "add it to rule_files, then systemctl reload prometheus (docs/operator.md#prometheus-alerts)"}}
}

// scalar is the value of a YAML scalar as rule_files writes one: quoted,
// or plain up to a comment (a # at its start or after a blank).
func scalar(s string) string {
	s = strings.TrimSpace(s)
	if s != "" && (s[0] == '"' || s[0] == '\'') {
		v, _, _ := strings.Cut(s[1:], s[:1])
		return v
	}
	v, _, _ := strings.Cut(" "+s, " #")
	return strings.TrimSpace(v)
}
