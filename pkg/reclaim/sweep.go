package reclaim

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"maps"
	"net"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/netfilter"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/records"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/sysinfo"
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
	// its ADDs leave (ipamdir.OwnedMarker): NAT rules of containers that
	// hold neither a lease nor a record on it are then orphans too.
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
	// SkipUnchangedNAT is a CHECK's: an owned network's NAT rules are not
	// listed for orphans while the ruleset is the one in which an earlier
	// sweep's listing found none (netfilter.RulesetState, this boot). Every
	// rule made or removed since changes it; a record removed by hand
	// without one leaves its rules to the next change or to `gc`.
	SkipUnchangedNAT bool
	// Visit, when set, sees every attachment of the network once, with all
	// its leases and its verdict, as the sweep judges it (in directory
	// order, not sorted). The sweep keeps none of them.
	Visit func(*Attachment)
	// Released, when set, sees every release (in a dry run, every release
	// the sweep would make) once it is done.
	Released func(Release)
	// Problem, when set, takes each file the sweep skipped (a damaged or
	// foreign file); the log names the first ones (maxProblemLines).
	Problem func(error)
	// Unlisted, when set, is asked about each attachment the rules keep
	// live, or detached by a mount only: release reports whether the
	// runtime proved it gone (gc --runtime: not listed, past the grace),
	// and reason says why.
	Unlisted func(a *Attachment) (reason string, release bool)
}

// Release is one stale attachment (or orphan rule set) released, or that
// a dry run would release.
type Release struct {
	Key    records.Key
	IPs    []string
	Reason string
	// HeldBy is the mount that still keeps the released attachment's
	// namespace alive (gc --runtime), if any: the sweep leaves it.
	HeldBy *sysinfo.Holder
	// What lists what went: "lease 10.0.0.2", "chain CNI-...", "record".
	What []string
	// Orphan marks NAT rules of a container the network holds no lease or
	// record of.
	Orphan bool
	// Kept lists what of it stays, with why: the firewall rules of an
	// address another network leases.
	Kept []string
}

func (r Release) String() string {
	ips := cmp.Or(strings.Join(r.IPs, ","), "no lease")
	s := fmt.Sprintf("%s %s: %s; removed %s", r.Key, ips, r.Reason, strings.Join(r.What, ", "))
	if len(r.Kept) > 0 {
		s += "; " + strings.Join(r.Kept, "; ")
	}
	return s
}

// Report is what a sweep did; what it saw went to Request.Visit,
// Request.Released and Request.Problem.
type Report struct {
	Released int // in a dry run, the releases it would make
	// OrphanRules lists container IDs with NAT rules but no lease or record
	// (on a network proved the plugin's, or with Request.Orphans).
	OrphanRules []string
}

