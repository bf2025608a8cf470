package reclaim

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/internal/statefile"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/records"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/sysinfo"
)

// Attacher keeps an attachment's record around the delegate's ADD and DEL:
// it releases an earlier, stale attachment of the same key before an ADD,
// refuses a live one, and makes sure a DEL leaves no NAT rule behind.
type Attacher struct {
	Env
	// AddBound is how long an ADD's processes may run (its delegate's
	// bound and its rollback's); past it, a sweep ends what still runs of
	// it, even once the plugin is gone. Zero records no deadline.
	AddBound time.Duration
	// LegacyDataDir is the entry's legacy lease directory: a released
	// attachment's firewall rules stay while a lease there holds its
	// address (leaseRoots).
	LegacyDataDir string
	// TornDown are the addresses the delegate's DEL found on the
	// attachment's interface before it succeeded: bridge then deleted
	// their iptables rules and the container's chains, so an EndDel whose
	// record names only these lists the iptables tables no more: two
	// execs, 5.7 ms on the bench VM, where the plugin's whole added cost
	// on a DEL was 3.9–5.3 ms against the floor plugin's 3.0–5.1 (bound:
	// twice the floor's). What else is left is an orphan the next sweep
	// releases.
	TornDown []net.IP
	// NoPrevResult: the DEL came without prevResult
	// (netconf.Config.LostPrevResult), so the firewall plugin before it in
	// the chain's DEL, which finds its per-address rules only through
	// prevResult, left them; EndDel releases them as a sweep's release
	// does.
	NoPrevResult bool
}

// PendingAdd is an ADD under way: where its record lives, what it says,
// and the lock that marks it running.
type PendingAdd struct {
	attacher *Attacher
	dir      ipamdir.Dir
	Record   *records.Record
	// LockFile is the open pending record, whose flock is held until
	// Complete or Abort: a sweep counts the ADD as running while any
	// process holds it, so the ADD's delegate must inherit it, and so
	// everything the delegate runs.
	LockFile *os.File
	// Previous are the addresses (CIDR) of the stale earlier attachment of
	// the same key, released by BeginAdd or a sweep: a restore in place
	// asks for them again.
	Previous []string
}

// BeginAdd prepares an ADD of key into the namespace at netnsPath. If the
// attachment already has a record, it is judged first: a stale one (earlier
// boot, namespace gone or replaced — Nomad re-creates the netns at the
// same path and ADDs again without a DEL) is released so the delegate can
// allocate again; a live one is a real duplicate and an error. Then the
// pending record is written, before anything is delegated, so a crash at
// any later point leaves a trace a sweep can follow.
func (s *Attacher) BeginAdd(d ipamdir.Dir, key records.Key, netnsPath string) (*PendingAdd, error) {
	recStore := records.NewStore(d)
	nsID, err := s.Host.Netns(netnsPath)
	if err != nil {
		return nil, &AddError{Kind: ErrNoNamespace, Msg: fmt.Sprintf("cannot identify network namespace %q", netnsPath), Detail: err.Error()}
	}
	// Zero when the kernel cannot say (before 5.14): then inodes decide.
	cookie, _ := s.Host.NetnsCookie(netnsPath)
	old, err := recStore.Read(key)
	if err != nil {
		// A damaged record (read as none) proves nothing; it is replaced below.
		s.Logf("%s: %s: ignoring unreadable record: %v", d.Network, key, err)
	}
	var previous []string
	if old != nil {
		if err := s.replaceEarlier(d, old, netnsPath, nsID, cookie); err != nil {
			return nil, err
		}
		// Not an error: the earlier attachment was stale and is released.
		previous = old.IPs
	} else {
		// A sweep may have released it first (see remember.go).
		previous = Remembered(d, key)
	}

	bootID, err := s.Host.BootID()
	if err != nil {
		return nil, fmt.Errorf("read boot id: %w", err)
	}
	// Before anything of the ADD exists: the network's NAT rules are the
	// plugin's to release (orphans) only once this marker is there.
	if !Owns(d) {
		if err := writeMarker(d, ipamdir.OwnedMarker, []byte(d.Network+"\n")); err != nil {
			return nil, &AddError{Kind: ErrRecordWrite, Msg: "failed to mark the network as the plugin's", Detail: err.Error()}
		}
	}
	// This process: by it a sweep tells an ADD in flight from a dead one.
	pid := os.Getpid()
	start, _ := s.Host.ProcessStart(pid)
	rec := &records.Record{
		Version: records.FormatVersion, Network: d.Network, ContainerID: key.ContainerID, IfName: key.IfName,
		Netns: netnsPath, NetnsID: nsID, NetnsCookie: cookie, BootID: bootID, Created: s.Host.Now().UTC(),
		State: records.Started, PID: pid, PIDStart: start,
	}
	if s.AddBound > 0 {
		rec.Deadline = uint64(s.Host.Now().Add(s.AddBound).Unix()) + 1
	}
	lock, err := recStore.WriteLocked(rec)
	if err != nil {
		return nil, &AddError{Kind: ErrRecordWrite, Msg: "failed to write the attachment record", Detail: err.Error()}
	}
	return &PendingAdd{attacher: s, dir: d, Record: rec, LockFile: lock, Previous: previous}, nil
}

