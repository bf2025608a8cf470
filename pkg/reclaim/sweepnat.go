package reclaim

import (
	"errors"
	"fmt"
	"strings"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/netfilter"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/records"
)

// A sweep's NAT rules, in every backend alike (netfilter.Backend): a stale
// attachment's rules go before its files; an owner's rules that no
// attachment, record or other data dir holds are orphans, released on a
// network proved the plugin's.

// startNAT finds the backends; an owned network's rules are listed from
// the start, on another goroutine while the records are read (an iptables
// and an ip6tables exec: their time overlaps the walk's), so that what
// the orphans need is there when the walk ends.
func (w *sweep) startNAT() {
	if w.Netfilter != nil {
		w.backends = w.Netfilter.Backends()
	}
	w.owners = make([]ownerSets, len(w.backends))
	for i, b := range w.backends {
		w.owners[i].tracked = b.Shared()
	}
	if w.owned {
		w.startListing()
	}
}

// natListing is the listing of the network's rules, made once on its own
// goroutine; listNAT waits for it and takes it in.
type natListing struct {
	done  chan struct{}
	rules []netfilter.Rules
	errs  []error
}

// startListing lists the network's rules in every backend, once, on a
// goroutine of its own: Backend.List touches nothing of the sweep.
func (w *sweep) startListing() {
	if w.listing != nil {
		return
	}
	n := len(w.backends)
	l := &natListing{done: make(chan struct{}), rules: make([]netfilter.Rules, n), errs: make([]error, n)}
	w.listing = l
	backends, network := w.backends, w.req.Dir.Network
	go func() {
		defer close(l.done)
		for i, b := range backends {
			l.rules[i], l.errs[i] = b.List(network)
		}
	}()
}

// listNAT makes the network's listing (or waits for the one under way)
// and takes it in, once. Until then, a backend whose owners are
// attachments (nftables) is not tracked: only record-less attachments
// need it (saw), and those are judged after the listing is in.
func (w *sweep) listNAT() {
	if w.natListed {
		return
	}
	w.startListing()
	<-w.listing.done
	w.natListed = true
	w.rules = make([]netfilter.Rules, len(w.backends))
	for i, b := range w.backends {
		if err := w.listing.errs[i]; err != nil {
			w.errs = append(w.errs, fmt.Errorf("read %s NAT rules of %s: %w", b.Name(), w.req.Dir.Network, err))
			w.natUnknown = true
			continue
		}
		rules := w.listing.rules[i]
		w.rules[i] = rules
		if !b.Shared() && w.owned && len(rules.Owners()) > 0 {
			w.owners[i].tracked = true
		}
	}
}

// listNATForRelease is listNAT for the release of a stale attachment. Its
// verdict proved that nothing of its ADD still runs (no process holds the
// record's lock); a listing started before that may miss rules the ADD's
// last process made just before it let go. So the release takes a listing
// started after its first stale verdict: the one under way (the owned
// network's, from the start) is taken in, then made again. It serves the
// orphans too: the records are still read again after it.
func (w *sweep) listNATForRelease() {
	if w.relisted {
		return
	}
	w.relisted = true
	if w.listing == nil {
		w.listNAT() // started now, after the verdict
		return
	}
	if w.listNAT(); w.natUnknown {
		return
	}
	w.listing, w.natListed = nil, false
	w.listNAT()
}

// waitNAT takes in a listing under way, if any: what is judged from here
// on may need it.
func (w *sweep) waitNAT() {
	if w.listing != nil {
		w.listNAT()
	}
}

// each calls fn with the owner of k's rules in every tracked backend that
// want selects (nil: all); an owner that cannot be told makes that backend
// unsure. An owner is asked for only where it is used: an nftables one is
// a hash.
func (w *sweep) each(k records.Key, want func(i int) bool, fn func(i int, owner string)) {
	for i, b := range w.backends {
		if !w.owners[i].tracked || (want != nil && !want(i)) {
			continue
		}
		owner, ok := b.OwnerOf(w.req.Dir.Network, k.ContainerID, k.IfName)
		if !ok {
			w.owners[i].unsure = true
			continue
		}
		fn(i, owner)
	}
}

// shared selects the backends whose owners attachments share (iptables).
func (w *sweep) shared(i int) bool { return w.backends[i].Shared() }

