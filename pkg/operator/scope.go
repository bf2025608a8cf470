package operator

import (
	"cmp"
	"errors"
	"fmt"
	"path/filepath"
	"slices"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/conflists"
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
	// LegacyDataDirs is, by network, where its conflist's host-local kept
	// leases before the rewrite (its own ipam.dataDir); host-local's
	// default for the others.
	LegacyDataDirs map[string]string
}

// NewScope is the scope of dirs, networks of dataDir, on a host whose
// conflists set up nets (conflists.Networks): its other data dirs, and the
// legacy dir of each of the plugin's networks in dataDir.
func NewScope(dataDir string, dirs []ipamdir.Dir, nets []*conflists.Network) Scope {
	sc := Scope{DataDir: dataDir, Dirs: dirs, OtherDataDirs: conflists.DataDirsOf(nets), LegacyDataDirs: map[string]string{}}
	for _, n := range nets {
		_, seen := sc.LegacyDataDirs[n.Name]
		// A name in two files is the first one's (see conflists.RangeAddresses).
		if n.Ours && !seen && filepath.Clean(n.Conf.DataDir) == filepath.Clean(dataDir) {
			sc.LegacyDataDirs[n.Name] = n.Conf.LegacyDataDir
		}
	}
	return sc
}

// Request is the sweep of one network of the scope, before the command
// says what to do with it.
func (sc Scope) Request(d ipamdir.Dir) reclaim.Request {
	// A conflist's legacy dir is never "" (netconf.Parse).
	legacy := cmp.Or(sc.LegacyDataDirs[d.Network], ipamdir.DefaultLegacyDataDir)
	return reclaim.Request{Dir: d, LegacyDataDir: legacy, OtherDataDirs: sc.others()}
}

// each runs sweep over every network of the scope with its Request, then
// end with the files the sweeps skipped. Every network is swept even if an
// earlier one failed.
func (sc Scope) each(sweep func(d ipamdir.Dir, req reclaim.Request) error, end func(*Problems) error) error {
	problems := &Problems{}
	defer problems.Close()
	var errs []error
	for _, d := range sc.Dirs {
		req := sc.Request(d)
		req.Problem = func(err error) { problems.Add(fmt.Sprintf("%s: %v", d.Network, err)) }
		if err := sweep(d, req); err != nil {
			errs = append(errs, fmt.Errorf("network %s: %w", d.Network, err))
		}
	}
	return errors.Join(append(errs, end(problems))...)
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