// replaceEarlier decides what an existing record for the same attachment
// means for a new ADD.
func (s *Attacher) replaceEarlier(d ipamdir.Dir, old *records.Record, netnsPath string, nsID sysinfo.NetnsID, cookie uint64) error {
	j, err := newJudge(&s.Env, d, s.LegacyDataDir)
	if err != nil {
		return err
	}
	// Judged with what host-local holds for it, as a sweep judges it:
	// a pending record is not the whole story (deadADDInLiveNamespace).
	leases, err := leasesOf(d, old.Key())
	if err != nil {
		return &AddError{Kind: ErrStillAttached, Msg: fmt.Sprintf("%s may still be attached to %s, and the plugin cannot read its leases: refused so that its address is not handed out twice", old.Key(), d.Network), Detail: err.Error()}
	}
	v := j.verdict(&Attachment{Key: old.Key(), Record: old, Leases: leases})
	switch v.State {
	case Pending:
		return &AddError{Kind: ErrAddInProgress, Msg: fmt.Sprintf("another ADD of %s on %s is still running (%s)", old.Key(), d.Network, v.Reason)}
	case Stale:
		return s.releaseOne(d, old, v)
	case Detached:
		// Nomad's re-ADD after a failed CHECK, with its tasks still
		// running in the old namespace: they answer on the old address,
		// so it must not be handed out again, and a new address in the
		// new namespace would reach nobody. Refused, Nomad stops the
		// tasks, DELs and reschedules; nothing is changed here.
		s.countLocked(d, map[string]int{RefusedLiveCount: 1})
		return &AddError{Kind: ErrStillAttached, Msg: fmt.Sprintf("%s is still attached to %s in namespace net:[%d], held by %s, although %s names another namespace now; refused while that container runs there, so that its address is not handed out twice. Nothing to do by hand: the runtime stops the container and sends DEL (Nomad kills the allocation's tasks and reschedules it as the job's reschedule policy says); to free it now, stop the container or allocation (nomad alloc stop, podman stop)", old.Key(), d.Network, old.NetnsID.Ino, v.Holder, netnsPath), Detail: v.Reason}
	}
	if old.State == records.Migrated {
		return &AddError{Kind: ErrStillAttached, Msg: fmt.Sprintf("%s is still attached to %s through the configuration it was added with (its lease %s was migrated and is still held there): DEL it with that configuration, or stop its container, before adding it again", old.Key(), d.Network, strings.Join(old.LegacyLeases, ", ")), Detail: v.Reason}
	}
	// The kernel reuses a dead namespace's inode number, so a namespace
	// re-created at the same path (Nomad's restore) can look identical
	// by inode; its cookie cannot.
	if old.Netns == netnsPath && old.NetnsID == nsID && old.NetnsCookie != 0 && cookie != 0 && old.NetnsCookie != cookie {
		return s.releaseOne(d, old, Verdict{State: Stale, Reason: fmt.Sprintf("namespace %s was re-created (same inode %d, new namespace cookie)", netnsPath, nsID.Ino), Cause: CauseNamespaceGone})
	}
	if v.State == Unknown {
		// Better refused than its address handed out twice; the runtime's
		// retry, or its DEL, comes to a verdict.
		return &AddError{Kind: ErrStillAttached, Msg: fmt.Sprintf("%s may still be attached to %s, and the plugin cannot tell (%s): refused so that its address is not handed out twice; retry, or DEL it before adding it again", old.Key(), d.Network, v.Reason), Detail: v.Reason}
	}
	s.countLocked(d, map[string]int{RefusedLiveCount: 1})
	if old.NetnsID == nsID {
		return &AddError{Kind: ErrStillAttached, Msg: fmt.Sprintf("%s is already attached to %s in namespace %s: DEL it before adding it again", old.Key(), d.Network, netnsPath)}
	}
	return &AddError{Kind: ErrStillAttached, Msg: fmt.Sprintf("%s is still attached to %s in the live namespace %s: DEL it before adding it to %s", old.Key(), d.Network, old.Netns, netnsPath)}
}

