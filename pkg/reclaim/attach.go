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
	// their iptables rules and the container's chains (it fails while a
	// rule an earlier attachment left still jumps to them). An EndDel
	// whose record names only these lists the iptables tables no more (an
	// iptables and an ip6tables exec): what else is left of the container
	// (a family it has no address in now, portmap's chain if the runtime
	// skipped portmap's DEL) is an orphan the next sweep releases.
	TornDown []net.IP
}

// PendingAdd is an ADD under way: where its record lives, what it says,
// and the lock that marks it running.
type PendingAdd struct {
	attacher *Attacher
	dir      ipamdir.Dir
	store    *records.Store
	Record   *records.Record
	// lock holds the pending record's flock (records.Store.WriteLocked)
	// until Complete or Abort: a sweep counts the ADD as running while
	// any process holds it.
	lock *os.File
	// Previous are the addresses (CIDR, as recorded) of the stale earlier
	// attachment of the same key that BeginAdd released: a restore in
	// place, whose address the ADD may ask for again.
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
		// A damaged record proves nothing; it is replaced below.
		s.logf("%s: %s: ignoring unreadable record: %v", d.Network, key, err)
		old = nil
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
	if err := markOwned(d); err != nil {
		return nil, &AddError{Kind: ErrRecordWrite, Msg: "failed to mark the network as the plugin's", Detail: err.Error()}
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
	return &PendingAdd{attacher: s, dir: d, store: recStore, Record: rec, lock: lock, Previous: previous}, nil
}

// replaceEarlier decides what an existing record for the same attachment
// means for a new ADD.
func (s *Attacher) replaceEarlier(d ipamdir.Dir, old *records.Record, netnsPath string, nsID sysinfo.NetnsID, cookie uint64) error {
	j, err := newJudge(s.Host, records.NewStore(d), nil, false)
	if err != nil {
		return err
	}
	j.endOverdue, j.logf, j.legacyDataDir = true, s.logf, s.LegacyDataDir
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
		held := "another process"
		if v.Holder != nil {
			held = v.Holder.String()
		}
		s.countRefusal(d)
		return &AddError{Kind: ErrStillAttached, Msg: fmt.Sprintf("%s is still attached to %s in namespace net:[%d], held by %s, although %s names another namespace now; refused while that container runs there, so that its address is not handed out twice. Nothing to do by hand: the runtime stops the container and sends DEL (Nomad kills the allocation's tasks and reschedules it as the job's reschedule policy says); to free it now, stop the container or allocation (nomad alloc stop, podman stop)", old.Key(), d.Network, old.NetnsID.Ino, held, netnsPath), Detail: v.Reason}
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
	s.countRefusal(d)
	if old.NetnsID == nsID {
		return &AddError{Kind: ErrStillAttached, Msg: fmt.Sprintf("%s is already attached to %s in namespace %s: DEL it before adding it again", old.Key(), d.Network, netnsPath)}
	}
	return &AddError{Kind: ErrStillAttached, Msg: fmt.Sprintf("%s is still attached to %s in the live namespace %s: DEL it before adding it to %s", old.Key(), d.Network, old.Netns, netnsPath)}
}

// countRefusal counts an ADD refused for a live earlier attachment, under
// host-local's lock as every count is written. Failing to is logged by
// countReleases, or here: only the metric is off, the refusal stands.
func (s *Attacher) countRefusal(d ipamdir.Dir) {
	unlock, err := d.Lock()
	if err != nil {
		s.logf("%s: count refusal: %v", d.Network, err)
		return
	}
	defer unlock()
	s.countReleases(d, map[string]int{RefusedLiveCount: 1})
}

// leasesOf are the leases in d that name key, or its container alone (a
// lease written before host-local recorded ifnames), read without
// host-local's lock: what a judge needs to know whether an ADD got an
// address.
func leasesOf(d ipamdir.Dir, key records.Key) ([]Lease, error) {
	if !exists(d.Leases()) {
		return nil, nil
	}
	leases, err := openLeaseDir(d.Leases())
	if err != nil {
		return nil, err
	}
	defer leases.close()
	legacy := records.Key{ContainerID: key.ContainerID}
	var mine []Lease
	err = leases.each(nil, func(l Lease) {
		if l.Key == key || l.Key == legacy {
			mine = append(mine, l)
		}
	}, func(error) {})
	return mine, err
}

// releaseOne releases a single stale attachment the way a sweep releases
// one, under host-local's lock and in the same order: its NAT rules, then
// its leases, then its record, which lets a later run find the rest if
// this one is killed part-way. Rules that could not go keep the files.
func (s *Attacher) releaseOne(d ipamdir.Dir, old *records.Record, v Verdict) error {
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
	a := &Attachment{Key: old.Key(), Record: old, Verdict: v}
	// One read of the directory, as a sweep does (disk.Store.ReleaseByID
	// would walk into planted subdirectories and follow symlinks). A lease
	// written before host-local recorded ifnames names the container
	// alone, as host-local's own ReleaseByID matches it.
	legacy := records.Key{ContainerID: old.ContainerID}
	var errs []error
	errs = append(errs, leases.each(nil, func(l Lease) {
		if l.Key == a.Key || l.Key == legacy {
			a.Leases = append(a.Leases, l)
		}
	}, func(error) {}))
	sortLeases(a.Leases)
	rel := releaseOf(a)
	removed, err := s.ReleaseNAT(d, old.Key())
	rel.What = append(rel.What, removed...)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	kept := 0
	if s.Netfilter != nil {
		rules, err := s.Netfilter.ListForward()
		if err != nil {
			return errors.Join(append(errs, fmt.Errorf("read firewall rules: %w", err))...)
		}
		fr := releaseForwardOf(rules, leaseRoots(d, s.LegacyDataDir, nil), d, a, false)
		rel.What, rel.Kept, kept = append(rel.What, fr.what...), fr.kept, len(fr.kept)
		if fr.err != nil {
			return errors.Join(append(errs, fr.err)...)
		}
		pm, err := s.Netfilter.ListPortmapNFT()
		if err == nil {
			var what []string
			what, err = pm.Release(old.ContainerID, attachmentAddrs(a), false)
			rel.What = append(rel.What, what...)
		}
		if err != nil {
			return errors.Join(append(errs, fmt.Errorf("portmap's nftables rules: %w", err))...)
		}
	}
	recordGone, err := releaseFiles(leases, records.NewStore(d), a, false)
	errs = append(errs, err)
	if recordGone {
		rel.What = append(rel.What, "record")
	}
	s.countReleases(d, map[string]int{v.Cause: 1, ForwardKeptCount: kept})
	s.logf("%s: released %s", d.Network, rel)
	return errors.Join(errs...)
}

// ReleaseNAT releases the NAT rules of key's container on the network
// (iptables, and nftables of key), unless another attachment of the same
// container ID has a record there: bridge and portmap name their rules by
// network and container ID alone, so they are that one's too.
func (s *Attacher) ReleaseNAT(d ipamdir.Dir, key records.Key) ([]string, error) {
	others, _, err := records.NewStore(d).Names(key)
	if err != nil {
		return nil, err
	}
	return s.releaseNATUnlessShared(d, key, others)
}

func (s *Attacher) releaseNATUnlessShared(d ipamdir.Dir, key records.Key, others []records.Key) ([]string, error) {
	if s.Netfilter == nil || len(others) > 0 {
		return nil, nil
	}
	return s.Netfilter.ReleaseContainer(d.Network, key.IfName, key.ContainerID)
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

// LockFile is the open pending record whose flock marks the ADD as
// running: the ADD's delegate must inherit it, and so everything the
// delegate runs.
func (a *PendingAdd) LockFile() *os.File { return a.lock }

// Complete records the delegate's IPs: the ADD is done.
func (a *PendingAdd) Complete(ips []string) error {
	a.Record.State = records.Complete
	a.Record.PID, a.Record.PIDStart = 0, 0
	a.Record.IPs = ips
	defer a.Close()
	if err := a.store.Write(a.Record); err != nil {
		return err
	}
	if len(a.Previous) > 0 {
		a.attacher.forget(a.dir, a.Record.Key()) // its record names them now
	}
	return nil
}

// Abort undoes an ADD that failed, in a sweep's order: the NAT rules and
// the leases of the attachment, then its pending record. bridge rolls back
// its own allocation when it fails cleanly, but not always all of it:
// host-local keeps a reservation it could not finish (a full tmpfs fails
// the write of last_reserved_ip after the lease). If something cannot go,
// the pending record stays, and a sweep finishes once the ADD's processes
// are gone.
func (a *PendingAdd) Abort() error {
	defer a.Close()
	if _, err := a.attacher.ReleaseNAT(a.dir, a.Record.Key()); err != nil {
		return fmt.Errorf("release the NAT rules of the failed ADD of %s: %w", a.Record.Key(), err)
	}
	if err := a.attacher.ReleaseLeasesOf(a.dir, a.Record.Key()); err != nil {
		return fmt.Errorf("release the leases of the failed ADD of %s: %w", a.Record.Key(), err)
	}
	return a.store.Remove(a.Record.Key())
}

// ReleaseLeasesOf removes, under host-local's lock, every lease that names
// key: what host-local's DEL does, without host-local (which reads every
// file in the directory, blocking).
func (s *Attacher) ReleaseLeasesOf(d ipamdir.Dir, key records.Key) error {
	if !exists(d.Leases()) {
		return nil
	}
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
	var mine []Lease
	err = leases.each(nil, func(l Lease) {
		if l.Key == key {
			mine = append(mine, l)
		}
	}, func(error) {})
	return errors.Join(err, leases.remove(mine))
}

// Close drops the plugin's hold on the pending record's lock; it may be
// called more than once. After Complete or Abort the lock marks nothing
// (the record was replaced by another file, or removed); an ADD that
// leaves its record pending is judged by its processes' lock until they
// have all exited, then by its namespace.
func (a *PendingAdd) Close() {
	if a.lock != nil {
		a.lock.Close() // read-only: nothing to lose
		a.lock = nil
	}
}

// EndDel finishes a DEL the delegate accepted. bridge tears its ipMasq
// rules down only when it finds the container's interface in CNI_NETNS;
// with an empty CNI_NETNS (nerdctl's DEL before re-adding), a namespace
// that is already gone (CRI-O replaying cached DELs at start-up), one
// re-created at the same path, or an interface deleted from inside the
// namespace, it skips them, and it never removes a jump an earlier
// attachment of the same ID left with another address. So whatever NAT
// state of the container is left is released here, found by names and
// comments, with the temp files of record writers that died; then the legacy leases of a migrated attachment; then the
// record, last, so that a DEL killed or failing part-way is finished by
// the next DEL or sweep.
func (s *Attacher) EndDel(d ipamdir.Dir, key records.Key) error {
	store := records.NewStore(d)
	rec, err := store.Read(key)
	if err != nil {
		s.logf("%s: %s: ignoring unreadable record: %v", d.Network, key, err)
		rec = nil
	}
	others, temps, err := store.Names(key)
	if err != nil {
		return err
	}
	var removed []string
	switch {
	case s.Netfilter == nil || len(others) > 0:
	case tornDown(rec, s.TornDown):
		removed, err = s.Netfilter.ReleaseOwnRules(d.Network, key.IfName, key.ContainerID)
	default:
		removed, err = s.Netfilter.ReleaseContainer(d.Network, key.IfName, key.ContainerID)
	}
	if len(removed) > 0 {
		s.logf("%s: DEL %s: removed what bridge left: %s", d.Network, key, strings.Join(removed, ", "))
	}
	if err != nil {
		return err
	}
	// A record write killed before its rename (an ADD of this attachment
	// killed mid-write, say) left its temp file.
	if _, err := store.RemoveAbandonedTemps(temps, func(pid int) bool { _, ok := s.Host.ProcessStart(pid); return ok }); err != nil {
		s.logf("%s: %v", d.Network, err)
	}
	if rec != nil && rec.State == records.Migrated {
		if err := s.releaseLegacy(d, rec); err != nil {
			return err
		}
	}
	s.forget(d, key)
	return store.Remove(key)
}

// AttachedThere is the record of another attachment in the namespace at
// netnsPath under key's ifname, when key itself has none: a DEL of key
// handed to bridge would delete that attachment's interface (bridge
// deletes CNI_IFNAME in CNI_NETNS, whoever it belongs to). nil when key
// has a record, when nothing else is recorded there, or when the path
// names no namespace. The other record counts only while its own path
// still names that namespace (the kernel reuses inode numbers; the
// cookie, where both are known, tells them apart).
func (s *Attacher) AttachedThere(d ipamdir.Dir, key records.Key, netnsPath string) (*records.Record, error) {
	store := records.NewStore(d)
	if rec, err := store.Read(key); rec != nil || err != nil || netnsPath == "" {
		return nil, err
	}
	nsID, err := s.Host.Netns(netnsPath)
	if err != nil {
		return nil, nil
	}
	var candidates []records.Key
	if _, err := store.Walk(func(r *records.Record) {
		if r.IfName == key.IfName && r.ContainerID != key.ContainerID && r.NetnsID == nsID && r.Netns != "" {
			candidates = append(candidates, r.Key())
		}
	}); err != nil {
		return nil, err
	}
	for _, k := range candidates {
		// Read again: a walk may take a record from its cache.
		r, err := store.Read(k)
		if err != nil || r == nil {
			continue
		}
		bootID, err := s.Host.BootID()
		if err != nil || r.BootID != bootID {
			continue
		}
		if id, err := s.Host.Netns(r.Netns); err != nil || id != nsID {
			continue
		}
		if cookie, _ := s.Host.NetnsCookie(netnsPath); cookie != 0 && r.NetnsCookie != 0 && cookie != r.NetnsCookie {
			continue
		}
		return r, nil
	}
	return nil, nil
}

// HoldsNothing reports whether the network holds nothing of key: no record
// (readable or not) and no lease naming it. A DEL then has nothing left to
// release here, whatever its delegate could not do (host-local's DEL
// creates its directory first, which a read-only data dir refuses).
func (s *Attacher) HoldsNothing(d ipamdir.Dir, key records.Key) bool {
	if rec, err := records.NewStore(d).Read(key); rec != nil || err != nil {
		return false
	}
	if !exists(d.Leases()) {
		return true
	}
	leases, err := openLeaseDir(d.Leases())
	if err != nil {
		return false
	}
	defer leases.close()
	legacy := records.Key{ContainerID: key.ContainerID}
	held := false
	err = leases.each(nil, func(l Lease) { held = held || l.Key == key || l.Key == legacy }, func(error) {})
	return err == nil && !held
}

// releaseLegacy removes the legacy leases of a migrated attachment that is
// DELeted through the plugin: they were kept only as the sign that it was
// alive (Migrator.recordMigrated). Each is removed under the legacy
// directory's host-local lock, and only while it still names the
// attachment; a path the record names outside the entry's legacy
// directory is left alone (legacyLeasePaths).
func (s *Attacher) releaseLegacy(d ipamdir.Dir, rec *records.Record) error {
	want := ipamdir.LeaseContent(rec.ContainerID, rec.IfName)
	paths := legacyLeasePaths(rec, s.LegacyDataDir)
	if len(paths) < len(rec.LegacyLeases) {
		s.logf("%s: %s: its record names legacy leases outside %s, left alone: %s", d.Network, rec.Key(), ipamdir.New(s.LegacyDataDir, d.Network).Leases(), strings.Join(rec.LegacyLeases, ", "))
	}
	var errs []error
	for _, path := range paths {
		if !exists(path) {
			continue // its runtime released it already
		}
		unlock, err := ipamdir.New(s.LegacyDataDir, d.Network).Lock()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		err = removeLeaseFile(Lease{Path: path, content: want})
		unlock()
		if err != nil {
			s.logf("%s: %s: legacy lease left in place: %v", d.Network, rec.Key(), err)
		}
	}
	return errors.Join(errs...)
}

// NamespaceUsable reports whether bridge could enter the namespace.
// OwnNamespacePath is where the plugin finds its own network namespace.
const OwnNamespacePath = "/proc/self/ns/net"

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
	own, err := s.Host.Netns(OwnNamespacePath)
	if err != nil {
		return false, fmt.Errorf("identify the plugin's own network namespace: %w", err)
	}
	return id == own, nil
}

func (s *Attacher) NamespaceUsable(netnsPath string) bool {
	if netnsPath == "" {
		return false
	}
	_, err := s.Host.Netns(netnsPath)
	return err == nil || !(errors.Is(err, fs.ErrNotExist) || errors.Is(err, sysinfo.ErrNotNetns))
}
