package operator

import (
	"cmp"
	"errors"
	"io"
	"strings"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
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

// GCSink takes gc's releases as each sweep makes them, then the problems
// the sweeps skipped.
type GCSink interface {
	Release(GCRelease)
	End(problems *Problems) error
}

// GC runs CHECK's sweep over each network (with orphanRules, also the NAT
// rules that no lease or record holds), handing each release to sink as it
// is made: a network of 65534 stale attachments is never held at once.
// With rec, it also releases what the runtime no longer lists (see
// Reconcile), and remembers what it did not list (not in a dry run).
func GC(s *reclaim.Sweeper, scope Scope, dryRun, orphanRules bool, rec *Reconcile, sink GCSink) error {
	err := scope.each(func(d ipamdir.Dir, req reclaim.Request) error {
		req.DryRun, req.Orphans = dryRun, orphanRules
		req.Released = func(rel reclaim.Release) {
			if rec != nil {
				rec.released(d, &rel, dryRun)
			}
			sink.Release(GCRelease{Network: d.Network, ContainerID: rel.Key.ContainerID, IfName: rel.Key.IfName, IPs: nonNil(rel.IPs), Reason: rel.Reason, Removed: nonNil(rel.What), Kept: rel.Kept})
		}
		if rec != nil {
			req.Unlisted = rec.For(d)
		}
		_, err := s.CheckSweep(req, 0)
		return err
	}, sink.End)
	if rec != nil && !dryRun {
		err = errors.Join(err, rec.Save())
	}
	return err
}

// GCText prints one line per release, saying what went (or would go) and
// why, as it goes.
type GCText struct {
	output
	dryRun, released bool
}

// NewGCText prints to w; with dryRun, what would go.
func NewGCText(w io.Writer, dryRun bool) *GCText {
	return &GCText{output: output{w: w}, dryRun: dryRun}
}

func (t *GCText) Release(r GCRelease) {
	t.released = true
	verb, removed := "released", "removed"
	if t.dryRun {
		verb, removed = "would release", "would remove"
	}
	ips := cmp.Or(strings.Join(r.IPs, ","), "(no lease)")
	kept := ""
	if len(r.Kept) > 0 {
		kept = "; " + strings.Join(r.Kept, "; ")
	}
	t.printf("%s %s %s/%s %s: %s; %s %s%s\n", printable(verb, r.Network, r.ContainerID, cmp.Or(r.IfName, "-"), ips, r.Reason, removed, strings.Join(r.Removed, ", "), kept)...)
}

func (t *GCText) End(problems *Problems) error {
	err := problems.Each(func(p string) { t.printf("skipped: %s\n", printable(p)...) })
	if !t.released {
		t.printf("nothing to release\n")
	}
	return t.keep(err)
}

// NewGCJSON starts the `gc --json` document, written a release at a time:
//
//	{"dataDir": ..., "dryRun": ..., "released": [GCRelease, ...], "problems": [...]}
func NewGCJSON(w io.Writer, dataDir string, dryRun bool) GCSink {
	return newJSONStream(w, "released", "dataDir", dataDir, "dryRun", dryRun)
}

// GCJSONFailed writes the `gc --json` document of a gc that could not
// start (its data dir not listed, the runtime not asked), so that a reader
// of its output gets a document even then: nothing released, no problems,
// and why in "error":
//
//	{"dataDir": ..., "dryRun": ..., "released": [], "problems": [], "error": "..."}
func GCJSONFailed(w io.Writer, dataDir string, dryRun bool, err error) error {
	return newJSONStream(w, "released", "dataDir", dataDir, "dryRun", dryRun).fail(err)
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