// countLocked is countReleases for a verb that does not hold host-local's
// lock, under which every count is written: it takes it. Failing to is
// logged by countReleases, or here: only the metric is off.
func (s *Attacher) countLocked(d ipamdir.Dir, add map[string]int) {
	unlock, err := d.Lock()
	if err != nil {
		s.Logf("%s: count %v: %v", d.Network, add, err)
		return
	}
	defer unlock()
	s.countReleases(d, add)
}

// leasesOf are the leases in d that name key (Lease.names), read without
// host-local's lock: what a judge needs to know whether an ADD got an
// address.
func leasesOf(d ipamdir.Dir, key records.Key) ([]Lease, error) {
	leases, err := openLeaseDir(d.Leases())
	if err != nil {
		return nil, err
	}
	defer leases.close()
	return leases.naming(key)
}

// withLeases runs fn on d's lease directory, opened under host-local's
// lock, which it holds until fn returns.
func withLeases(d ipamdir.Dir, fn func(*leaseDir) error) error {
	unlock, err := d.Lock()
	if err != nil {
		return err
	}
	defer unlock()
	leases, err := openLeaseDir(d.Leases())
	if err != nil {
		return err
	}
	defer leases.close()
	return fn(leases)
}

// releaseOne releases a single stale attachment the way a sweep releases
// one, under host-local's lock: its NAT rules, then the rest
// (finishRelease). Rules that could not go keep the files.
func (s *Attacher) releaseOne(d ipamdir.Dir, old *records.Record, v Verdict) error {
	return withLeases(d, func(leases *leaseDir) error {
		a := &Attachment{Key: old.Key(), Record: old, Verdict: v}
		// One read of the directory, as a sweep does (disk.Store.ReleaseByID
		// would walk into planted subdirectories and follow symlinks). A
		// listing cut short may have missed some: nothing goes, and the
		// record stays to name them.
		var err error
		if a.Leases, err = leases.naming(a.Key); err != nil {
			return err
		}
		sortLeases(a.Leases)
		// Remembered before anything goes, for the runtime's next try if
		// this ADD fails: Nomad tries three times, with no DEL between.
		// Complete forgets it.
		ips := addressesOf(a)
		if len(ips) > 0 && remembersCause(v.Cause) {
			if rerr := s.remember(d, rememberIn(nil, a.Key, ips, s.Host.Now())); rerr != nil {
				s.Logf("%s: remembering %s's addresses for its restore: %v", d.Network, a.Key, rerr)
			}
		}
		p := pendingRelease{a: a, rel: releaseOf(a)}
		removed, err := s.ReleaseNAT(d, old.Key())
		p.rel.What = append(p.rel.What, removed...)
		if err != nil {
			return err
		}
		addr := addrRules{nf: s.Netfilter, own: d, roots: leaseRoots(d, s.LegacyDataDir, nil)}
		released, err := finishRelease(&addr, leases, records.NewStore(d), &p)
		if !released {
			return err
		}
		s.countReleases(d, map[string]int{v.Cause: 1, ForwardKeptCount: len(p.rel.Kept)})
		s.Logf("%s: released %s", d.Network, p.rel)
		old.IPs = ips // what the ADD asks for again (BeginAdd)
		return err
	})
}

