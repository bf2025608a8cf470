// Package metrics writes the state of every network in the Prometheus text
// exposition format, for node_exporter's textfile collector. It is written
// by hand (a few gauges, once per run): the Prometheus client library
// would register and initialise its collectors in every process of the
// binary, CNI verbs included, whose start-up is what a runtime waits for.
// Tests parse the output with the Prometheus project's own parser.
package metrics

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/operator"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/reclaim"
)

// Network is what is known of one network.
type Network struct {
	Name         string
	Attachments  map[reclaim.State]int
	Leases       int
	OrphanRules  int
	Skipped      int     // damaged or foreign files the sweep skipped
	RangeSize    float64 // 0: unknown (no conflist found)
	LastSweepAge float64 // seconds; negative: no CHECK sweep this boot
	// DataDir is the network's data dir; Tmpfs says whether it lives in
	// memory, TmpfsKnown whether statfs could tell.
	DataDir           string
	Tmpfs, TmpfsKnown bool
	// Releases counts released attachments by cause, across runs.
	Releases map[string]int
}

// Collect reads every network of scope as `leases` does (a dry-run sweep:
// it changes nothing), in scope's order (ipamdir.List's, by name).
func Collect(s *reclaim.Sweeper, scope operator.Scope, ranges map[string]float64) ([]Network, error) {
	var out []Network
	now := s.Host.Now()
	for _, d := range scope.Dirs {
		name := d.Network
		n := Network{Name: name, Attachments: map[reclaim.State]int{}, RangeSize: ranges[name], LastSweepAge: -1, DataDir: d.DataDir}
		if mem, _, err := d.OnTmpfs(); err == nil {
			n.Tmpfs, n.TmpfsKnown = mem, true
		}
		count := func(a *reclaim.Attachment) {
			n.Attachments[a.Verdict.State]++
			n.Leases += len(a.Leases)
		}
		req := scope.Request(d)
		req.DryRun, req.Orphans, req.Visit = true, true, count
		req.Problem = func(error) { n.Skipped++ }
		rep, err := s.Sweep(req)
		if err != nil {
			return nil, fmt.Errorf("network %s: %w", name, err)
		}
		n.OrphanRules = len(rep.OrphanRules)
		if t, ok := s.LastSweep(d); ok {
			n.LastSweepAge = now.Sub(t).Seconds()
		}
		n.Releases = s.Releases(d)
		out = append(out, n)
	}
	return out, nil
}

// Text is the networks as gauges and counters.
func Text(nets []Network) []byte {
	b := new(bytes.Buffer)
	family := func(name, typ, help string, each func(n Network)) {
		fmt.Fprintf(b, "# HELP nomad_bridge_cni_%s %s\n# TYPE nomad_bridge_cni_%s %s\n", name, help, name, typ)
		for _, n := range nets {
			each(n)
		}
	}
	// sample is a family of one sample per network, where value has one.
	sample := func(name, typ, help string, value func(n Network) (any, bool)) {
		family(name, typ, help, func(n Network) {
			if v, ok := value(n); ok {
				fmt.Fprintf(b, "nomad_bridge_cni_%s{network=%q} %v\n", name, n.Name, v)
			}
		})
	}
	family("attachments", "gauge", "Attachments of a network by state, as `leases` judges them.", func(n Network) {
		// Each state is written, 0 included, so that an alert on one does
		// not depend on its having been seen.
		for _, st := range []reclaim.State{reclaim.Live, reclaim.Pending, reclaim.Stale, reclaim.Detached, reclaim.Unknown} {
			fmt.Fprintf(b, "nomad_bridge_cni_attachments{network=%q,state=%q} %d\n", n.Name, st, n.Attachments[st])
		}
	})
	sample("leases", "gauge", "host-local leases held on a network.", func(n Network) (any, bool) { return n.Leases, true })
	sample("range_addresses", "gauge", "Addresses in a network's ranges, rangeStart to rangeEnd (from its conflist; absent when none was found).", func(n Network) (any, bool) { return n.RangeSize, n.RangeSize > 0 })
	sample("orphan_nat_rule_sets", "gauge", "Containers with NAT rules on a network but no lease or record.", func(n Network) (any, bool) { return n.OrphanRules, true })
	sample("skipped_files", "gauge", "Damaged or foreign files in a network's directories, skipped: neither judged nor counted (`leases` lists them).", func(n Network) (any, bool) { return n.Skipped, true })
	sample("last_check_sweep_age_seconds", "gauge", "Seconds since a CHECK last swept a network in this boot (absent when none did).", func(n Network) (any, bool) { return n.LastSweepAge, n.LastSweepAge >= 0 })
	family("data_dir_tmpfs", "gauge", "1 when a network's data dir is a tmpfs (leases die with the boot), 0 when it is not (absent when statfs failed).", func(n Network) {
		if n.TmpfsKnown {
			fmt.Fprintf(b, "nomad_bridge_cni_data_dir_tmpfs{network=%q,data_dir=\"%s\"} %d\n", n.Name, labelValue(n.DataDir), map[bool]int{true: 1}[n.Tmpfs])
		}
	})
	family("releases_total", "counter", "Attachments released on a network (leases, NAT rules, records), by cause, counted by the plugin across runs.", func(n Network) {
		for _, c := range slices.Sorted(maps.Keys(n.Releases)) {
			if c != reclaim.ForwardKeptCount && c != reclaim.RefusedLiveCount {
				fmt.Fprintf(b, "nomad_bridge_cni_releases_total{network=%q,reason=%q} %d\n", n.Name, c, n.Releases[c])
			}
		}
	})
	sample("firewall_rules_kept_total", "counter", "Addresses of released attachments whose firewall plugin rules (CNI-FORWARD) were kept because another network leases the address, counted across runs.", func(n Network) (any, bool) { return n.Releases[reclaim.ForwardKeptCount], true })
	// Written as 0 too: increase() sees the first refusal only if the
	// series was there before it.
	family("add_refusals_total", "counter", "ADDs refused because the container's earlier attachment is still in a live namespace (detached, or attached elsewhere), counted across runs.", func(n Network) {
		fmt.Fprintf(b, "nomad_bridge_cni_add_refusals_total{network=%q,reason=\"live-namespace\"} %d\n", n.Name, n.Releases[reclaim.RefusedLiveCount])
	})
	return b.Bytes()
}

// labelValue escapes a label value as the text format does: backslash,
// quote and newline, in valid UTF-8. Go's %q escapes more (a tab, say),
// which Prometheus refuses, dropping the whole file; it is kept for
// network names, whose alphabet (ValidateNetworkName) needs no escape.
func labelValue(s string) string {
	return strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(strings.ToValidUTF8(s, "\uFFFD"))
}
