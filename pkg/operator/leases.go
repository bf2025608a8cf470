package operator

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/netdir"
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
}

// LeasesOutput is the whole `leases --json` document.
type LeasesOutput struct {
	DataDir  string   `json:"dataDir"`
	Leases   []Row    `json:"leases"`
	Problems []string `json:"problems"`
}

// Leases builds the rows of every network: a dry-run sweep under CHECK's
// rules, plus the NAT rules nobody holds. It changes nothing. Rows are
// kept (the table is aligned over all of them) and sorted as the network's
// addresses are: an attachment's rows by its first address, those without
// a lease after them, then the orphan rules.
func Leases(s *reclaim.Sweeper, dataDir string, networks []string) (*LeasesOutput, error) {
	out := &LeasesOutput{DataDir: dataDir, Leases: []Row{}, Problems: []string{}}
	now := s.Host.Now()
	for _, network := range networks {
		var rows []sortedRow
		visit := func(a *reclaim.Attachment) {
			for _, r := range rowsOf(network, a, now) {
				rows = append(rows, sortedRow{Row: r, key: sortKey(a)})
			}
		}
		var orphans []Row
		released := func(rel reclaim.Release) {
			if rel.Orphan {
				orphans = append(orphans, Row{Network: network, IP: "-", ContainerID: rel.Key.ContainerID, State: "orphan-rules", Reason: rel.Reason, Rules: rel.What})
			}
		}
		rep, err := s.Sweep(reclaim.Request{Dir: netdir.New(dataDir, network), DryRun: true, Orphans: true, Visit: visit, Released: released})
		if err != nil {
			return nil, fmt.Errorf("network %s: %w", network, err)
		}
		// Stable: an attachment's rows stay in its leases' order.
		sort.SliceStable(rows, func(i, j int) bool { return rows[i].key < rows[j].key })
		for _, r := range rows {
			out.Leases = append(out.Leases, r.Row)
		}
		out.Leases = append(out.Leases, orphans...)
		for _, p := range rep.Problems {
			out.Problems = append(out.Problems, fmt.Sprintf("%s: %v", network, p))
		}
	}
	return out, nil
}

type sortedRow struct {
	Row
	key string
}

// sortKey orders attachments by first address (a sweep sorts an
// attachment's leases), then those without a lease by key.
func sortKey(a *reclaim.Attachment) string {
	if len(a.Leases) == 0 {
		return "\xff" + a.Key.String()
	}
	return "\x00" + string(a.Leases[0].IP.To16()) + a.Key.String()
}

func rowsOf(network string, a *reclaim.Attachment, now time.Time) []Row {
	base := Row{Network: network, ContainerID: a.Key.ContainerID, IfName: a.Key.IfName, State: string(a.Verdict.State), Reason: a.Verdict.Reason, HeldBy: a.Verdict.Holder}
	var created time.Time
	if a.Record != nil {
		base.Netns = a.Record.Netns
		created = a.Record.Created
	}
	if len(a.Leases) == 0 {
		row := base
		row.IP = "-"
		row.AgeSeconds = age(now, created)
		return []Row{row}
	}
	rows := make([]Row, 0, len(a.Leases))
	for _, l := range a.Leases {
		row := base
		row.IP = l.IP.String()
		if created.IsZero() {
			row.AgeSeconds = age(now, l.ModTime)
		} else {
			row.AgeSeconds = age(now, created)
		}
		rows = append(rows, row)
	}
	return rows
}

func age(now, t time.Time) int64 {
	if t.IsZero() || t.After(now) {
		return 0
	}
	return int64(now.Sub(t) / time.Second)
}

// WriteLeasesTable prints the human table.
func WriteLeasesTable(w io.Writer, out *LeasesOutput) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NETWORK\tIP\tCONTAINER\tIFNAME\tNETNS\tAGE\tSTATE")
	for _, r := range out.Leases {
		state := r.State
		if r.Reason != "" {
			state = fmt.Sprintf("%s (%s)", r.State, r.Reason)
		}
		ageText := formatAge(r.AgeSeconds)
		if r.State == "orphan-rules" {
			state = fmt.Sprintf("orphan-rules: %s", strings.Join(r.Rules, ", "))
			ageText = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Network, r.IP, r.ContainerID, dash(r.IfName), dash(r.Netns), ageText, state)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, p := range out.Problems {
		fmt.Fprintf(w, "skipped: %s\n", p)
	}
	return nil
}

// WriteJSON prints v as indented JSON.
func WriteJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
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
