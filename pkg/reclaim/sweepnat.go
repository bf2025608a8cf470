package reclaim

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/netfilter"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/records"
)

// startNAT finds the backends, and whether an owned network's rules are to
// be listed for orphans (listedForOrphans): always, but on a CHECK whose
// ruleset is the one in which a listing of this boot found none
// (noteNATChecked).
func (w *sweep) startNAT() {
	if w.Netfilter != nil {
		w.backends = w.Netfilter.Backends()
	}
	w.listedForOrphans = w.owned && w.Netfilter != nil
	if w.listedForOrphans && w.req.SkipUnchangedNAT {
		w.natState = w.Netfilter.State()
		if w.natState != (netfilter.RulesetState{}) {
			var checked natCheckedState
			readJSONMarker(w.req.Dir, ipamdir.NATCheckedMarker, &checked)
			w.listedForOrphans = checked != natCheckedState{Boot: w.judge.bootID, RulesetState: w.natState}
		}
	}
	w.owners = make([]ownerSets, len(w.backends))
}

// natCheckedState is NATCheckedMarker's content.
type natCheckedState struct {
	Boot string `json:"boot"`
	netfilter.RulesetState
}

// noteNATChecked notes, for a CHECK's next sweep, the ruleset state in
// which this CHECK's listing found no orphan rule and nothing was
// committed from the CHECK's start to its end (by the sweep or anyone), when
// nothing left the answer unsure. Only a CHECK's sweep reads the state
// (natState), so `gc` notes nothing: a gc that releases nothing changes
// nothing. A listing made means the marker did not hold natState then,
// and no other sweep writes it under host-local's lock.
func (w *sweep) noteNATChecked() {
	if !w.listedForOrphans || w.natState == (netfilter.RulesetState{}) || w.natUnknown || w.heldUnsure ||
		len(w.report.OrphanRules) > 0 || w.orphanKept || len(w.errs) > 0 ||
		slices.ContainsFunc(w.owners, func(set ownerSets) bool { return set.unsure }) || w.Netfilter.State() != w.natState {
		return
	}
	if err := writeJSONMarker(w.req.Dir, ipamdir.NATCheckedMarker, natCheckedState{Boot: w.judge.bootID, RulesetState: w.natState}); err != nil {
		w.Logf("%s: noting the NAT rules checked for orphans: %v", w.req.Dir.Network, err)
	}
}

// listedValid holds the attachments a GC lists as valid, wherever their
// lease and record are (another data dir, or the one the network's
// dataDir named before): the runtime says they live, so their rules are
// no orphans, and their container's (iptables) stay.
func (w *sweep) listedValid() {
	for _, a := range w.req.Valid {
		k := records.Key{ContainerID: a.ContainerID, IfName: a.IfName}
		w.saw(k, false)
		w.each(k, true, func(i int, owner string) { w.owners[i].alive.add(owner) })
	}
}

// listNAT lists the network's rules in every backend, unless they are
// listed (releaseStale lists them again). It is made when first needed,
// after the walk: overlapping it with the walk saved at most the walk's
// time (about 30 µs an attachment: BENCHMARKS.md, section 2) on a CHECK
// whose ruleset changed, which no bound measures (a restore's CHECKs find
// it unchanged).
func (w *sweep) listNAT() {
	if w.rules != nil {
		return
	}
	w.rules = make([]netfilter.Rules, len(w.backends))
	for i, b := range w.backends {
		rules, err := b.List(w.req.Dir.Network)
		if err != nil {
			w.errs = append(w.errs, fmt.Errorf("read %s NAT rules of %s: %w", b.Name(), w.req.Dir.Network, err))
			w.natUnknown = true
			continue
		}
		w.rules[i] = rules
	}
}

