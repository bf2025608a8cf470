package reclaim

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"sort"
	"strings"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/netfilter"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/records"
)

// Sweeper judges every attachment of a network and releases the stale
// ones (Sweep), and keeps the sweep's bookkeeping next to the records (when
// the last CHECK sweep ended, releases counted by cause).
type Sweeper struct{ Env }

// Request says which network to sweep and by which rules, and who wants
// to see what it finds.
type Request struct {
	Dir ipamdir.Dir
	// GC is set for the runtime's GC verb: every attachment not in Valid is
	// stale (a nil Valid means none is valid, as host-local reads it).
	GC    bool
	Valid []types.GCAttachment
	// Orphans treats the network as the plugin's even without the marker
	// its ADDs leave (ipamdir.OwnedMarker): NAT rules of containers that hold
	// neither a lease nor a record on it are then orphans too. Without
	// it, only a network proved the plugin's has orphans.
	Orphans bool
	// LegacyDataDir is the legacy lease directory's parent (host-local's
	// default /var/lib/cni/networks, or the entry's own ipam.dataDir): a
	// container with a lease there is not an orphan. Empty: none.
	LegacyDataDir string
	// OtherDataDirs are the plugin's other data dirs on this host (the
	// default one, when gc sweeps another): a container with a lease or a
	// record of this network there is not an orphan here either.
	OtherDataDirs []string
	// DryRun decides and reports, and changes nothing.
	DryRun bool
	// Visit, when set, sees every attachment of the network once, with all
	// its leases and its verdict, as the sweep judges it (in directory
	// order, not sorted). The sweep keeps none of them.
	Visit func(*Attachment)
	// Released, when set, sees every release (in a dry run, every release
	// the sweep would make) once it is done.
	Released func(Release)
	// Problem, when set, takes each file the sweep skipped (a damaged or
	// foreign file) instead of Report.Problems, which then stays empty.
	Problem func(error)
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
	// record of.
	Orphan bool
}

func (r Release) String() string {
	ips := strings.Join(r.IPs, ",")
	if ips == "" {
		ips = "no lease"
	}
	return fmt.Sprintf("%s %s: %s; removed %s", r.Key, ips, r.Reason, strings.Join(r.What, ", "))
}

// Report is what a sweep did; what it saw went to Request.Visit and
// Request.Released.
type Report struct {
	Network string
	// Released counts the releases (in a dry run, those it would make).
	Released int
	// OrphanRules lists container IDs with NAT rules but no lease or record
	// (on a network proved the plugin's, or with Request.Orphans).
	OrphanRules []string
	Problems    []error
}

// Sweep judges every attachment of one network and releases the stale
// ones, holding host-local's lock (the flock on <dataDir>/<network>/lock
// that every host-local ADD and DEL takes) from the first read to the last
// release, so it never races an allocation. It streams: each attachment
// is judged, shown to Request.Visit and, if stale, released before the
// next is read (or, when NAT rules must go first, at the end of a batch or
// of the sweep), so that what it holds grows with what it must still
// decide, not with the network (see sweep). A sweep with nothing to
// release writes nothing and logs nothing.
//
// A release is ordered so that a kill at any step leaves what the next
// sweep finds: NAT rules first, then the leases, then the record, which
// names the rest. NAT rules whose container has neither record nor lease
// (left by an earlier version, or by a runtime that ran bare bridge) are
// orphans, released when the network is proved the plugin's.
func (s *Sweeper) Sweep(req Request) (*Report, error) {
	report := &Report{Network: req.Dir.Network}
	owned := req.Orphans || owns(req.Dir)
	if !owned && !exists(req.Dir.Leases()) && !exists(req.Dir.Records()) {
		return report, nil
	}
	lock := req.Dir.Lock
	if req.DryRun {
		lock = req.Dir.LockExisting // what only reads creates nothing
	}
	unlock, err := lock()
	if err != nil {
		return nil, err
	}
	defer unlock()

	j, err := newJudge(s.Host, records.NewStore(req.Dir), req.Valid, req.GC)
	if err != nil {
		return nil, err
	}
	j.endOverdue, j.logf = !req.DryRun, s.logf
	leases, err := openLeaseDir(req.Dir.Leases())
	if err != nil {
		return nil, err
	}
	defer leases.close()
	w := &sweep{Sweeper: s, req: req, owned: owned, report: report, records: j.records, leases: leases, judge: j,
		claimed: map[[16]byte]struct{}{}, later: map[records.Key]*Attachment{}, causes: map[string]int{}}
	err = w.run()
	w.summariseProblems()
	if err != nil {
		return nil, err
	}
	if !req.DryRun {
		s.countReleases(req.Dir, w.causes)
	}
	return report, errors.Join(w.errs...)
}

