package operator

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/netdir"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/reclaim"
)

// GCRelease is one release of `gc --json`.
type GCRelease struct {
	Network     string   `json:"network"`
	ContainerID string   `json:"containerID"`
	IfName      string   `json:"ifName"`
	IPs         []string `json:"ips"`
	Reason      string   `json:"reason"`
	Removed     []string `json:"removed"`
}

// GCOutput is the whole `gc --json` document.
type GCOutput struct {
	DataDir  string      `json:"dataDir"`
	DryRun   bool        `json:"dryRun"`
	Released []GCRelease `json:"released"`
	Problems []string    `json:"problems"`
}

// GC runs CHECK's sweep over each network (with orphanRules, also the NAT
// rules that no lease or record holds). Every network is swept even if an
// earlier one failed.
func GC(s *reclaim.Sweeper, dataDir string, networks []string, dryRun, orphanRules bool) (*GCOutput, error) {
	out := &GCOutput{DataDir: dataDir, DryRun: dryRun, Released: []GCRelease{}, Problems: []string{}}
	var errs []error
	for _, network := range networks {
		rep, err := s.Sweep(reclaim.Request{Dir: netdir.New(dataDir, network), DryRun: dryRun, Orphans: orphanRules})
		if err != nil {
			errs = append(errs, fmt.Errorf("network %s: %w", network, err))
		}
		if rep == nil {
			continue
		}
		for _, rel := range rep.Releases {
			out.Released = append(out.Released, GCRelease{Network: network, ContainerID: rel.Key.ContainerID, IfName: rel.Key.IfName, IPs: nonNil(rel.IPs), Reason: rel.Reason, Removed: nonNil(rel.What)})
		}
		for _, p := range rep.Problems {
			out.Problems = append(out.Problems, fmt.Sprintf("%s: %v", network, p))
		}
	}
	return out, errors.Join(errs...)
}

// WriteGCText prints one line per release, saying what went (or would go)
// and why.
func WriteGCText(w io.Writer, out *GCOutput) {
	verb, removed := "released", "removed"
	if out.DryRun {
		verb, removed = "would release", "would remove"
	}
	for _, r := range out.Released {
		ips := strings.Join(r.IPs, ",")
		if ips == "" {
			ips = "(no lease)"
		}
		fmt.Fprintf(w, "%s %s %s/%s %s: %s; %s %s\n", verb, r.Network, r.ContainerID, dash(r.IfName), ips, r.Reason, removed, strings.Join(r.Removed, ", "))
	}
	for _, p := range out.Problems {
		fmt.Fprintf(w, "skipped: %s\n", p)
	}
	if len(out.Released) == 0 {
		fmt.Fprintln(w, "nothing to release")
	}
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
