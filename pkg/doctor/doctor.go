// Package doctor checks a host for what keeps the plugin from working, or
// from working well, before users find it: the conflists that use it, the
// plugins their chains need, the data directories, networks that would
// hand out one range twice, and what is waiting to be reclaimed. It only
// reads.
package doctor

import (
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/internal/statefile"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/conflists"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/reclaim"
)

// Level is how bad a finding is.
type Level string

const (
	OK    Level = "ok"
	Warn  Level = "warn"
	Error Level = "error"
)

// Finding is one line of the report: what was checked, about what, what
// was found, and what to do.
type Finding struct {
	Level   Level  `json:"level"`
	Check   string `json:"check"`
	Subject string `json:"subject"`
	Message string `json:"message"`
	Fix     string `json:"fix,omitempty"`
}

// Report is every finding, in the order of the checks.
type Report struct {
	Findings []Finding `json:"findings"`
	// OK is false when a finding is an error.
	OK bool `json:"ok"`
}

// Options are the host's edges.
type Options struct {
	ConfDirs []string
	CNIPath  []string
	// CNIPathGiven: CNIPath is the user's (--cni-path, CNI_PATH), not a
	// default; with Nomad, a default gives way to its cni_path.
	CNIPathGiven bool
	// Nomad is set when a Nomad agent may run here: its built-in bridge
	// network then counts in the clash check, and its fingerprint of
	// bridge decides whether it sends CHECK.
	Nomad bool
	// Readers are the runtimes that read each configuration directory, and
	// where they look for plugins (nil: conflists.DefaultReaders).
	Readers map[string]conflists.Reader
	// NomadClient reads the client's settings (with Nomad set).
	NomadClient func() NomadClient
	// Version runs a plugin with no arguments and returns what it printed.
	Version func(path string) (string, error)
	// OnTmpfs tells whether a directory lives in memory.
	OnTmpfs func(dir string) (bool, error)
	// Free is the room left for a directory, as root sees it.
	Free    func(dir string) (Room, error)
	Sweeper *reclaim.Sweeper
	// EUID is the doctor's effective user: the plugin runs as root, and
	// what it owns cannot be judged by another user.
	EUID int

	// PrometheusRules and PrometheusConfig are the packaged alerting rules
	// and a local Prometheus's configuration ("": not checked).
	PrometheusRules, PrometheusConfig string

	// nomad is the client's settings, read once by Run.
	nomad NomadClient
}

// Room is what a filesystem has free: bytes, and inodes (math.MaxUint64
// where it has no fixed number of them).
type Room struct{ Bytes, Inodes uint64 }

// Run checks the host.
func Run(o Options) *Report {
	var fs []Finding
	if o.EUID != 0 {
		fs = append(fs, Finding{Level: Warn, Check: "doctor", Subject: fmt.Sprintf("uid %d", o.EUID), Message: "not run as root: the plugin runs as root, so its data dirs, leases and NAT rules are not judged from here", Fix: "sudo nomad-bridge-cni doctor"})
	}
	if o.Nomad {
		o.nomad = o.NomadClient()
		if !o.CNIPathGiven {
			o.CNIPath = o.nomad.CNIPath
		}
		if !slices.Contains(o.ConfDirs, o.nomad.CNIConfigDir) {
			o.ConfDirs = append(slices.Clone(o.ConfDirs), o.nomad.CNIConfigDir)
		}
	}
	front, ffs := findFront(o)
	fs = append(fs, ffs...)
	var nomadFs []Finding
	if o.Nomad {
		nomadFs = checkNomad(o, o.nomad)
		fs = append(fs, nomadFs...)
	}
	nets, cfs := readConflists(o, front)
	fs = append(fs, cfs...)
	ours := slices.DeleteFunc(slices.Clone(nets), func(n *conflists.Network) bool { return !n.Ours || n.Conf == nil })
	// The bridge finding is fine where Nomad sends CHECK on restore.
	if o.Nomad && nomadFs[len(nomadFs)-1].Level == OK {
		fs = append(fs, checkBelowCheck(o, ours)...)
	}
	if len(ours) == 0 && !slices.ContainsFunc(fs, isError) {
		fs = append(fs, Finding{Level: Warn, Check: "conflist", Subject: strings.Join(o.ConfDirs, ", "), Message: "no conflist uses " + pluginName, Fix: "change \"type\": \"bridge\" to \"type\": \"" + pluginName + "\" in one, or pass --conf-dir"})
	}
	fs = append(fs, checkPlugins(o, ours, front)...)
	fs = append(fs, checkDataDirs(o, ours)...)
	fs = append(fs, checkClashes(o, nets, front.path != "")...)
	fs = append(fs, checkState(o, ours, nets, front.path != "")...)
	if o.PrometheusRules != "" {
		fs = append(fs, checkPrometheus(o.PrometheusRules, o.PrometheusConfig)...)
	}
	return &Report{Findings: fs, OK: !slices.ContainsFunc(fs, isError)}
}

func isError(f Finding) bool { return f.Level == Error }

// marks are the signs WriteText puts in front of a finding of each level.
var marks = map[Level]string{OK: "✓", Warn: "!", Error: "✗"}

// WriteText prints one line per finding, its fix indented below, each
// field escaped as statefile.Printable escapes it: they name files and
// what files hold (a conflist's name, an entry's plugin type), which no
// terminal should obey.
func WriteText(w io.Writer, r *Report) error {
	var b strings.Builder
	p := statefile.Printable
	for _, f := range r.Findings {
		fmt.Fprintf(&b, "%s %s: %s: %s\n", marks[f.Level], p(f.Check), p(f.Subject), p(f.Message))
		if f.Fix != "" {
			fmt.Fprintf(&b, "    fix: %s\n", p(f.Fix))
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}