// sweep is one Sweep under way. It reads the network in two passes, one
// file at a time:
//
//  1. the records: each record with addresses is judged with the leases
//     at those addresses that name it (read by path), and released at
//     once if stale; those addresses are remembered (claimed);
//  2. the leases: a lease at a claimed address was judged in pass 1 and
//     is not read again; the others (no record, or a record that names no
//     address: a pending ADD, a migrated lease) are grouped by attachment
//     (later) and judged once the pass is over, since an attachment is
//     judged over all its leases (dual-stack, several ranges) and a
//     record-less one is unknown if any of them is from this boot.
//
// A stale attachment's files go only after its NAT rules: its nftables
// rules go per batch of stale attachments (batch), and its iptables rules
// belong to its container ID, which may have several attachments, so a
// stale one whose container owns rules waits for the end (natWait), when
// it is known whether any attachment of that ID is left that is not stale.
// Container IDs are remembered by hash (idSet).
type sweep struct {
	*Sweeper
	req Request
	// owned: the network is proved the plugin's, so NAT rules of
	// containers it holds nothing of are orphans.
	owned   bool
	report  *Report
	records *records.Store
	leases  *leaseDir
	judge   *judge
	// claimed are the addresses judged in pass 1.
	claimed map[[16]byte]struct{}
	// later are the attachments judged after pass 2.
	later map[records.Key]*Attachment
	// alive holds the container IDs of attachments that are not stale,
	// seen those of every attachment and of every damaged record (for
	// the orphans), and seenNFT their nftables instance hashes (only when
	// the sweep looks for nftables orphans: nftOrphans).
	alive, seen, seenNFT idSet
	// recorded and recordedNFT are the container IDs and nftables
	// instances with a record when the orphans are decided, read once
	// after the rules were listed (recordedSince); recordsUnsure: that
	// read failed, or a live process was writing a record.
	recorded, recordedNFT      idSet
	recordsRead, recordsUnsure bool
	// nat is the network's NAT rules, listed at the first stale attachment
	// (natListed); natWait the stale attachments of containers that own
	// some, released at the end.
	nat       *netfilter.Snapshot
	natListed bool
	// natUnknown: listing the NAT rules failed, so no stale attachment's
	// files may go (they are what finds its rules next time).
	natUnknown bool
	natWait    []pendingRelease
	// elsewhere holds the container IDs with a lease in the legacy lease
	// directory or a lease or record in another data dir (readElsewhere),
	// and elsewhereNFT their nftables instances, read when the first
	// orphan is found (elsewhereRead); elsewhereNoIfName: a lease there
	// names no ifname, so its nftables rules cannot be told.
	elsewhere, elsewhereNFT                               idSet
	elsewhereRead, elsewhereUnreadable, elsewhereNoIfName bool
	// batch holds stale attachments whose files go once their nftables
	// rules went (flushBatch).
	batch  []pendingRelease
	causes map[string]int
	errs   []error
	// problems counts the files skipped (see problem).
	problems int
}

// pendingRelease is a stale attachment judged and not yet released.
type pendingRelease struct {
	a   *Attachment
	rel Release
}

// nftBatch bounds the stale attachments whose nftables rules are released
// at once (one netlink listing and one batch each).
const nftBatch = 1024

