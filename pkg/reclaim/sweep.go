package reclaim

import (
	"bytes"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/netdir"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/records"
)

// Sweeper judges every attachment of a network and releases the stale
// ones (Sweep), and keeps the sweep's bookkeeping next to the records (when
// the last CHECK sweep ended, releases counted by cause).
type Sweeper struct{ Env }

// Request says which network to sweep and by which rules.
type Request struct {
	Dir netdir.Dir
	// GC is set for the runtime's GC verb: every attachment not in Valid is
	// stale (a nil Valid means none is valid, as host-local reads it).
	GC    bool
	Valid []types.GCAttachment
	// Orphans also releases NAT rules of containers that hold neither a
	// lease nor a record on the network.
	Orphans bool
	// DryRun decides and reports, and changes nothing.
	DryRun bool
}

// Release is one stale attachment (or orphan rule set) released, or that
// a dry run would release.
type Release struct {
	Key    records.Key
	IPs    []string
	Reason string
	// What lists what went: "lease 10.0.0.2", "chain CNI-...", "record".
	What []string
	// Orphan marks NAT rules of a container the network holds no lease or
	// record of (Request.Orphans).
	Orphan bool
}

func (r Release) String() string {
	ips := strings.Join(r.IPs, ",")
	if ips == "" {
		ips = "no lease"
	}
	return fmt.Sprintf("%s %s: %s; removed %s", r.Key, ips, r.Reason, strings.Join(r.What, ", "))
}

// Report is what a sweep saw and did.
type Report struct {
	Network     string
	Attachments []*Attachment
	// OrphanRules lists container IDs with NAT rules but no lease or record
	// (filled when Request.Orphans is set).
	OrphanRules []string
	// Releases is what the sweep released, or, in a dry run, would release.
	Releases []Release
	Problems []error
}

// Sweep judges every attachment of one network and releases the stale
// ones. It holds host-local's lock (the flock on <dataDir>/<network>/lock
// that every host-local ADD and DEL takes) from the first read to the last
// lease released, so it never races an allocation: first a plan (what is
// stale, and why), then, unless it is a dry run, its application (NAT
// rules, leases, records). A sweep with nothing to release writes nothing
// and logs nothing.
func (s *Sweeper) Sweep(req Request) (*Report, error) {
	report := &Report{Network: req.Dir.Network}
	if !exists(req.Dir.Leases()) && !exists(req.Dir.Records()) && !req.Orphans {
		return report, nil
	}
	store, unlock, err := req.Dir.Lock()
	if err != nil {
		return nil, err
	}
	defer unlock()

	p, err := s.plan(req)
	if err != nil {
		return nil, err
	}
	report.Attachments, report.Problems = p.attachments, p.problems
	for _, prob := range p.problems {
		s.logf("%s: skipped: %v", req.Dir.Network, prob)
	}
	if req.DryRun {
		// Nothing will be written: let allocations go on while we report.
		store.Unlock()
	} else {
		s.removeAbandonedTemps(p)
	}
	if len(p.stale) == 0 && !req.Orphans {
		return report, nil
	}
	releases, order := p.releases()
	natErr := s.releaseNAT(p, report, releases, &order)
	if req.DryRun {
		p.listRecords(releases)
		report.Releases = collect(releases, order)
		return report, natErr
	}
	err = errors.Join(natErr, s.apply(p, releases))
	report.Releases = collect(releases, order)
	causes := map[string]int{}
	for _, a := range p.attachments {
		if a.Verdict.State == Stale {
			causes[a.Verdict.Cause]++
		}
	}
	causes[CauseOrphanRules] += len(report.OrphanRules)
	s.countReleases(req.Dir, causes)
	for _, rel := range report.Releases {
		s.logf("%s: released %s", req.Dir.Network, rel)
	}
	return report, err
}

// plan is a sweep's decision, taken under host-local's lock: every
// attachment of the network with its verdict, and what was read to reach
// it.
type plan struct {
	req         Request
	records     *records.Store
	listing     *records.Listing
	leases      *leaseDir
	attachments []*Attachment
	stale       map[records.Key]bool
	problems    []error
}