// ReleaseNAT releases the NAT rules of key's container on the network
// (iptables, and nftables of key), unless another attachment of the same
// container ID has a record there: bridge and portmap name their iptables
// rules by network and container ID alone, so they are that one's too.
// bridge's nftables rules are key's own (a hash of ifname and container
// ID), but they stay then as well: once key's record and leases are gone,
// a later sweep releases them as orphans.
func (s *Attacher) ReleaseNAT(d ipamdir.Dir, key records.Key) ([]string, error) {
	others, _, err := records.NewStore(d).Names(key)
	if err != nil || s.Netfilter == nil || len(others) > 0 {
		return nil, err
	}
	return s.Netfilter.ReleaseAttachment(d.Network, key.IfName, key.ContainerID, true)
}

// tornDown reports whether rec names addresses and the delegate tore down
// the rules of each (Attacher.TornDown).
func tornDown(rec *records.Record, ips []net.IP) bool {
	if rec == nil || len(rec.IPs) == 0 {
		return false
	}
	for _, cidr := range rec.IPs {
		ip, _, err := net.ParseCIDR(cidr)
		if err != nil || !slices.ContainsFunc(ips, ip.Equal) {
			return false
		}
	}
	return true
}

// Complete records the delegate's IPs: the ADD is done.
func (a *PendingAdd) Complete(ips []string) error {
	a.Record.State = records.Complete
	a.Record.PID, a.Record.PIDStart = 0, 0
	a.Record.IPs = ips
	defer a.Close()
	if err := records.NewStore(a.dir).Write(a.Record); err != nil {
		return err
	}
	if len(a.Previous) > 0 {
		a.attacher.forget(a.dir, a.Record.Key()) // its record names them now
	}
	return nil
}

// Abort undoes an ADD that failed, in a sweep's order: the NAT rules and
// the leases of the attachment, then its pending record (bridge's own
// rollback leaves a reservation host-local could not finish on a full
// tmpfs). If something cannot go, the pending record stays, and a sweep
// finishes once the ADD's processes are gone. Of an ADD that ran into an
// earlier attachment's leases (ranIntoEarlier), only the record goes.
func (a *PendingAdd) Abort() error {
	defer a.Close()
	if a.ranIntoEarlier() {
		return records.NewStore(a.dir).Remove(a.Record.Key())
	}
	if _, err := a.attacher.ReleaseNAT(a.dir, a.Record.Key()); err != nil {
		return fmt.Errorf("release the NAT rules of the failed ADD of %s: %w", a.Record.Key(), err)
	}
	if err := a.attacher.ReleaseLeasesOf(a.dir, a.Record.Key()); err != nil {
		return fmt.Errorf("release the leases of the failed ADD of %s: %w", a.Record.Key(), err)
	}
	return records.NewStore(a.dir).Remove(a.Record.Key())
}