func (w *sweep) run() error {
	listing, err := w.records.WalkStreaming(w.record, func(err error, k records.Key, named bool) {
		w.problem(err)
		if named {
			// A record that cannot be read may be a live container's.
			w.saw(k, true) // its file is named for it
		}
	})
	if err != nil {
		return err
	}
	if !w.req.DryRun && len(listing.Temps) > 0 {
		w.removeAbandonedTemps(listing)
	}
	skip := func(ip net.IP) bool { _, ok := w.claimed[ip16(ip)]; return ok }
	if err := w.leases.each(skip, w.lease, w.problem); err != nil {
		return err
	}
	w.claimed = nil
	for _, a := range sortedAttachments(w.later) {
		if a.Record == nil && a.Key.IfName != "" {
			// A record that could not be read was reported by pass 1;
			// without it, the leases are judged on their own.
			a.Record, _ = w.records.Read(a.Key)
		}
		w.judged(a)
	}
	w.flushBatch()
	w.releaseNAT()
	return nil
}

// record is pass 1: a record, judged with the leases it names. A record
// with addresses is judged by itself (leases only matter to a pending one,
// which is judged after pass 2). Outside a dry run or the GC verb, the leases of a
// record judged alive are taken as its own whatever their files say: the
// sweep keeps them either way, so it only checks they are there, and the
// common sweep (nothing stale) reads records only. A stale record's leases
// are read: each goes only if it still names the attachment.
func (w *sweep) record(r *records.Record) {
	a := &Attachment{Key: r.Key(), Record: r}
	if len(r.IPs) == 0 || r.State == records.Started {
		w.later[a.Key] = a
		return
	}
	a.Verdict = w.judge.verdict(a)
	trust := !w.req.DryRun && !w.req.GC && a.Verdict.State != Stale
	for _, cidr := range r.IPs {
		ip, _, err := net.ParseCIDR(cidr)
		if err != nil {
			continue
		}
		if trust {
			if !w.leases.holds(ip) {
				continue
			}
			a.Leases = append(a.Leases, Lease{IP: ip, Path: w.req.Dir.Lease(ip), Key: a.Key})
		} else {
			l, err := w.leases.read(ip)
			if err != nil || l.Key != a.Key {
				// Gone, damaged (pass 2 reports it) or another attachment's.
				continue
			}
			a.Leases = append(a.Leases, l)
		}
		w.claimed[ip16(ip)] = struct{}{}
	}
	sortLeases(a.Leases)
	w.judged(a)
}

// lease is pass 2: a lease no record claimed, kept for the end.
func (w *sweep) lease(l Lease) {
	a := w.later[l.Key]
	if a == nil {
		a = &Attachment{Key: l.Key}
		w.later[l.Key] = a
	}
	a.Leases = append(a.Leases, l)
}

// maxProblemLines bounds the lines one sweep writes about files it
// skipped: a CHECK's stderr goes to the runtime's log, and 100 000 planted
// files must not put 100 000 lines there on every CHECK. The report keeps
// them all (`leases`, `gc` list them).
const maxProblemLines = 20

func (w *sweep) problem(err error) {
	w.problems++
	if w.req.Problem != nil {
		w.req.Problem(err)
	} else {
		w.report.Problems = append(w.report.Problems, err)
	}
	if w.problems <= maxProblemLines {
		w.logf("%s: skipped: %v", w.req.Dir.Network, err)
	}
}

// summariseProblems says how many skipped files problem did not log.
func (w *sweep) summariseProblems() {
	if n := w.problems - maxProblemLines; n > 0 {
		w.logf("%s: skipped %d more damaged or foreign files (nomad-bridge-cni leases lists them all)", w.req.Dir.Network, n)
	}
}

// judged judges an attachment (unless pass 1 did), shows it, and
// releases it if stale.
func (w *sweep) judged(a *Attachment) {
	if a.Verdict.State == "" {
		a.Verdict = w.judge.verdict(a)
	}
	if w.req.Visit != nil {
		w.req.Visit(a)
	}
	cid := a.Key.ContainerID
	w.saw(a.Key, a.Record != nil)
	if a.Verdict.State != Stale {
		w.alive.add(cid)
		return
	}
	snap := w.natSnapshot()
	if w.natUnknown {
		return // kept whole for the next sweep; the listing's error is reported
	}
	w.causes[a.Verdict.Cause]++
	p := pendingRelease{a: a, rel: releaseOf(a)}
	if snap != nil && len(snap.Owned(cid)) > 0 {
		w.natWait = append(w.natWait, p)
		return
	}
	w.batch = append(w.batch, p)
	if len(w.batch) == nftBatch || !w.nftables() {
		w.flushBatch()
	}
}