// Sweep judges every attachment of one network and releases the stale
// ones, holding host-local's lock (the flock on <dataDir>/<network>/lock
// that every host-local ADD and DEL takes) from the first read to the last
// release, so it never races an allocation. It streams (see sweep): what
// it holds grows with what it must still decide, not with the network. A
// sweep with nothing to release logs nothing and writes nothing.
//
// A release is ordered so that a kill at any step leaves what the next
// sweep finds: NAT rules first, then the leases, then the record, which
// names the rest. NAT rules whose container has neither record nor lease
// are orphans, released when the network is proved the plugin's.
func (s *Sweeper) Sweep(req Request) (*Report, error) {
	report := &Report{}
	owned := req.Orphans || Owns(req.Dir)
	if !owned && !req.Dir.Served() {
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

	j, err := newJudge(&s.Env, req.Dir, req.LegacyDataDir)
	if err != nil {
		return nil, err
	}
	j.endOverdue, j.unlisted = !req.DryRun, req.Unlisted
	if req.GC {
		j.valid = newValidSet(req.Valid)
	}
	leases, err := openLeaseDir(req.Dir.Leases())
	if err != nil {
		return nil, err
	}
	defer leases.close()
	w := &sweep{Sweeper: s, req: req, owned: owned, report: report, records: j.records, leases: leases, judge: j,
		claimed: map[[16]byte]struct{}{}, named: map[[16]byte]struct{}{}, later: map[records.Key]*Attachment{}, causes: map[string]int{}}
	w.addr = addrRules{nf: s.Netfilter, own: req.Dir, roots: leaseRoots(req.Dir, req.LegacyDataDir, req.OtherDataDirs), dryRun: req.DryRun}
	if !req.DryRun {
		w.addr.busy = w.cniCommand
	}
	if err := req.Dir.CheckBookkeeping(); err != nil {
		w.problem(err)
	}
	err = w.run()
	// How many skipped files problem did not log (maxProblemLines).
	if n := w.problems - maxProblemLines; n > 0 {
		w.Logf("%s: skipped %d more damaged or foreign files (nomad-bridge-cni leases lists them all)", req.Dir.Network, n)
	}
	if err == nil && !req.DryRun {
		w.noteNATChecked()
	}
	if err != nil {
		return nil, err
	}
	if !req.DryRun {
		s.countReleases(req.Dir, w.causes)
	}
	return report, errors.Join(w.errs...)
}

// sweep is one Sweep under way. It reads the network in two passes, one
// file at a time (docs/reclaim.md): the records, each judged with the
// leases at the addresses it names (claimed), and released in batches
// (stale) if stale; then the leases no record claimed, grouped by
// attachment (later) and judged once the pass is over, since an
// attachment is judged over all its leases. A stale attachment's files go
// only after its NAT rules, listed after its verdict (releaseStale): its
// own (nftables) with its batch, its container's (iptables) at the end
// (natWait), once it is known whether any attachment of that container
// ID is left that is not stale.
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
	// named: every address a record names, whatever its lease holds.
	claimed, named map[[16]byte]struct{}
	later          map[records.Key]*Attachment
	// rules are the backends' listings of the network, nil until taken in
	// (listNAT). natUnknown: a listing failed, so no stale attachment's
	// files may go (they are what finds its rules next time).
	backends   []netfilter.Backend
	rules      []netfilter.Rules
	owners     []ownerSets
	natUnknown bool
	// cniScanErr: a scan for running CNI commands failed (cniCommand).
	cniScanErr error
	// stale are the stale attachments judged since the rules were last
	// listed (released per natBatch); natWait those waiting for their
	// container's rules.
	stale, natWait []pendingRelease
	addr           addrRules
	// heldRead: readHeld ran; heldUnsure: some of it could not be read,
	// or a live process was writing a record, so no rule is an orphan.
	heldRead, heldUnsure bool
	causes               map[string]int
	errs                 []error
	problems             int
	// natState is the NAT ruleset's state when a CHECK's sweep began;
	// listedForOrphans: the rules are listed for orphans (startNAT);
	// orphanKept: an orphan's rules were left to a running CNI command.
	natState                     netfilter.RulesetState
	listedForOrphans, orphanKept bool
}

// pendingRelease is a stale attachment judged and not yet released.
type pendingRelease struct {
	a   *Attachment
	rel Release
	// failed: some of its rules could not go, so its files stay; busy: for
	// a CNI command of its container that runs, they were left to it.
	failed bool
	busy   *netfilter.BusyError
}

// ownerSets is what a sweep knows of one backend's owners of rules
// (netfilter.Backend.OwnerOf), each set held by hash (idSet).
type ownerSets struct {
	// alive: owners of attachments that are not stale (kept for a shared
	// backend only); seen: of every attachment and damaged record, and of
	// what readHeld found once the rules were listed.
	alive, seen idSet
	// unsure: an attachment whose owner cannot be told (no ifname) was
	// met: none of the backend's rules is an orphan.
	unsure bool
}

// natBatch bounds the stale attachments released at once (one listing
// each; their nftables rules go in batches of netfilter's nftBatchRules).
const natBatch = 1024

