// Package operator implements the operator's commands: `leases` shows who
// holds which address and which holders are dead, `gc` runs CHECK's sweep
// by hand. Both read the same state, through the same code, as the plugin.
package operator

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/internal/statefile"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/reclaim"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/sysinfo"
)

// Row is one line of `leases`: a lease, or NAT rules whose lease is gone.
// Its JSON form is the documented, stable schema of `leases --json`.
type Row struct {
	Network     string `json:"network"`
	IP          string `json:"ip"`
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`
	Netns       string `json:"netns"`
	// AgeSeconds counts from the record's creation, else the lease file's mtime.
	AgeSeconds int64 `json:"ageSeconds"`
	// State is live, stale, pending, detached, unknown, or orphan-rules.
	State  string `json:"state"`
	Reason string `json:"reason,omitempty"`
	// HeldBy is what keeps a detached attachment's namespace alive.
	HeldBy *sysinfo.Holder `json:"heldBy,omitempty"`
	// Rules lists NAT chains and jumps, for orphan-rules rows.
	Rules []string `json:"rules,omitempty"`
	// Runtime, with leases --runtime, is "listed" or "not listed": whether
	// the runtime says it has the row's container.
	Runtime string `json:"runtime,omitempty"`
}

// LeasesSink takes the rows of `leases` as the sweeps meet them, per
// network how many released addresses kept their firewall rules (another
// network leases them), then the problems the sweeps skipped.
type LeasesSink interface {
	Row(Row)
	Kept(network string, addresses int)
	End(problems *Problems) error
}

// Leases runs a dry-run sweep of every network under CHECK's rules, with
// the NAT rules nobody holds, and hands each row to sink as the sweep meets
// it (the order docs/operator.md gives): nothing but the attachment at
// hand is held, whatever the size of the network. It changes nothing.
// Every network is listed even if an earlier one failed.
func Leases(s *reclaim.Sweeper, scope Scope, sink LeasesSink) error {
	now := s.Host.Now()
	return scope.each(func(d ipamdir.Dir, req reclaim.Request) error {
		req.DryRun, req.Orphans = true, true
		req.Visit = func(a *reclaim.Attachment) { eachRow(d.Network, a, now, sink.Row) }
		req.Released = func(rel reclaim.Release) {
			if rel.Orphan {
				sink.Row(Row{Network: d.Network, IP: "-", ContainerID: rel.Key.ContainerID, State: "orphan-rules", Reason: rel.Reason, Rules: rel.What})
			}
		}
		_, err := s.Sweep(req)
		if n := s.Releases(d)[reclaim.ForwardKeptCount]; n > 0 {
			sink.Kept(d.Network, n)
		}
		return err
	}, sink.End)
}

// eachRow hands row the rows of a: one per lease, else one without.
func eachRow(network string, a *reclaim.Attachment, now time.Time, row func(Row)) {
	r := Row{Network: network, IP: "-", ContainerID: a.Key.ContainerID, IfName: a.Key.IfName, State: string(a.Verdict.State), Reason: a.Verdict.Reason, HeldBy: a.Verdict.Holder}
	var created time.Time
	if a.Record != nil {
		r.Netns, created = a.Record.Netns, a.Record.Created
	}
	r.AgeSeconds = age(now, created)
	if len(a.Leases) == 0 {
		row(r)
	}
	for _, l := range a.Leases {
		r.IP = l.IP.String()
		if created.IsZero() {
			r.AgeSeconds = age(now, l.ModTime)
		}
		row(r)
	}
}

func age(now, t time.Time) int64 {
	if t.IsZero() || t.After(now) {
		return 0
	}
	return int64(now.Sub(t) / time.Second)
}

// LeasesTable prints the human table. Its columns are aligned over blocks
// of tableBlock rows (a tabwriter holds the text of what it aligns): one
// block up to that many rows, bounded memory beyond.
type LeasesTable struct {
	output // the tabwriter, then (End) plain
	plain  io.Writer
	tw     *tabwriter.Writer
	n      int
	kept   []string
}

const tableBlock = 4096

// NewLeasesTable starts the table with its header.
func NewLeasesTable(w io.Writer) *LeasesTable {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	t := &LeasesTable{output: output{w: tw}, plain: w, tw: tw}
	t.printf("NETWORK\tIP\tCONTAINER\tIFNAME\tNETNS\tAGE\tSTATE\n")
	return t
}

func (t *LeasesTable) Row(r Row) {
	state := r.State
	if r.Reason != "" {
		state = fmt.Sprintf("%s (%s)", r.State, r.Reason)
	}
	ageText := formatAge(r.AgeSeconds)
	if r.State == "orphan-rules" {
		state = fmt.Sprintf("orphan-rules: %s", strings.Join(r.Rules, ", "))
		ageText = "-"
	}
	if r.Runtime == "not listed" {
		state += "; not listed by the runtime"
	}
	t.printf("%s\t%s\t%s\t%s\t%s\t%s\t%s\n", printable(r.Network, r.IP, r.ContainerID, cmp.Or(r.IfName, "-"), cmp.Or(r.Netns, "-"), ageText, state)...)
	if t.n++; t.n%tableBlock == 0 && t.err == nil {
		t.err = t.tw.Flush()
	}
}

// Kept notes, below the table, a network whose releases kept firewall
// rules (reclaim.ForwardKeptCount).
func (t *LeasesTable) Kept(network string, addresses int) {
	t.kept = append(t.kept, fmt.Sprintf("kept: %s: the firewall rules of %d released address(es), which another network leases (see its releases in the log)", network, addresses))
}

func (t *LeasesTable) End(problems *Problems) error {
	t.keep(t.tw.Flush())
	// Below the table, not through the tabwriter: a skipped file's name
	// may hold a tab.
	t.w = t.plain
	for _, k := range t.kept {
		t.printf("%s\n", k)
	}
	return t.keep(problems.Each(func(p string) { t.printf("skipped: %s\n", printable(p)...) }))
}

// NewLeasesJSON starts the `leases --json` document, written a row at a
// time:
//
//	{"dataDir": ..., "leases": [Row, ...], "problems": [...]}
func NewLeasesJSON(w io.Writer, dataDir string) LeasesSink {
	return newJSONStream(w, "leases", "dataDir", dataDir)
}

// LeasesJSONFailed writes the `leases --json` document of a listing that
// could not start (its data dir not listed, the runtime not asked): no
// leases, no problems, and why in "error":
//
//	{"dataDir": ..., "leases": [], "problems": [], "error": "..."}
func LeasesJSONFailed(w io.Writer, dataDir string, err error) error {
	return newJSONStream(w, "leases", "dataDir", dataDir).fail(err)
}

// WriteJSON prints v as indented JSON (statefile.PrintableJSON).
func WriteJSON(w io.Writer, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err == nil {
		_, err = w.Write(append(statefile.PrintableJSON(b), '\n'))
	}
	return err
}

// formatAge is coarse on purpose: "3d4h", "2h5m", "7m12s", "9s".
func formatAge(sec int64) string {
	d := time.Duration(sec) * time.Second
	switch {
	case d >= 24*time.Hour:
		return fmt.Sprintf("%dd%dh", d/(24*time.Hour), (d%(24*time.Hour))/time.Hour)
	case d >= time.Hour:
		return fmt.Sprintf("%dh%dm", d/time.Hour, (d%time.Hour)/time.Minute)
	case d >= time.Minute:
		return fmt.Sprintf("%dm%ds", d/time.Minute, (d%time.Minute)/time.Second)
	}
	return fmt.Sprintf("%ds", sec)
}