// saw remembers an attachment the network holds something of: its
// container's NAT rules are no orphans. Its nftables instance (a hash, a
// couple of microseconds) is only computed here for an attachment no
// record file names: those that have one are hashed by readRecordsAgain,
// which runs only once nftables rules of the network were found.
func (w *sweep) saw(k records.Key, recorded bool) {
	w.seen.add(k.ContainerID)
	if !recorded && w.nftOrphans() {
		w.seenNFT.add(netfilter.NFTInstance(w.req.Dir.Network, k.IfName, k.ContainerID))
	}
}

// nftOrphans reports whether the sweep looks for nftables ipMasq orphans.
func (w *sweep) nftOrphans() bool {
	return w.owned && w.Netfilter != nil && w.Netfilter.NFTablesOrphans != nil
}

// nftables reports whether the sweep releases nftables ipMasq rules.
func (w *sweep) nftables() bool {
	return !w.req.DryRun && w.Netfilter != nil && w.Netfilter.NFTablesRelease != nil
}

// flushBatch releases the batch: the nftables rules of its attachments in
// one netlink batch, then their files. If the rules could not go, the
// files stay for the next sweep, which finds the rules through them.
func (w *sweep) flushBatch() {
	if len(w.batch) == 0 {
		return
	}
	if err := w.releaseNFTables(w.batch); err != nil {
		w.errs = append(w.errs, err)
		w.batch = w.batch[:0]
		return
	}
	for _, p := range w.batch {
		w.releaseFiles(p)
	}
	w.batch = w.batch[:0]
}

// releaseNFTables releases the nftables ipMasq rules of stale attachments
// in one listing and one batch.
func (w *sweep) releaseNFTables(ps []pendingRelease) error {
	if !w.nftables() || len(ps) == 0 {
		return nil
	}
	atts := make([]types.GCAttachment, 0, len(ps))
	for _, p := range ps {
		atts = append(atts, types.GCAttachment{ContainerID: p.a.Key.ContainerID, IfName: p.a.Key.IfName})
	}
	return w.Netfilter.ReleaseNFTables(w.req.Dir.Network, atts)
}

// releaseFiles ends a release, its NAT rules gone: the leases, then the
// record.
func (w *sweep) releaseFiles(p pendingRelease) {
	recordGone, err := releaseFiles(w.leases, w.records, p.a, w.req.DryRun)
	if err != nil {
		w.errs = append(w.errs, err)
	}
	if recordGone {
		p.rel.What = append(p.rel.What, "record")
	}
	w.released(p.rel)
}

func (w *sweep) released(rel Release) {
	w.report.Released++
	if !w.req.DryRun {
		w.logf("%s: released %s", w.req.Dir.Network, rel)
	}
	if w.req.Released != nil {
		w.req.Released(rel)
	}
}

// natSnapshot lists the network's NAT rules once, when first needed; nil
// without iptables (or when listing failed, which is reported).
func (w *sweep) natSnapshot() *netfilter.Snapshot {
	if w.natListed {
		return w.nat
	}
	w.natListed = true
	if w.Netfilter == nil || len(w.Netfilter.Families()) == 0 {
		return nil
	}
	snap, err := w.Netfilter.Snapshot(w.req.Dir.Network)
	if err != nil {
		w.errs = append(w.errs, fmt.Errorf("read NAT rules of %s: %w", w.req.Dir.Network, err))
		w.natUnknown = true
		return nil
	}
	w.nat = snap
	return snap
}