// saw remembers an attachment the network holds something of: its rules
// are no orphans. A backend whose owners are attachments learns those
// with a record from readRecordsAgain, which runs only when its rules
// are examined for orphans (a hash each, saved on every other sweep).
func (w *sweep) saw(k records.Key, recorded bool) {
	want := w.shared
	if !recorded {
		want = nil
	}
	w.each(k, want, func(i int, owner string) { w.owners[i].seen.add(owner) })
}

// flushBatch releases the batch: its attachments' own NAT rules, then the
// files of those whose rules went. If rules could not go, their files stay
// for the next sweep, which finds the rules through them.
func (w *sweep) flushBatch() {
	if len(w.batch) == 0 {
		return
	}
	w.releaseRulesOf(w.batch, false)
	w.releaseFilesOf(w.batch)
	w.batch = w.batch[:0]
}

// releaseFilesOf releases the files of the pending releases whose NAT
// rules went, and says of those a CNI command of their container holds
// what was left and what went (their files stay for its DEL, or for the
// next sweep).
func (w *sweep) releaseFilesOf(ps []pendingRelease) {
	for _, p := range ps {
		switch {
		case !p.failed:
			w.releaseFiles(p)
		case p.busy != nil:
			w.keptBusyRelease(p)
		}
	}
}

// keptBusyRelease says what of p's release was left to a running CNI
// command of its container, and what went before it was found.
func (w *sweep) keptBusyRelease(p pendingRelease) {
	line := fmt.Sprintf("kept %s for now (%s): %v", p.a.Key, p.rel.Reason, p.busy)
	if gone := p.rel.What[len(p.a.Leases):]; len(gone) > 0 {
		line += "; removed " + strings.Join(gone, ", ")
	}
	w.keptBusy(line)
}

// keptBusy says what a release left to a running CNI command of its
// container: where a problem is said (gc's "skipped:"), and in the log.
// It is no problem of the data dir, and no error of the sweep.
func (w *sweep) keptBusy(line string) {
	if w.req.Problem != nil {
		w.req.Problem(errors.New(line))
	} else {
		w.report.Problems = append(w.report.Problems, errors.New(line))
	}
	w.logf("%s: %s", w.req.Dir.Network, line)
}

// releaseRulesOf releases, in each backend that is shared or not (as
// shared says), the rules of the pending releases' owners: once per owner
// (a shared one only if no attachment of it is alive), each in one go. What
// went is added to the first release of its owner; a release whose rules
// could not go is marked failed. A dry run releases nothing and adds what
// would go.
func (w *sweep) releaseRulesOf(ps []pendingRelease, shared bool) {
	for i, b := range w.backends {
		if b.Shared() != shared || w.rules[i] == nil {
			continue
		}
		first := map[string]int{}
		var owners []string
		for j := range ps {
			owner, ok := b.OwnerOf(w.req.Dir.Network, ps[j].a.Key.ContainerID, ps[j].a.Key.IfName)
			if !ok || len(w.rules[i].Owned(owner)) == 0 || (shared && w.owners[i].alive.has(owner)) {
				continue
			}
			if _, dup := first[owner]; !dup {
				first[owner] = j
				owners = append(owners, owner)
			}
		}
		if len(owners) == 0 {
			continue
		}
		if w.req.DryRun {
			for _, owner := range owners {
				p := &ps[first[owner]]
				p.rel.What = append(p.rel.What, w.rules[i].Owned(owner)...)
			}
			continue
		}
		removed, failed := w.rules[i].Release(owners)
		for _, owner := range owners {
			p := &ps[first[owner]]
			p.rel.What = append(p.rel.What, removed[owner]...)
		}
		for owner, err := range failed {
			var busy *netfilter.BusyError
			if !errors.As(err, &busy) {
				w.errs = append(w.errs, fmt.Errorf("release %s NAT rules of %s: %w", b.Name(), w.req.Dir.Network, err))
			}
			for j := range ps {
				if o, ok := b.OwnerOf(w.req.Dir.Network, ps[j].a.Key.ContainerID, ps[j].a.Key.IfName); ok && o == owner {
					ps[j].failed, ps[j].busy = true, busy
				}
			}
		}
	}
}

// releaseNAT ends the sweep: the stale attachments whose rules a shared
// owner holds (rules are per network and container ID, not per ifname),
// each owner's rules first, once no attachment of it is left that is not
// stale, then their own rules, then the files; then the orphans' rules.
func (w *sweep) releaseNAT() {
	if len(w.natWait) > 0 {
		w.listNAT()
	}
	if len(w.natWait) > 0 && !w.natUnknown {
		w.releaseRulesOf(w.natWait, true)
		w.releaseRulesOf(w.natWait, false)
		w.releaseFilesOf(w.natWait)
	}
	w.natWait = nil
	if !w.owned || w.natUnknown {
		return
	}
	for i := range w.backends {
		w.releaseOrphans(i)
	}
}