func (s *Sweeper) plan(req Request) (*plan, error) {
	p := &plan{req: req, records: records.NewStore(req.Dir)}
	var err error
	if p.listing, err = p.records.List(); err != nil {
		return nil, err
	}
	j, err := newJudge(s.Host, p.records, req.Valid, req.GC)
	if err != nil {
		return nil, err
	}
	var claimed map[string]records.Key
	if !req.DryRun { // a report shows what the files say
		claimed = j.liveClaims(p.listing.Records)
	}
	if p.leases, err = readLeases(req.Dir.Leases(), claimed); err != nil {
		return nil, err
	}
	p.attachments = join(p.leases.leases, p.listing.Records)
	p.stale = j.judgeAll(p.attachments)
	if len(p.stale) > 0 && p.leases.skipped > 0 {
		// Releasing needs every file's content (see readLeases).
		if p.leases, err = readLeases(req.Dir.Leases(), nil); err != nil {
			return nil, err
		}
		p.attachments = join(p.leases.leases, p.listing.Records)
		p.stale = j.judgeAll(p.attachments)
	}
	p.problems = append(p.leases.problems, p.listing.Problems...)
	return p, nil
}

// releases starts the report of every stale attachment, in report order,
// with its leases; NAT rules and records are added as they go.
func (p *plan) releases() (map[records.Key]*Release, []records.Key) {
	releases := map[records.Key]*Release{}
	var order []records.Key
	for _, a := range p.attachments {
		if a.Verdict.State != Stale {
			continue
		}
		rel := &Release{Key: a.Key, Reason: a.Verdict.Reason}
		for _, l := range a.Leases {
			rel.IPs = append(rel.IPs, l.IP.String())
			rel.What = append(rel.What, "lease "+l.IP.String())
		}
		releases[a.Key] = rel
		order = append(order, a.Key)
	}
	return releases, order
}

// natOwnersAlive are the container IDs with an attachment that is not
// stale: their NAT rules, per network and container, stay.
func (p *plan) natOwnersAlive() map[string]bool {
	alive := map[string]bool{}
	for _, a := range p.attachments {
		if a.Verdict.State != Stale {
			alive[a.Key.ContainerID] = true
		}
	}
	return alive
}

// listRecords adds to a dry run's releases the records applying it would
// remove.
func (p *plan) listRecords(releases map[records.Key]*Release) {
	for _, rel := range releases {
		if rel.Key.IfName != "" {
			if r, _ := p.records.Read(rel.Key); r != nil {
				rel.What = append(rel.What, "record")
			}
		}
	}
}

// apply releases what the plan found stale, NAT rules aside
// (releaseNAT): nftables ipMasq rules, lease files by path, records that
// no new ADD replaced meanwhile.
func (s *Sweeper) apply(p *plan, releases map[records.Key]*Release) error {
	var errs []error
	if len(p.stale) > 0 && s.Netfilter != nil {
		if err := s.Netfilter.ReleaseNFTables(p.req.Dir.Network, keepList(p.attachments)); err != nil {
			errs = append(errs, err)
		}
	}
	errs = append(errs, releaseLeases(p.leases, p.stale))
	for _, a := range p.attachments {
		if a.Verdict.State != Stale || a.Record == nil {
			continue
		}
		if removed, err := removeRecordIfUnchanged(p.records, a.Record); err != nil {
			errs = append(errs, err)
		} else if removed {
			releases[a.Key].What = append(releases[a.Key].What, "record")
		}
	}
	return errors.Join(errs...)
}

// removeAbandonedTemps removes the records' temp files whose writer died.
func (s *Sweeper) removeAbandonedTemps(p *plan) {
	if len(p.listing.Temps) == 0 {
		return
	}
	temps, err := p.records.RemoveAbandonedTemps(p.listing, func(pid int) bool { _, ok := s.Host.ProcessStart(pid); return ok })
	for _, path := range temps {
		s.logf("%s: removed %s, abandoned by a writer that died", p.req.Dir.Network, path)
	}
	if err != nil {
		s.logf("%s: %v", p.req.Dir.Network, err)
	}
}

