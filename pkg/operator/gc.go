package operator

import (
	"errors"
	"fmt"
	"io"
	"strings"

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
	// Kept is what of it stays, with why (omitted when nothing).
	Kept []string `json:"kept,omitempty"`
}

// GCOutput is the whole `gc --json` document. GCJSON writes it as the
// releases come, without holding them.
type GCOutput struct {
	DataDir  string      `json:"dataDir"`
	DryRun   bool        `json:"dryRun"`
	Released []GCRelease `json:"released"`
	Problems []string    `json:"problems"`
}

// GCResult is what gc did besides its releases.
type GCResult struct {
	Released int
	Problems *Problems
}

// GCSink takes gc's releases as each sweep makes them, then the rest.
type GCSink interface {
	Release(GCRelease)
	End(*GCResult) error
}

// GC runs CHECK's sweep over each network (with orphanRules, also the NAT
// rules that no lease or record holds), handing each release to sink as it
// is made: a network of 65534 stale attachments is never held at once.
// Every network is swept even if an earlier one failed.
func GC(s *reclaim.Sweeper, scope Scope, dryRun, orphanRules bool, sink GCSink) error {
	return GCReconciled(s, scope, dryRun, orphanRules, nil, sink)
}

// GCReconciled is GC that also releases what the runtime no longer lists
// (rec, when set; see Reconcile), and remembers what it did not list
// (not in a dry run).
func GCReconciled(s *reclaim.Sweeper, scope Scope, dryRun, orphanRules bool, rec *Reconcile, sink GCSink) error {
	res := &GCResult{Problems: &Problems{}}
	defer res.Problems.Close()
	var errs []error
	for _, d := range scope.Dirs {
		network := d.Network
		emit := func(rel reclaim.Release) {
			res.Released++
			if rec != nil {
				// Gone: .unlisted forgets it. Should its files have
				// stayed, the next run finds it missing afresh.
				rec.forget(d, rel.Key)
			}
			if rel.HeldBy != nil && rec != nil {
				if note := rec.leakedMount(rel.HeldBy.Mount, dryRun); note != "" {
					rel.Reason += " (" + note + ")"
				} else {
					rel.What = append(rel.What, "mount "+rel.HeldBy.Mount)
				}
			}
			sink.Release(GCRelease{Network: network, ContainerID: rel.Key.ContainerID, IfName: rel.Key.IfName, IPs: nonNil(rel.IPs), Reason: rel.Reason, Removed: nonNil(rel.What), Kept: rel.Kept})
		}
		problem := func(err error) { res.Problems.Add(fmt.Sprintf("%s: %v", network, err)) }
		req := scope.Request(d)
		req.DryRun, req.Orphans, req.Released, req.Problem = dryRun, orphanRules, emit, problem
		if rec != nil {
			req.Unlisted = rec.For(d)
		}
		if _, err := s.CheckSweep(req, 0); err != nil {
			errs = append(errs, fmt.Errorf("network %s: %w", network, err))
		}
	}
	if rec != nil && !dryRun {
		errs = append(errs, rec.Save())
	}
	return errors.Join(append(errs, sink.End(res))...)
}

// GCText prints one line per release, saying what went (or would go) and
// why, as it goes.
type GCText struct {
	W      io.Writer
	DryRun bool
	err    error
}

func (t *GCText) Release(r GCRelease) {
	verb, removed := "released", "removed"
	if t.DryRun {
		verb, removed = "would release", "would remove"
	}
	ips := strings.Join(r.IPs, ",")
	if ips == "" {
		ips = "(no lease)"
	}
	kept := ""
	if len(r.Kept) > 0 {
		kept = "; " + strings.Join(r.Kept, "; ")
	}
	t.printf("%s %s %s/%s %s: %s; %s %s%s\n", verb, r.Network, r.ContainerID, dash(r.IfName), ips, r.Reason, removed, strings.Join(r.Removed, ", "), kept)
}

func (t *GCText) End(res *GCResult) error {
	err := res.Problems.Each(func(p string) { t.printf("skipped: %s\n", p) })
	if res.Released == 0 {
		t.printf("nothing to release\n")
	}
	if t.err == nil {
		t.err = err
	}
	return t.err
}

func (t *GCText) printf(format string, args ...any) {
	if t.err == nil {
		_, t.err = fmt.Fprintf(t.W, format, args...)
	}
}

// GCJSON writes the `gc --json` document (GCOutput, indented as WriteJSON
// indents it) one release at a time.
type GCJSON struct{ doc *jsonStream }

// NewGCJSON starts the document.
func NewGCJSON(w io.Writer, dataDir string, dryRun bool) *GCJSON {
	return &GCJSON{doc: newJSONStream(w, "released", "dataDir", dataDir, "dryRun", dryRun)}
}

func (j *GCJSON) Release(r GCRelease)     { j.doc.item(r) }
func (j *GCJSON) End(res *GCResult) error { return j.doc.end(res.Problems) }

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