// releaseOrphans releases backend i's rules whose owner the network holds
// nothing of, in one go, and reports each owner as an orphan.
func (w *sweep) releaseOrphans(i int) {
	b, set := w.backends[i], &w.owners[i]
	if w.rules[i] == nil || !set.tracked {
		return
	}
	doomed := w.orphans(i)
	if len(doomed) == 0 {
		return
	}
	rules := w.rules[i]
	owners := make([]string, len(doomed))
	for j, o := range doomed {
		owners[j] = o.Owner
	}
	var removed map[string][]string
	var failed map[string]error
	if !w.req.DryRun {
		removed, failed = rules.Release(owners)
	}
	for _, o := range doomed {
		what := removed[o.Owner]
		if w.req.DryRun {
			what = rules.Owned(o.Owner)
		}
		var busy *netfilter.BusyError
		if err := failed[o.Owner]; errors.As(err, &busy) {
			// Its runtime's DEL runs: what is left is the DEL's. If the
			// DEL dies, a jump left names the rest to the next sweep; a
			// chain emptied before the DEL was found has none (that DEL
			// began within the sweep's release and died before portmap
			// deleted it) and stays, empty and unused.
			line := fmt.Sprintf("kept orphan NAT rules of %s for now: %v", o.ContainerID, busy)
			if len(what) > 0 {
				line += "; removed " + strings.Join(what, ", ")
			}
			w.keptBusy(line)
			continue
		} else if err != nil {
			w.errs = append(w.errs, fmt.Errorf("release orphan %s NAT rules of %s: %w", b.Name(), w.req.Dir.Network, err))
			if len(what) == 0 {
				continue
			}
		}
		id := o.ContainerID
		if o.Cut {
			id += "…"
		}
		w.report.OrphanRules = append(w.report.OrphanRules, id)
		w.causes[CauseOrphanRules]++
		w.released(Release{Key: records.Key{ContainerID: id, IfName: o.IfName}, Reason: OrphanReason, Orphan: true, What: what})
	}
}

// orphans are backend i's owners of rules the network holds nothing of.
func (w *sweep) orphans(i int) []netfilter.RuleOwner {
	set := &w.owners[i]
	var doomed []netfilter.RuleOwner
	for _, o := range w.rules[i].Owners() {
		if set.unsure || set.seen.has(o.Owner) || w.heldElsewhere(i, o.Owner) || w.recordedSince(i, o.Owner) {
			continue
		}
		doomed = append(doomed, o)
	}
	return doomed
}

// recordedSince reports whether owner has a record now, or may be getting
// one. The rules were listed before this is asked, and an ADD writes its
// record before its delegate makes any rule: an ADD that began after the
// sweep read the records is found here, and its rules are no orphans.
func (w *sweep) recordedSince(i int, owner string) bool {
	w.readRecordsAgain()
	return w.recordsUnsure || w.owners[i].unsure || w.owners[i].recorded.has(owner)
}

// readRecordsAgain reads the records' names once, for the orphans.
func (w *sweep) readRecordsAgain() {
	if w.recordsRead {
		return
	}
	w.recordsRead = true
	temps, err := w.records.EachName(func(k records.Key) {
		w.each(k, nil, func(i int, owner string) { w.owners[i].recorded.add(owner) })
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

// heldElsewhere reports whether owner holds something of the network
// outside the swept data dir (readElsewhere): a runtime that still adds it
// through bare bridge, or the plugin through another data dir, made its
// NAT rules. A directory that cannot be read proves nothing, so every
// owner then counts as holding one.
func (w *sweep) heldElsewhere(i int, owner string) bool {
	if w.req.LegacyDataDir == "" && len(w.req.OtherDataDirs) == 0 {
		return false
	}
	if !w.elsewhereRead {
		w.elsewhereRead = true
		w.readElsewhere()
	}
	return w.elsewhereUnreadable || w.owners[i].unsure || w.owners[i].elsewhere.has(owner)
}

// readElsewhere reads who holds something of the network outside the
// swept data dir: leases in the legacy directory, leases and records in
// the plugin's other data dirs.
func (w *sweep) readElsewhere() {
	hold := func(k records.Key) {
		w.each(k, nil, func(i int, owner string) { w.owners[i].elsewhere.add(owner) })
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