func (w *sweep) run() error {
	w.startNAT()
	if w.req.GC {
		w.listedValid()
	}
	writing, err := w.records.Walk(w.record, func(err error, k records.Key, named bool) {
		w.problem(err)
		if named {
			// A record that cannot be read may be a live container's.
			w.saw(k, true) // its file is named for it
		}
	})
	if err != nil {
		return err
	}
	if !w.req.DryRun && len(writing) > 0 {
		// The records' temp files whose writer died.
		temps, err := w.records.RemoveAbandonedTemps(writing, w.running)
		for _, path := range temps {
			w.Logf("%s: removed %s, abandoned by a writer that died", w.req.Dir.Network, path)
		}
		if err != nil {
			w.Logf("%s: %v", w.req.Dir.Network, err)
		}
	}
	skip := func(a [16]byte) bool { _, ok := w.claimed[a]; return ok }
	if err := w.leases.each(skip, w.lease, w.leaseProblem); err != nil {
		return err
	}
	w.claimed, w.named = nil, nil
	for _, a := range sortedAttachments(w.later) {
		if a.Record == nil && a.Key.IfName != "" {
			// A record that could not be read was reported by pass 1;
			// without it, the leases are judged on their own.
			a.Record, _ = w.records.Read(a.Key)
		}
		w.judged(a)
	}
	w.releaseStale()
	w.releaseNAT()
	return nil
}