// releaseNAT releases (or, in a dry run, lists) the NAT rules of stale
// containers, and with req.Orphans those of containers the network no
// longer knows. Rules are per network and container ID, not per ifname, so
// a container keeps them while any of its attachments is not stale.
func (s *Sweeper) releaseNAT(p *plan, report *Report, releases map[records.Key]*Release, order *[]records.Key) error {
	req, alive := p.req, p.natOwnersAlive()
	if s.Netfilter == nil || len(s.Netfilter.Families()) == 0 {
		return nil
	}
	snap, err := s.Netfilter.Snapshot(req.Dir.Network)
	if err != nil {
		return fmt.Errorf("read NAT rules of %s: %w", req.Dir.Network, err)
	}
	known := map[string]bool{}
	for _, a := range report.Attachments {
		known[a.Key.ContainerID] = true
	}
	if req.Orphans {
		for _, cid := range snap.Containers() {
			if known[cid] {
				continue
			}
			report.OrphanRules = append(report.OrphanRules, cid)
			k := records.Key{ContainerID: cid}
			releases[k] = &Release{Key: k, Reason: OrphanReason, Orphan: true}
			*order = append(*order, k)
		}
	}
	var errs []error
	done := map[string]bool{}
	for _, k := range *order {
		cid := k.ContainerID
		if alive[cid] || done[cid] {
			continue
		}
		done[cid] = true
		if req.DryRun {
			releases[k].What = append(releases[k].What, snap.Owned(cid)...)
			continue
		}
		removed, err := s.Netfilter.Release(snap, cid)
		releases[k].What = append(releases[k].What, removed...)
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// removeRecordIfUnchanged removes a stale record unless it was replaced
// since the sweep read it: a new ADD for the same attachment may have
// written its pending record meanwhile.
func removeRecordIfUnchanged(store *records.Store, seen *records.Record) (bool, error) {
	now, err := store.Read(seen.Key())
	if err != nil || now == nil {
		return false, err
	}
	if now.State != seen.State || now.PID != seen.PID || !now.Created.Equal(seen.Created) || now.NetnsID != seen.NetnsID {
		return false, nil
	}
	return true, store.Remove(seen.Key())
}

// join groups leases and records by attachment, sorted by first IP, then
// by key for record-only attachments.
func join(leases []Lease, recs []*records.Record) []*Attachment {
	byKey := map[records.Key]*Attachment{}
	var out []*Attachment
	get := func(k records.Key) *Attachment {
		a, ok := byKey[k]
		if !ok {
			a = &Attachment{Key: k}
			byKey[k] = a
			out = append(out, a)
		}
		return a
	}
	for _, l := range leases {
		a := get(l.Key)
		a.Leases = append(a.Leases, l)
	}
	for _, r := range recs {
		get(r.Key()).Record = r
	}
	for _, a := range out {
		sort.Slice(a.Leases, func(i, j int) bool { return bytes.Compare(ip16(a.Leases[i]), ip16(a.Leases[j])) < 0 })
	}
	sort.SliceStable(out, func(i, j int) bool {
		li, lj := out[i].Leases, out[j].Leases
		switch {
		case len(li) > 0 && len(lj) > 0:
			return bytes.Compare(ip16(li[0]), ip16(lj[0])) < 0
		case len(li) != len(lj):
			return len(li) > 0
		}
		return out[i].Key.String() < out[j].Key.String()
	})
	return out
}

func ip16(l Lease) []byte { return l.IP.To16() }

// keepList is every attachment a sweep keeps, for nftables' GC.
func keepList(atts []*Attachment) []types.GCAttachment {
	var keep []types.GCAttachment
	for _, a := range atts {
		if a.Verdict.State != Stale {
			keep = append(keep, types.GCAttachment{ContainerID: a.Key.ContainerID, IfName: a.Key.IfName})
		}
	}
	return keep
}

func collect(m map[records.Key]*Release, order []records.Key) []Release {
	out := make([]Release, 0, len(order))
	for _, k := range order {
		out = append(out, *m[k])
	}
	return out
}

// OrphanReason is the reason given for NAT rules no lease or record holds.
const OrphanReason = "NAT rules without a lease or record"