// ranIntoEarlier reports whether a lease of this boot named the attachment
// before its pending record was written: an earlier attachment's with no
// record (written by something else, or copied by the migration this ADD
// ran), which a sweep never releases and which host-local refused the ADD
// for ("duplicate allocation is not allowed"), having made nothing. The
// record's mtime and a lease's come from the same kernel clock; asked only
// of a failed ADD, so an ADD that succeeds reads no lease for it. What
// cannot be told is the ADD's to undo, as ever.
func (a *PendingAdd) ranIntoEarlier() bool {
	if a.LockFile == nil {
		return false
	}
	written, err := a.LockFile.Stat()
	boot, berr := a.attacher.Host.BootTime()
	leases, lerr := leasesOf(a.dir, a.Record.Key())
	return err == nil && berr == nil && lerr == nil && slices.ContainsFunc(leases, func(l Lease) bool {
		return !l.ModTime.Before(boot) && l.ModTime.Before(written.ModTime())
	})
}

// ReleaseLeasesOf removes, under host-local's lock, the leases that
// host-local's DEL would (disk.Store.ReleaseByID), without host-local
// (which reads every file in the directory, blocking): those that name
// key or, only if none does, its container alone (Lease.names).
func (s *Attacher) ReleaseLeasesOf(d ipamdir.Dir, key records.Key) error {
	if !statefile.Exists(d.Leases()) {
		return nil
	}
	return withLeases(d, func(leases *leaseDir) error {
		mine, err := leases.naming(key)
		if slices.ContainsFunc(mine, func(l Lease) bool { return l.Key == key }) {
			mine = slices.DeleteFunc(mine, func(l Lease) bool { return l.Key != key })
		}
		return errors.Join(err, leases.remove(mine))
	})
}

// Close drops the plugin's hold on the pending record's lock; it may be
// called more than once. An ADD that leaves its record pending is judged
// by its processes' lock until they have all exited, then by its namespace.
func (a *PendingAdd) Close() {
	if a.LockFile != nil {
		a.LockFile.Close() // read-only: nothing to lose
		a.LockFile = nil
	}
}

// WaitForAdd returns once no process of an ADD of key runs any more: the
// plugin that wrote its pending record, or a process holding that record's
// lock (its delegate, host-local, iptables), ending an overdue one as a
// sweep does (judge.addRunning). A runtime that gives up on an ADD kills
// the plugin and DELs at once (containerd's RunPodSandbox tears down in a
// deferred call), while bridge runs on: a DEL before bridge allocated would
// find nothing, remove the record, and leave what bridge then made with
// nothing to find it by. Still running after bound, the DEL is refused
// (ErrAddInProgress): nothing was changed, and the runtime DELs again.
// bound is the ADD's own (AddBound), but its record's deadline is written
// rounded up to the second plus one and is past only a second later: so
// the DEL waits on while that deadline is still to come, at most
// deadlineRounding more, lest one that came as the ADD began give up just
// before it could end the overdue delegate.
func (s *Attacher) WaitForAdd(d ipamdir.Dir, key records.Key, bound time.Duration) error {
	store := records.NewStore(d)
	var j *judge
	for start := time.Now(); ; time.Sleep(addWaitPoll) {
		rec, err := store.Read(key)
		if err != nil || rec == nil || rec.State != records.Started {
			return nil // the DEL judges an unreadable record as it did
		}
		if j == nil {
			if j, err = newJudge(&s.Env, d, s.LegacyDataDir); err != nil {
				return err
			}
		}
		if rec.BootID != j.bootID {
			return nil
		}
		// Read before addRunning, so that it has tried the kill when not.
		overdueSoon := rec.Deadline != 0 && uint64(j.Host.Now().Unix()) <= rec.Deadline
		v, _ := j.addRunning(rec)
		if v.State != Pending {
			return nil
		}
		if waited := time.Since(start); waited >= bound && (!overdueSoon || waited >= bound+deadlineRounding) {
			return &AddError{Kind: ErrAddInProgress, Msg: fmt.Sprintf("an ADD of %s on %s is still running (%s): DEL it again once that ADD has ended", key, d.Network, v.Reason)}
		}
	}
}

// addWaitPoll is how often WaitForAdd looks at the ADD's lock again.
const addWaitPoll = 20 * time.Millisecond

