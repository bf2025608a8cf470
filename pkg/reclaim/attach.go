package reclaim

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/containernetworking/plugins/plugins/ipam/host-local/backend/disk"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/netdir"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/records"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/sysinfo"
)

// Attacher keeps an attachment's record around the delegate's ADD and DEL:
// it releases an earlier, stale attachment of the same key before an ADD,
// refuses a live one, and makes sure a DEL leaves no NAT rule behind.
type Attacher struct{ Env }

// PendingAdd is an ADD under way: where its record lives, what it says,
// and the lock that marks it running.
type PendingAdd struct {
	store  *records.Store
	Record *records.Record
	// lock holds the pending record's flock (records.Store.WriteLocked)
	// until Complete or Abort: a sweep counts the ADD as running while
	// any process holds it.
	lock *os.File
}

// BeginAdd prepares an ADD of key into the namespace at netnsPath. If the
// attachment already has a record, it is judged first: a stale one (earlier
// boot, namespace gone or replaced — Nomad re-creates the netns at the
// same path and ADDs again without a DEL) is released so the delegate can
// allocate again; a live one is a real duplicate and an error. Then the
// pending record is written, before anything is delegated, so a crash at
// any later point leaves a trace a sweep can follow.
func (s *Attacher) BeginAdd(d netdir.Dir, key records.Key, netnsPath string) (*PendingAdd, error) {
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
	if old != nil {
		if err := s.replaceEarlier(d, old, netnsPath, nsID, cookie); err != nil {
			return nil, err
		}
	}

	bootID, err := s.Host.BootID()
	if err != nil {
		return nil, fmt.Errorf("read boot id: %w", err)
	}
	pid, start := sysinfo.Self(s.Host)
	rec := &records.Record{
		Version: records.FormatVersion, Network: d.Network, ContainerID: key.ContainerID, IfName: key.IfName,
		Netns: netnsPath, NetnsID: nsID, NetnsCookie: cookie, BootID: bootID, Created: s.Host.Now().UTC(),
		State: records.Started, PID: pid, PIDStart: start,
	}
	lock, err := recStore.WriteLocked(rec)
	if err != nil {
		return nil, &AddError{Kind: ErrRecordWrite, Msg: "failed to write the attachment record", Detail: err.Error()}
	}
	return &PendingAdd{store: recStore, Record: rec, lock: lock}, nil
}

// replaceEarlier decides what an existing record for the same attachment
// means for a new ADD.
func (s *Attacher) replaceEarlier(d netdir.Dir, old *records.Record, netnsPath string, nsID sysinfo.NetnsID, cookie uint64) error {
	j, err := newJudge(s.Host, records.NewStore(d), nil, false)
	if err != nil {
		return err
	}
	v := j.verdict(&Attachment{Key: old.Key(), Record: old})
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
		return &AddError{Kind: ErrStillAttached, Msg: fmt.Sprintf("%s is still attached to %s in namespace net:[%d], held by %s, although %s names another namespace now: stop that container, then DEL %s before adding it again", old.Key(), d.Network, old.NetnsID.Ino, held, netnsPath, old.Key()), Detail: v.Reason}
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
	if old.NetnsID == nsID {
		return &AddError{Kind: ErrStillAttached, Msg: fmt.Sprintf("%s is already attached to %s in namespace %s: DEL it before adding it again", old.Key(), d.Network, netnsPath)}
	}
	return &AddError{Kind: ErrStillAttached, Msg: fmt.Sprintf("%s is still attached to %s in the live namespace %s: DEL it before adding it to %s", old.Key(), d.Network, old.Netns, netnsPath)}
}

// releaseOne releases a single stale attachment the way a sweep releases
// one (releaseFiles), under host-local's lock: its leases, its NAT rules,
// its record.
func (s *Attacher) releaseOne(d netdir.Dir, old *records.Record, v Verdict) error {
	_, unlock, err := d.Lock()
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
	recordGone, err := releaseFiles(leases, records.NewStore(d), a, false)
	errs = append(errs, err)
	if recordGone {
		rel.What = append(rel.What, "record")
	}
	if s.Netfilter != nil {
		removed, err := s.Netfilter.ReleaseContainer(d.Network, old.IfName, old.ContainerID)
		addNAT(&rel, removed)
		errs = append(errs, err)
	}
	s.countReleases(d, map[string]int{v.Cause: 1})
	s.logf("%s: released %s", d.Network, rel)
	return errors.Join(errs...)
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
	return a.store.Write(a.Record)
}

// Abort removes the pending record of an ADD that failed: the delegate
// cleaned up after itself (bridge releases its IPAM allocation on error).
func (a *PendingAdd) Abort() error {
	defer a.Close()
	return a.store.Remove(a.Record.Key())
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
// that is already gone (CRI-O replaying cached DELs at start-up) or one
// re-created at the same path, it skips them, and they would stay for good
// once the record is gone. In those cases the rules are released here,
// found by their comments. Then the record goes.
func (s *Attacher) EndDel(d netdir.Dir, key records.Key, netnsPath string) error {
	store := records.NewStore(d)
	rec, err := store.Read(key)
	if err != nil {
		s.logf("%s: %s: ignoring unreadable record: %v", d.Network, key, err)
		rec = nil
	}
	var errs []error
	if s.Netfilter != nil && !s.bridgeTornDown(rec, netnsPath) {
		removed, err := s.Netfilter.ReleaseContainer(d.Network, key.IfName, key.ContainerID)
		if len(removed) > 0 {
			s.logf("%s: DEL %s outside its namespace: removed %s", d.Network, key, strings.Join(removed, ", "))
		}
		errs = append(errs, err)
	}
	if rec != nil && rec.State == records.Migrated {
		errs = append(errs, s.releaseLegacy(d, rec))
	}
	errs = append(errs, store.Remove(key))
	return errors.Join(errs...)
}

// releaseLegacy removes the legacy leases of a migrated attachment that is
// DELeted through the plugin: they were kept only as the sign that it was
// alive (Migrator.recordMigrated). Each is removed under the legacy
// directory's host-local lock, and only while it still names the
// attachment.
func (s *Attacher) releaseLegacy(d netdir.Dir, rec *records.Record) error {
	want := rec.ContainerID + disk.LineBreak + rec.IfName
	var errs []error
	for _, path := range rec.LegacyLeases {
		if !exists(path) {
			continue // its runtime released it already
		}
		legacyDir := filepath.Dir(filepath.Dir(path))
		_, unlock, err := netdir.New(legacyDir, d.Network).Lock()
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

// bridgeTornDown reports whether bridge's DEL ran in the namespace the
// attachment was made in, and so removed its ipMasq rules itself.
func (s *Attacher) bridgeTornDown(rec *records.Record, netnsPath string) bool {
	if !s.NamespaceUsable(netnsPath) {
		return false
	}
	if rec == nil || rec.Netns != netnsPath {
		return true // nothing to compare with: bridge did what it could
	}
	id, err := s.Host.Netns(netnsPath)
	if err != nil || id != rec.NetnsID {
		return false
	}
	if rec.NetnsCookie != 0 {
		if cookie, err := s.Host.NetnsCookie(netnsPath); err == nil && cookie != rec.NetnsCookie {
			return false
		}
	}
	return true
}

// NamespaceUsable reports whether bridge could enter the namespace (and so
// ran its own teardown).
func (s *Attacher) NamespaceUsable(netnsPath string) bool {
	if netnsPath == "" {
		return false
	}
	_, err := s.Host.Netns(netnsPath)
	return err == nil || !(errors.Is(err, fs.ErrNotExist) || errors.Is(err, sysinfo.ErrNotNetns))
}