// each calls fn with the owner of k's rules in every tracked backend, or
// with sharedOnly in those whose owners attachments share (iptables); an
// owner that cannot be told makes that backend unsure. A backend whose
// owners are attachments (nftables: a hash each) is tracked (its seen
// kept) only by a sweep that looks for orphans (startNAT): only its
// orphans need them. An owner is asked for only where it is used.
func (w *sweep) each(k records.Key, sharedOnly bool, fn func(i int, owner string)) {
	for i, b := range w.backends {
		if !b.Shared() && (sharedOnly || !w.listedForOrphans) {
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

// saw remembers an attachment the network holds something of: its rules
// are no orphans. A backend whose owners are attachments learns those
// with a record from readHeld, which runs only when its rules are
// examined for orphans.
func (w *sweep) saw(k records.Key, recorded bool) {
	w.each(k, recorded, func(i int, owner string) { w.owners[i].seen.add(owner) })
}

// releaseStale releases the stale attachments judged since the rules were
// last listed, from a listing made after their verdicts: one made before
// a verdict proved that nothing of an ADD still runs may miss rules its
// last process made (a jump missed, the chain it still jumps to cannot
// go). Their own rules (nftables) go first, then their files; those whose
// container's rules are shared (iptables) wait for the end (natWait). If
// the rules cannot be listed, they are kept whole for the next sweep.
func (w *sweep) releaseStale() {
	if len(w.stale) == 0 {
		return
	}
	w.rules = nil
	if w.listNAT(); w.natUnknown {
		w.stale = w.stale[:0]
		return
	}
	var own []pendingRelease
	for _, p := range w.stale {
		shared := false
		w.each(p.a.Key, true, func(i int, owner string) { shared = shared || len(w.rules[i].Owned(owner)) > 0 })
		if shared {
			w.natWait = append(w.natWait, p)
		} else {
			own = append(own, p)
		}
	}
	w.stale = w.stale[:0]
	w.releaseRulesOf(own, false)
	w.rememberReleases(own)
	for _, p := range own {
		w.releaseFiles(p)
	}
}

// keptBusy says what a release left to a running CNI command of its
// container, and what went before it was found: where a problem is said
// (gc's "skipped:"), and in the log. It is no problem of the data dir,
// and no error of the sweep.
func (w *sweep) keptBusy(line string, gone []string) {
	if len(gone) > 0 {
		line += "; removed " + strings.Join(gone, ", ")
	}
	w.tell(errors.New(line))
	w.Logf("%s: %s", w.req.Dir.Network, line)
}

// releaseRulesOf releases, in each backend that is shared or not (as
// shared says), the rules of the pending releases' owners: once per owner
// (a shared one only if no attachment of it is alive), each in one go. What
// went is added to the first release of its owner; a release whose rules
// could not go is marked failed. A dry run releases nothing and adds what
// would go.
func (w *sweep) releaseRulesOf(ps []pendingRelease, shared bool) {
	for i, b := range w.backends {
		if b.Shared() != shared {
			continue
		}
		of := map[string][]int{} // the pending releases of each owner
		var owners []string
		for j := range ps {
			owner, ok := b.OwnerOf(w.req.Dir.Network, ps[j].a.Key.ContainerID, ps[j].a.Key.IfName)
			if !ok || len(w.rules[i].Owned(owner)) == 0 || (shared && w.owners[i].alive.has(owner)) {
				continue
			}
			if len(of[owner]) == 0 {
				owners = append(owners, owner)
			}
			of[owner] = append(of[owner], j)
		}
		if len(owners) == 0 {
			continue
		}
		removed, failed := w.releaseOwned(i, owners)
		for _, owner := range owners {
			p := &ps[of[owner][0]]
			p.rel.What = append(p.rel.What, removed[owner]...)
		}
		for owner, err := range failed {
			var busy *netfilter.BusyError
			if !errors.As(err, &busy) {
				w.errs = append(w.errs, fmt.Errorf("release %s NAT rules of %s: %w", b.Name(), w.req.Dir.Network, err))
			}
			for _, j := range of[owner] {
				ps[j].failed, ps[j].busy = true, busy
			}
		}
	}
}

// releaseOwned releases backend i's rules of owners, in one go; a dry run
// releases nothing and says what would go.
func (w *sweep) releaseOwned(i int, owners []string) (removed map[string][]string, failed map[string]error) {
	if !w.req.DryRun {
		return w.rules[i].Release(owners)
	}
	removed = map[string][]string{}
	for _, owner := range owners {
		removed[owner] = w.rules[i].Owned(owner)
	}
	return removed, nil
}

// releaseNAT ends the sweep: the stale attachments whose rules a shared
// owner holds (rules are per network and container ID, not per ifname),
// each owner's rules first, once no attachment of it is left that is not
// stale, then their own rules, then the files; then the orphans' rules.
func (w *sweep) releaseNAT() {
	if len(w.natWait) > 0 && !w.natUnknown {
		w.releaseRulesOf(w.natWait, true)
		w.releaseRulesOf(w.natWait, false)
		w.rememberReleases(w.natWait)
		for _, p := range w.natWait {
			w.releaseFiles(p)
		}
	}
	w.natWait = nil
	if !w.listedForOrphans {
		return
	}
	if w.listNAT(); w.natUnknown {
		return
	}
	for i := range w.backends {
		w.releaseOrphans(i)
	}
}

// releaseOrphans releases backend i's rules whose owner the network holds
// nothing of, in one go, and reports each owner as an orphan.
func (w *sweep) releaseOrphans(i int) {
	b := w.backends[i]
	doomed := w.orphans(i)
	if len(doomed) == 0 {
		return
	}
	owners := make([]string, len(doomed))
	for j, o := range doomed {
		owners[j] = o.Owner
	}
	removed, failed := w.releaseOwned(i, owners)
	for _, o := range doomed {
		what := removed[o.Owner]
		var busy *netfilter.BusyError
		if err := failed[o.Owner]; errors.As(err, &busy) {
			// Its runtime's DEL runs: what is left is the DEL's. If the
			// DEL dies, a jump left names the rest to the next sweep; a
			// chain emptied before the DEL was found has none (that DEL
			// began within the sweep's release and died before portmap
			// deleted it) and stays, empty and unused.
			w.keptBusy(fmt.Sprintf("kept orphan NAT rules of %s for now: %v", o.ContainerID, busy), what)
			w.orphanKept = true
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
		w.released(Release{Key: records.Key{ContainerID: id, IfName: o.IfName}, Reason: "NAT rules without a lease or record", Orphan: true, What: what})
	}
}

// orphans are backend i's owners of rules the network holds nothing of.
func (w *sweep) orphans(i int) []netfilter.RuleOwner {
	set := &w.owners[i]
	var doomed []netfilter.RuleOwner
	for _, o := range w.rules[i].Owners() {
		if set.unsure || set.seen.has(o.Owner) {
			continue
		}
		if !w.heldRead {
			w.heldRead = true
			w.readHeld()
		}
		// What could not be read proves nothing: every owner is held.
		if !w.heldUnsure && !set.unsure && !set.seen.has(o.Owner) {
			doomed = append(doomed, o)
		}
	}
	return doomed
}

// readHeld reads, once, who holds something of the network now: the
// records' names (the rules were listed before, and an ADD writes its
// record before its delegate makes any rule: an ADD that began after the
// walk is found here, and its rules are no orphans), leases in the legacy
// directory, and leases and records in the plugin's other data dirs (a
// runtime that still adds it through bare bridge, or the plugin through
// another data dir, made its NAT rules).
func (w *sweep) readHeld() {
	hold := func(k records.Key) { w.saw(k, false) }
	unreadable := func(err error) {
		w.problem(fmt.Errorf("orphan NAT rules kept: %w", err))
		w.heldUnsure = true
	}
	temps, err := w.records.EachName(hold)
	if err != nil {
		unreadable(err)
	} else {
		for _, pid := range temps {
			// A record being written may be an ADD's whose rules are
			// listed; the next sweep decides.
			w.heldUnsure = w.heldUnsure || w.running(pid)
		}
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
		leases, err := openLeaseDir(dir)
		if err == nil {
			err = leases.each(nil, func(l Lease) { hold(l.Key) }, func(error) {})
			leases.close()
		}
		if err != nil {
			unreadable(err)
		}
	}
}