// deadlineRounding is how much later than its bound from BeginAdd a
// pending record is overdue (judge.addRunning), at most, for its deadline
// is rounded up to the second plus one, and past only a second after it.
const deadlineRounding = 2 * time.Second

// EndDel finishes a DEL the delegate accepted. bridge skips its ipMasq
// teardown when CNI_NETNS is empty or gone, and its iptables teardown when
// the container's interface is not there (docs/reclaim.md, "DEL"); it never
// removes a jump an earlier attachment of the same ID left. So whatever NAT
// state of the container is left is released here (unless another
// attachment of the same ID has a record: see ReleaseNAT), with the temp
// files of record writers that died; then the legacy leases of a migrated
// attachment; then the record, last, so that a DEL killed or failing
// part-way is finished by the next DEL or sweep.
func (s *Attacher) EndDel(d ipamdir.Dir, key records.Key) error {
	store := records.NewStore(d)
	rec, err := store.Read(key)
	if err != nil {
		s.Logf("%s: %s: ignoring unreadable record: %v", d.Network, key, err)
	}
	others, temps, err := store.Names(key)
	if err != nil {
		return err
	}
	var removed []string
	// Another attachment of the container ID keeps them all, key's
	// nftables rules too (see ReleaseNAT).
	if s.Netfilter != nil && len(others) == 0 {
		removed, err = s.Netfilter.ReleaseAttachment(d.Network, key.IfName, key.ContainerID, !tornDown(rec, s.TornDown))
	}
	if len(removed) > 0 {
		s.Logf("%s: DEL %s: removed what bridge left: %s", d.Network, key, strings.Join(removed, ", "))
	}
	if err != nil {
		return err
	}
	if s.NoPrevResult && rec != nil {
		if err := s.releaseAddrRules(d, rec); err != nil {
			return err
		}
	}
	// A record write killed before its rename (an ADD of this attachment
	// killed mid-write, say) left its temp file.
	if _, err := store.RemoveAbandonedTemps(temps, s.running); err != nil {
		s.Logf("%s: %v", d.Network, err)
	}
	if rec != nil && rec.State == records.Migrated {
		s.releaseLegacy(d, rec)
	}
	s.forget(d, key)
	return store.Remove(key)
}

// releaseAddrRules releases the rules that name rec's attachment only by
// its addresses (the firewall plugin's, portmap's nftables ones), as a
// sweep's release does: those of an address another network leases stay.
func (s *Attacher) releaseAddrRules(d ipamdir.Dir, rec *records.Record) error {
	if s.Netfilter == nil || len(rec.IPs) == 0 {
		return nil
	}
	p := pendingRelease{a: &Attachment{Key: rec.Key(), Record: rec}}
	addr := addrRules{nf: s.Netfilter, own: d, roots: leaseRoots(d, s.LegacyDataDir, nil)}
	_, err := addr.release(&p)
	if what := slices.Concat(p.rel.What, p.rel.Kept); len(what) > 0 {
		s.Logf("%s: DEL %s without prevResult: %s", d.Network, rec.Key(), strings.Join(what, "; "))
	}
	if len(p.rel.Kept) > 0 {
		s.countLocked(d, map[string]int{ForwardKeptCount: len(p.rel.Kept)})
	}
	return err
}

