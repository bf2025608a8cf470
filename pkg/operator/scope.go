package operator

import (
	"path/filepath"
	"slices"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/reclaim"
)

// Scope is what an operator command sweeps: networks of one data dir (as
// ipamdir.List gives them: each checked as the CNI verbs check it), and
// the host's other data dirs, whose containers' NAT rules a sweep of
// DataDir must never take for orphans (a mistyped or a second data dir
// shares the networks' rule names with the real one).
type Scope struct {
	DataDir string
	Dirs    []ipamdir.Dir
	// OtherDataDirs are the data dirs the host's conflists name; the
	// default one is always checked, DataDir itself never.
	OtherDataDirs []string
}

// Request is the sweep of one network of the scope, before the command
// says what to do with it.
func (sc Scope) Request(d ipamdir.Dir) reclaim.Request {
	return reclaim.Request{Dir: d, LegacyDataDir: ipamdir.DefaultLegacyDataDir, OtherDataDirs: sc.others()}
}

func (sc Scope) others() []string {
	self := filepath.Clean(sc.DataDir)
	var out []string
	for _, d := range append([]string{ipamdir.DefaultDataDir}, sc.OtherDataDirs...) {
		d = filepath.Clean(d)
		if d != self && !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	return out
}