// releaseNAT ends the sweep: the stale attachments of containers that own
// NAT rules, each container's rules first (once no attachment of it is
// left that is not stale; rules are per network and container ID, not per
// ifname), then its attachments' files; then the orphans' rules. An
// attachment whose rules could not go keeps its files for the next sweep.
func (w *sweep) releaseNAT() {
	var snap *netfilter.Snapshot
	if len(w.natWait) > 0 || w.owned {
		snap = w.natSnapshot()
	}
	failed := map[string]bool{}
	done := map[string]bool{}
	for i := range w.natWait {
		p := &w.natWait[i]
		cid := p.rel.Key.ContainerID
		if w.alive.has(cid) || done[cid] {
			continue
		}
		done[cid] = true
		removed, err := w.releaseRules(snap, cid)
		p.rel.What = append(p.rel.What, removed...)
		failed[cid] = err != nil
	}
	// Their nftables rules too, before their files.
	if err := w.releaseNFTables(w.natWait); err != nil {
		w.errs = append(w.errs, err)
		w.natWait = nil
	}
	for _, p := range w.natWait {
		if !failed[p.rel.Key.ContainerID] {
			w.releaseFiles(p)
		}
	}
	w.natWait = nil
	if !w.owned {
		return
	}
	w.releaseNFTOrphans()
	if snap == nil {
		return
	}
	for _, cid := range snap.Containers() {
		if w.seen.has(cid) || w.heldElsewhere(cid) || w.recordedSince(cid) {
			continue
		}
		w.report.OrphanRules = append(w.report.OrphanRules, cid)
		w.causes[CauseOrphanRules]++
		removed, _ := w.releaseRules(snap, cid)
		w.released(Release{Key: records.Key{ContainerID: cid}, Reason: OrphanReason, Orphan: true, What: removed})
	}
}

// releaseNFTOrphans releases the nftables ipMasq rules of attachments the
// network holds nothing of, as releaseNAT does for iptables.
func (w *sweep) releaseNFTOrphans() {
	if !w.nftOrphans() {
		return
	}
	keep := func(instance string) bool {
		return w.seenNFT.has(instance) || w.heldElsewhereNFT(instance) || w.recordedSinceNFT(instance)
	}
	orphans, err := w.Netfilter.ReleaseNFTablesOrphans(w.req.Dir.Network, keep, w.req.DryRun)
	if err != nil {
		w.errs = append(w.errs, err)
		return
	}
	for _, o := range orphans {
		id := o.ContainerID
		if o.Cut {
			id += "…"
		}
		w.report.OrphanRules = append(w.report.OrphanRules, id)
		w.causes[CauseOrphanRules]++
		w.released(Release{Key: records.Key{ContainerID: id, IfName: o.IfName}, Reason: OrphanReason, Orphan: true, What: []string{"nftables ipMasq rules " + o.Instance}})
	}
}

// recordedSince reports whether cid has a record now, or may be getting
// one. The rules were listed before this is asked, and an ADD writes its
// record before its delegate makes any rule: an ADD that began after the
// sweep read the records is found here, and its rules are no orphans.
func (w *sweep) recordedSince(cid string) bool {
	w.readRecordsAgain()
	return w.recordsUnsure || w.recorded.has(cid)
}

// recordedSinceNFT is recordedSince for an nftables instance.
func (w *sweep) recordedSinceNFT(instance string) bool {
	w.readRecordsAgain()
	return w.recordsUnsure || w.recordedNFT.has(instance)
}

// readRecordsAgain reads the records' names once, for the orphans.
func (w *sweep) readRecordsAgain() {
	if w.recordsRead {
		return
	}
	w.recordsRead = true
	temps, err := w.records.EachName(func(k records.Key) {
		w.recorded.add(k.ContainerID)
		if w.nftOrphans() {
			w.recordedNFT.add(netfilter.NFTInstance(w.req.Dir.Network, k.IfName, k.ContainerID))
		}
	})
	if err != nil {
		w.problem(fmt.Errorf("orphan NAT rules kept: %w", err))
		w.recordsUnsure = true
		return
	}
	for _, pid := range temps.Temps {
		if _, ok := w.Host.ProcessStart(pid); ok {
			// A record being written may be an ADD's whose rules are
			// listed; the next sweep decides.
			w.recordsUnsure = true
		}
	}
}

// heldElsewhere reports whether cid holds something of the network outside
// the swept data dir (readElsewhere): a runtime that still adds it through
// bare bridge, or the plugin through another data dir, made its NAT rules.
// A directory that cannot be read proves nothing, so every container then
// counts as holding one.
func (w *sweep) heldElsewhere(cid string) bool {
	if w.req.LegacyDataDir == "" && len(w.req.OtherDataDirs) == 0 {
		return false
	}
	if !w.elsewhereRead {
		w.elsewhereRead = true
		w.readElsewhere()
	}
	return w.elsewhereUnreadable || w.elsewhere.has(cid)
}