// AttachedThere is the record of another attachment in the namespace at
// netnsPath under key's ifname, when key itself has none: a DEL of key
// handed to bridge would delete that attachment's interface (bridge
// deletes CNI_IFNAME in CNI_NETNS, whoever it belongs to). The other
// record counts only while its own path still names that namespace (the
// kernel reuses inode numbers; the cookie, where known, tells them apart).
func (s *Attacher) AttachedThere(d ipamdir.Dir, key records.Key, netnsPath string) (*records.Record, error) {
	store := records.NewStore(d)
	if rec, err := store.Read(key); rec != nil || err != nil || netnsPath == "" {
		return nil, err
	}
	nsID, err := s.Host.Netns(netnsPath)
	if err != nil {
		return nil, nil
	}
	bootID, err := s.Host.BootID()
	if err != nil {
		return nil, nil
	}
	var there *records.Record
	_, err = store.Walk(func(r *records.Record) {
		if there != nil || r.IfName != key.IfName || r.ContainerID == key.ContainerID || r.NetnsID != nsID || r.Netns == "" || r.BootID != bootID {
			return
		}
		if id, err := s.Host.Netns(r.Netns); err != nil || id != nsID {
			return
		}
		if cookie, _ := s.Host.NetnsCookie(netnsPath); cookie != 0 && r.NetnsCookie != 0 && cookie != r.NetnsCookie {
			return
		}
		there = r
	}, func(error, records.Key, bool) {}) // a damaged record is the sweep's to report
	return there, err
}

// HoldsNothing reports whether the network holds nothing of key: no record
// (readable or not) and no lease naming it. A DEL then has nothing left to
// release here, whatever its delegate could not do (host-local's DEL
// creates its directory first, which a read-only data dir refuses).
func (s *Attacher) HoldsNothing(d ipamdir.Dir, key records.Key) bool {
	if rec, err := records.NewStore(d).Read(key); rec != nil || err != nil {
		return false
	}
	leases, err := leasesOf(d, key)
	return err == nil && len(leases) == 0
}

// releaseLegacy removes the legacy leases of a migrated attachment that is
// DELeted through the plugin: they were kept only as the sign that it was
// alive (recordMigrated). Each is removed under the legacy
// directory's host-local lock, and only while it still names the
// attachment; a path the record names outside the entry's legacy
// directory is left alone (legacyLeasePaths). What cannot go (its lock
// planted or held past LockTimeout, say) is logged and left: no DEL fails
// on it, and the next boot's migration drops it.
func (s *Attacher) releaseLegacy(d ipamdir.Dir, rec *records.Record) {
	legacy := ipamdir.New(s.LegacyDataDir, d.Network)
	paths := legacyLeasePaths(rec, s.LegacyDataDir)
	if len(paths) < len(rec.LegacyLeases) {
		s.Logf("%s: %s: its record names legacy leases outside %s, left alone: %s", d.Network, rec.Key(), legacy.Leases(), strings.Join(rec.LegacyLeases, ", "))
	}
	var leases []Lease
	for _, path := range paths {
		if statefile.Exists(path) { // else its runtime released it already
			leases = append(leases, Lease{Path: path, content: ipamdir.LeaseContent(rec.ContainerID, rec.IfName)})
		}
	}
	if len(leases) == 0 {
		return
	}
	if err := withLeases(legacy, func(dir *leaseDir) error { return dir.remove(leases) }); err != nil {
		s.Logf("%s: %s: legacy lease left in place: %v", d.Network, rec.Key(), err)
	}
}

// IsOwnNamespace reports whether netnsPath names the plugin's own network
// namespace, the host's for a runtime. It only stats the path: opening it,
// as ns.CheckNetNS does, blocks for ever on a FIFO planted there. A path
// that is no namespace is not the plugin's.
func (s *Attacher) IsOwnNamespace(netnsPath string) (bool, error) {
	if netnsPath == "" {
		return false, nil
	}
	id, err := s.Host.Netns(netnsPath)
	if err != nil {
		return false, nil
	}
	own, err := s.Host.Netns("/proc/self/ns/net")
	if err != nil {
		return false, fmt.Errorf("identify the plugin's own network namespace: %w", err)
	}
	return id == own, nil
}

// NamespaceUsable reports whether bridge could enter the namespace ("" is
// none: no such file).
func (s *Attacher) NamespaceUsable(netnsPath string) bool {
	_, err := s.Host.Netns(netnsPath)
	return err == nil || !(errors.Is(err, fs.ErrNotExist) || errors.Is(err, sysinfo.ErrNotNetns))
}