// record is pass 1: a record, judged with the leases it names. A record
// with addresses is judged by itself (leases only matter to a pending one,
// which is judged after pass 2). Outside a dry run or the GC verb, the
// leases of a record judged alive are taken as its own whatever their
// files say: the sweep keeps them either way, so it only checks they are
// there, and the common sweep (nothing stale) reads records only. The
// node-sweep bound needs it: reading them too made a CHECK's sweep of 1023
// live attachments 60.1 ms (p90 88.1) instead of 32.9 ms, against a bound
// of 72 ms (make bench, 2026-12-07). A stale record's leases are read:
// each goes only if it still names the attachment.
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
		w.named[ip16(ip)] = struct{}{}
		if trust {
			path, ok := w.leases.holds(ip)
			if !ok {
				continue
			}
			a.Leases = append(a.Leases, Lease{IP: ip, Path: path, Key: a.Key})
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

// leaseProblem is pass 2's problem with a lease. An empty one that no
// record names, a write whose host-local died (EmptyLeaseError), is
// released: its address would be lost until the next boot. One a record
// names is reported and kept: that is not host-local's doing.
func (w *sweep) leaseProblem(err error) {
	var empty *EmptyLeaseError
	var ip net.IP
	if errors.As(err, &empty) {
		ip = net.ParseIP(filepath.Base(empty.Path))
	}
	if ip == nil {
		w.problem(err)
		return
	}
	if _, named := w.named[ip16(ip)]; named {
		w.problem(err)
		return
	}
	if !w.req.DryRun {
		if rerr := w.leases.remove([]Lease{{Path: empty.Path}}); rerr != nil {
			w.problem(errors.Join(err, rerr))
			return
		}
		w.causes[CauseEmptyLease]++
	}
	// It names no container: "-" stands for one in what gc prints.
	w.released(Release{Key: records.Key{ContainerID: "-"}, IPs: []string{ip.String()}, Reason: "an empty lease: its host-local died between creating and writing it", What: []string{"lease " + ip.String()}})
}

// maxProblemLines bounds the lines one sweep writes about files it
// skipped: a CHECK's stderr goes to the runtime's log, and 100 000 planted
// files must not put 100 000 lines there on every CHECK. Request.Problem
// takes them all (`leases`, `gc` list them).
const maxProblemLines = 20

func (w *sweep) problem(err error) {
	w.problems++
	w.tell(err)
	if w.problems <= maxProblemLines {
		w.Logf("%s: skipped: %v", w.req.Dir.Network, err)
	}
}

// tell says err where the sweep's problems are said.
func (w *sweep) tell(err error) {
	if w.req.Problem != nil {
		w.req.Problem(err)
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
	w.saw(a.Key, a.Record != nil)
	if a.Verdict.State != Stale {
		w.each(a.Key, true, func(i int, owner string) { w.owners[i].alive.add(owner) })
		return
	}
	w.stale = append(w.stale, pendingRelease{a: a, rel: releaseOf(a)})
	if len(w.stale) == natBatch {
		w.releaseStale()
	}
}

// releaseFiles ends a release (finishRelease) unless its NAT rules could
// not go (p.failed): rules that could not go keep the files, through
// which the next sweep finds them.
func (w *sweep) releaseFiles(p pendingRelease) {
	if !p.failed {
		released, err := finishRelease(&w.addr, w.leases, w.records, &p)
		if err != nil {
			w.errs = append(w.errs, err)
		}
		p.failed = !released
	}
	if p.failed {
		if p.busy != nil {
			w.keptBusy(fmt.Sprintf("kept %s for now (%s): %v", p.a.Key, p.rel.Reason, p.busy), p.rel.What[len(p.a.Leases):])
		}
		return
	}
	// Counted once it went: one kept is counted by the sweep that
	// releases it.
	w.causes[p.a.Verdict.Cause]++
	w.causes[ForwardKeptCount] += len(p.rel.Kept)
	w.released(p.rel)
}

// rememberReleases writes what ps's releases of a container that may be
// restored in place remember (remember), once for them all and before
// their files go: the restore's ADD reads them, without host-local's
// lock, as soon as it finds no record. One whose files then stay
// remembers a hint its record overrides.
func (w *sweep) rememberReleases(ps []pendingRelease) {
	if w.req.DryRun {
		return
	}
	var entries map[string]remembered
	for _, p := range ps {
		if p.failed || p.a.Record == nil || !remembersCause(p.a.Verdict.Cause) {
			continue
		}
		if ips := addressesOf(p.a); len(ips) > 0 {
			entries = rememberIn(entries, p.a.Key, ips, w.Host.Now())
		}
	}
	if len(entries) > 0 {
		if err := w.remember(w.req.Dir, entries); err != nil {
			w.Logf("%s: remembering released addresses for their restores: %v", w.req.Dir.Network, err)
		}
	}
}

// cniCommand tells whether a CNI command of container cid runs
// (Host.CNIProcesses). A scan that fails once (its time bound: a process
// whose memory cannot be read) is not made again in this sweep: every
// container asked about after it counts as one a command may run for.
func (w *sweep) cniCommand(cid string) *netfilter.BusyError {
	if w.cniScanErr == nil {
		pids, err := w.Host.CNIProcesses([]string{cid})
		if err == nil {
			if pid := pids[cid]; pid != 0 {
				return &netfilter.BusyError{ContainerID: cid, PID: pid}
			}
			return nil
		}
		w.cniScanErr = err
	}
	return &netfilter.BusyError{ContainerID: cid, Err: w.cniScanErr}
}

func (w *sweep) released(rel Release) {
	w.report.Released++
	if !w.req.DryRun {
		w.Logf("%s: released %s", w.req.Dir.Network, rel)
	}
	if w.req.Released != nil {
		w.req.Released(rel)
	}
}

// sortedAttachments orders attachments by first address, then by key for
// those without a lease (a stable order for what is judged last).
func sortedAttachments(m map[records.Key]*Attachment) []*Attachment {
	out := slices.Collect(maps.Values(m))
	for _, a := range out {
		sortLeases(a.Leases)
	}
	slices.SortFunc(out, func(a, b *Attachment) int {
		if len(a.Leases) > 0 && len(b.Leases) > 0 {
			return bytes.Compare(a.Leases[0].IP.To16(), b.Leases[0].IP.To16())
		}
		// At most one has leases: it goes first.
		return cmp.Or(cmp.Compare(len(b.Leases), len(a.Leases)), strings.Compare(a.Key.String(), b.Key.String()))
	})
	return out
}

func sortLeases(ls []Lease) {
	slices.SortFunc(ls, func(a, b Lease) int { return bytes.Compare(a.IP.To16(), b.IP.To16()) })
}

func ip16(ip net.IP) [16]byte { return [16]byte(ip.To16()) }