// readElsewhere reads who holds something of the network outside the
// swept data dir: leases in the legacy directory, leases and records in
// the plugin's other data dirs.
func (w *sweep) readElsewhere() {
	hold := func(k records.Key) {
		w.elsewhere.add(k.ContainerID)
		if k.IfName == "" {
			w.elsewhereNoIfName = true
		}
		if w.nftOrphans() {
			w.elsewhereNFT.add(netfilter.NFTInstance(w.req.Dir.Network, k.IfName, k.ContainerID))
		}
	}
	unreadable := func(err error) {
		w.problem(fmt.Errorf("orphan NAT rules kept: %w", err))
		w.elsewhereUnreadable = true
	}
	var leaseDirs []string
	if w.req.LegacyDataDir != "" {
		leaseDirs = append(leaseDirs, ipamdir.New(w.req.LegacyDataDir, w.req.Dir.Network).Leases())
	}
	for _, other := range w.req.OtherDataDirs {
		d := ipamdir.New(other, w.req.Dir.Network)
		leaseDirs = append(leaseDirs, d.Leases())
		if _, err := records.NewStore(d).EachName(hold); err != nil {
			unreadable(err)
		}
	}
	for _, dir := range leaseDirs {
		list, err := readLeases(dir)
		if err != nil {
			unreadable(err)
			continue
		}
		for _, l := range list.leases {
			hold(l.Key)
		}
	}
}

// heldElsewhereNFT is heldElsewhere for an nftables instance: a lease that
// names no ifname may be any instance of its container.
func (w *sweep) heldElsewhereNFT(instance string) bool {
	if w.req.LegacyDataDir == "" && len(w.req.OtherDataDirs) == 0 {
		return false
	}
	w.heldElsewhere("")
	return w.elsewhereUnreadable || w.elsewhereNoIfName || w.elsewhereNFT.has(instance)
}

func (w *sweep) releaseRules(snap *netfilter.Snapshot, cid string) ([]string, error) {
	if snap == nil {
		return nil, nil
	}
	if w.req.DryRun {
		return snap.Owned(cid), nil
	}
	removed, err := w.Netfilter.Release(snap, cid)
	if err != nil {
		w.errs = append(w.errs, err)
	}
	return removed, err
}

// removeAbandonedTemps removes the records' temp files whose writer died.
func (w *sweep) removeAbandonedTemps(l *records.Listing) {
	temps, err := w.records.RemoveAbandonedTemps(l, func(pid int) bool { _, ok := w.Host.ProcessStart(pid); return ok })
	for _, path := range temps {
		w.logf("%s: removed %s, abandoned by a writer that died", w.req.Dir.Network, path)
	}
	if err != nil {
		w.logf("%s: %v", w.req.Dir.Network, err)
	}
}

// sortedAttachments orders attachments by first address, then by key for
// those without a lease (a stable order for what is judged last).
func sortedAttachments(m map[records.Key]*Attachment) []*Attachment {
	out := make([]*Attachment, 0, len(m))
	for _, a := range m {
		sortLeases(a.Leases)
		out = append(out, a)
	}
	sort.Slice(out, func(i, j int) bool {
		li, lj := out[i].Leases, out[j].Leases
		switch {
		case len(li) > 0 && len(lj) > 0:
			return bytes.Compare(li[0].IP.To16(), lj[0].IP.To16()) < 0
		case len(li) != len(lj):
			return len(li) > 0
		}
		return out[i].Key.String() < out[j].Key.String()
	})
	return out
}

func sortLeases(ls []Lease) {
	sort.Slice(ls, func(i, j int) bool { return bytes.Compare(ls[i].IP.To16(), ls[j].IP.To16()) < 0 })
}

func ip16(ip net.IP) [16]byte { return [16]byte(ip.To16()) }

// OrphanReason is the reason given for NAT rules no lease or record holds.
const OrphanReason = "NAT rules without a lease or record"
