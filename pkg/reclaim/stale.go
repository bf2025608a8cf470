package reclaim

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"path/filepath"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/internal/statefile"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/records"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/sysinfo"
)

// State is a sweep's verdict on one attachment.
type State string

const (
	// Live: its namespace is the one recorded at ADD, in this boot.
	Live State = "live"
	// Stale: proved dead; a sweep releases it.
	Stale State = "stale"
	// Pending: an ADD for it is still running.
	Pending State = "pending"
	// Unknown: a lease from this boot with no record (written by something
	// else, or migrated): reported, never released by a sweep.
	Unknown State = "unknown"
	// Detached: its namespace path no longer names its namespace, but a
	// process or a mount still holds that namespace, so its address is in
	// use: kept by every sweep, and a re-ADD of it is refused.
	Detached State = "detached"
)

// Verdict is a State and the reason for it, in words an operator reads.
type Verdict struct {
	State  State
	Reason string
	// Holder is what keeps a detached attachment's namespace alive (every
	// Detached verdict has one).
	Holder *sysinfo.Holder
	// Cause names a stale verdict's rule, for counting releases by it (one
	// of the Cause* constants).
	Cause string
}

// The causes of a release, as counted across runs (see countReleases).
const (
	CauseEarlierBoot   = "earlier-boot"
	CauseLeaseOld      = "lease-before-boot"
	CauseNamespaceGone = "namespace-gone"
	CauseNotListed     = "not-in-gc-list"
	// CauseRuntimeUnlisted: gc --runtime's list lacked it, past the grace.
	CauseRuntimeUnlisted = "not-listed-by-runtime"
	CauseAddDied         = "add-died"
	CauseMigratedDel     = "migrated-released"
	CauseOrphanRules     = "orphan-rules"
	// CauseEmptyLease: a lease its host-local died writing.
	CauseEmptyLease = "empty-lease"
)

// Attachment is everything the network holds for one container ID + ifname.
type Attachment struct {
	Key     records.Key
	Leases  []Lease
	Record  *records.Record
	Verdict Verdict
}

// judge applies the staleness rules (docs/reclaim.md, "When an attachment
// is stale"): each stale verdict rests on a fact, never on a guess. A
// pending record whose ADD still runs is kept whatever the rules say, and
// so is a record-less lease from this boot.
type judge struct {
	// Env is the host it looks at and the log it writes to.
	*Env
	// records' locks tell which ADDs still run.
	records  *records.Store
	bootID   string
	bootTime time.Time
	// valid is the GC verb's list; nil outside a GC.
	valid validSet
	// holders: scanned at most once, when some path fails its check.
	holders sysinfo.Holders
	// endOverdue: kill what still runs of a pending ADD past its
	// record's deadline (never in a dry run); the log says so.
	endOverdue bool
	// unlisted is Request.Unlisted.
	unlisted func(a *Attachment) (string, bool)
	// legacyDataDir is the entry's legacy lease directory's parent, where
	// migrated attachments' leases are (see migratedVerdict).
	legacyDataDir string
}

// overdueExitWait bounds how long a judge waits for the processes it
// killed to let go of a pending record's lock; if they have not, the next
// sweep decides.
const overdueExitWait = 2 * time.Second

// newJudge is a judge of d's network that ends overdue ADDs and logs
// through e.
func newJudge(e *Env, d ipamdir.Dir, legacyDataDir string) (*judge, error) {
	bootID, err := e.Host.BootID()
	if err != nil {
		return nil, err
	}
	bootTime, err := e.Host.BootTime()
	if err != nil {
		return nil, err
	}
	return &judge{Env: e, records: records.NewStore(d), bootID: bootID, bootTime: bootTime,
		endOverdue: true, legacyDataDir: legacyDataDir}, nil
}

func (j *judge) verdict(a *Attachment) Verdict {
	ended := ""
	if r := a.Record; r != nil && r.State == records.Started && r.BootID == j.bootID {
		var running Verdict
		if running, ended = j.addRunning(r); running.State != "" {
			return running
		}
	}
	v := j.verdictOfDeadADD(a)
	if ended != "" {
		// What the release says: the ADD's delegate was ended here.
		v.Reason += "; " + ended
	}
	return j.orUnlisted(a, v)
}

// orUnlisted is v, or stale when the runtime proved the attachment gone
// (Request.Unlisted). A namespace a process still holds is never taken
// from it, whether its path still names it or not: something runs there.
// One only a mount holds (a runtime that crashed before its clean-up) is
// released, and the mount is named.
func (j *judge) orUnlisted(a *Attachment, v Verdict) Verdict {
	// An unknown attachment (a lease with no record) may be another
	// runtime's, which this one cannot speak for.
	if j.unlisted == nil || (v.State != Live && v.State != Detached) || (v.State == Detached && v.Holder.PID != 0) {
		return v
	}
	reason, release := j.unlisted(a)
	if !release || v.State == Live && j.processMayBeIn(a.Record) {
		return v
	}
	stale := Verdict{State: Stale, Reason: reason, Cause: CauseRuntimeUnlisted}
	if v.State == Detached {
		stale.Reason += fmt.Sprintf("; its namespace is still held by mount %s", v.Holder.Mount)
		stale.Holder = v.Holder
	}
	return stale
}

// verdictOfDeadADD is verdict for an attachment no ADD is running for.
func (j *judge) verdictOfDeadADD(a *Attachment) Verdict {
	if j.valid != nil {
		if j.valid[a.Key] {
			return Verdict{State: Live, Reason: "listed by the runtime's GC"}
		}
		return Verdict{State: Stale, Reason: "not in the runtime's valid attachments", Cause: CauseNotListed}
	}
	if a.Record != nil {
		return j.recordVerdict(a)
	}
	for _, l := range a.Leases {
		if !l.ModTime.Before(j.bootTime) {
			return Verdict{State: Unknown, Reason: "no record"}
		}
	}
	return Verdict{State: Stale, Reason: fmt.Sprintf("lease written %s, before this boot at %s", a.Leases[0].ModTime.UTC().Format(time.RFC3339), j.bootTime.UTC().Format(time.RFC3339)), Cause: CauseLeaseOld}
}

// deadADDInLiveNamespace judges a pending record whose ADD's processes
// are gone, whose namespace is still the recorded one, and which no lease
// names (docs/reclaim.md, "A dead ADD in a live namespace"): an address
// on its interface, other than a link-local one the kernel adds itself,
// means the ADD got one (a lease may name it otherwise), and it is live.
func (j *judge) deadADDInLiveNamespace(r *records.Record) Verdict {
	addrs, err := j.Host.LinkAddrs(r.Netns, r.IfName)
	if err != nil {
		return Verdict{State: Unknown, Reason: fmt.Sprintf("its ADD did not finish, and cannot tell what %s holds: %v", r.Netns, err)}
	}
	for _, ip := range addrs {
		if !ip.IsLinkLocalUnicast() {
			return Verdict{State: Live, Reason: fmt.Sprintf("its ADD did not finish, but %s in %s has address %s", r.IfName, r.Netns, ip)}
		}
	}
	// Its processes are gone (checked above) and nothing was allocated:
	// the record protects nothing.
	return Verdict{State: Stale, Reason: "its ADD died before an address was allocated", Cause: CauseAddDied}
}

// recordVerdict is verdictOfDeadADD for an attachment with a record.
func (j *judge) recordVerdict(a *Attachment) Verdict {
	r := a.Record
	if r.BootID != j.bootID {
		return Verdict{State: Stale, Reason: "recorded in an earlier boot", Cause: CauseEarlierBoot}
	}
	if r.State == records.Migrated {
		return migratedVerdict(r, j.legacyDataDir)
	}
	if r.Netns == "" {
		return Verdict{State: Unknown, Reason: "record has no namespace path"}
	}
	id, err := j.Host.Netns(r.Netns)
	var gone string
	switch {
	case errors.Is(err, fs.ErrNotExist):
		gone = fmt.Sprintf("namespace %s is gone", r.Netns)
	case errors.Is(err, sysinfo.ErrNotNetns):
		gone = fmt.Sprintf("%s is no longer a network namespace", r.Netns)
	case err != nil:
		// Cannot look: cannot prove anything, so keep it.
		return Verdict{State: Unknown, Reason: fmt.Sprintf("cannot inspect namespace: %v", err)}
	case id != r.NetnsID:
		gone = fmt.Sprintf("namespace %s was replaced (inode %d, recorded %d)", r.Netns, id.Ino, r.NetnsID.Ino)
	}
	if gone != "" {
		return j.unlessHeld(r, gone)
	}
	switch {
	case r.State == records.Started && len(a.Leases) == 0:
		return j.deadADDInLiveNamespace(r)
	case r.State == records.Started:
		return Verdict{State: Live, Reason: "ADD did not finish, namespace still there"}
	}
	return Verdict{State: Live}
}

// migratedVerdict judges an attachment migrated from the legacy lease
// directory by its legacy lease (see recordMigrated): alive while
// that still names it, released by its runtime once it is gone. Only
// leases in the network's directory under legacyDataDir count (see
// legacyLeasePaths); a record naming none there proves nothing.
func migratedVerdict(r *records.Record, legacyDataDir string) Verdict {
	paths := legacyLeasePaths(r, legacyDataDir)
	if len(paths) == 0 {
		return Verdict{State: Unknown, Reason: fmt.Sprintf("migrated, but its record names no lease in %s (%s): damaged or edited, kept until its DEL", ipamdir.New(legacyDataDir, r.Network).Leases(), strings.Join(r.LegacyLeases, ", "))}
	}
	want := ipamdir.LeaseContent(r.ContainerID, r.IfName)
	for _, path := range paths {
		b, err := statefile.ReadFileNoFollow(path)
		switch {
		case err == nil && strings.TrimSpace(string(b)) == want:
			return Verdict{State: Live, Reason: fmt.Sprintf("migrated; in use while %s holds it", path)}
		case err != nil && !errors.Is(err, fs.ErrNotExist):
			return Verdict{State: Unknown, Reason: fmt.Sprintf("migrated, and cannot read %s: %v", path, err)}
		}
	}
	return Verdict{State: Stale, Reason: fmt.Sprintf("migrated, and its runtime released its legacy lease %s (a DEL through the configuration it was added with)", strings.Join(paths, ", ")), Cause: CauseMigratedDel}
}

// legacyLeasePaths are the paths of r's legacy leases that can be one:
// a file named by an address in r's network's directory under
// legacyDataDir, the only place the migration takes leases from. A record
// is a file anyone with the data dir can edit, and is read back as such:
// a path elsewhere is never read, locked or removed.
func legacyLeasePaths(r *records.Record, legacyDataDir string) []string {
	if legacyDataDir == "" {
		return nil
	}
	dir := ipamdir.New(legacyDataDir, r.Network).Leases()
	var paths []string
	for _, p := range r.LegacyLeases {
		if p == filepath.Join(dir, filepath.Base(p)) && net.ParseIP(filepath.Base(p)) != nil {
			paths = append(paths, p)
		}
	}
	return paths
}

// processMayBeIn tells whether a process is, or may be, in the namespace
// r's path still names (a live attachment): its path, a mount, is all a
// leaked namespace has; any process in it, or one that cannot be checked,
// keeps it. A record without a namespace (a migrated lease's: the bare
// chain's container, perhaps another runtime's) cannot be looked into,
// and is kept as a lease with no record is.
func (j *judge) processMayBeIn(r *records.Record) bool {
	if r == nil || r.NetnsID == (sysinfo.NetnsID{}) {
		return true
	}
	h, err := j.holderOf(r, true)
	return h != nil || err != nil
}

// holderOf is what still holds r's recorded namespace, confirmed by its
// cookie (nil: nothing does; a process only, when processOnly), or why
// that cannot be told. The host's holders are scanned once per judge.
func (j *judge) holderOf(r *records.Record, processOnly bool) (*sysinfo.Holder, error) {
	if j.holders == nil {
		holders, err := j.Host.NetnsHolders()
		if err != nil {
			return nil, fmt.Errorf("cannot tell whether a process still holds it: %w", err)
		}
		j.holders = holders
	}
	var unsure error
	for _, h := range j.holders[r.NetnsID] {
		if processOnly && h.PID == 0 {
			continue
		}
		h, ok, err := j.Host.ConfirmHolder(h, r.NetnsID, r.NetnsCookie)
		if ok {
			return &h, nil
		}
		if err != nil && unsure == nil {
			unsure = fmt.Errorf("%s may still hold namespace net:[%d]: %w", h, r.NetnsID.Ino, err)
		}
	}
	return nil, unsure
}

// unlessHeld is the verdict on a record whose path no longer names its
// namespace: stale, unless a process or a mount still holds the recorded
// namespace. Only the kernel knows when a namespace is dead, and it keeps
// one alive as long as something is in it.
func (j *judge) unlessHeld(r *records.Record, gone string) Verdict {
	switch h, err := j.holderOf(r, false); {
	case h != nil:
		return Verdict{State: Detached, Reason: fmt.Sprintf("namespace net:[%d] still held by %s", r.NetnsID.Ino, h), Holder: h}
	case err != nil:
		// A path proves nothing, and the holder could not be checked.
		return Verdict{State: Unknown, Reason: fmt.Sprintf("%s, and %v", gone, err)}
	}
	return Verdict{State: Stale, Reason: gone, Cause: CauseNamespaceGone}
}

// addRunning tells whether the ADD that wrote a pending record still runs,
// and says so in a verdict: its plugin is still that process (same pid and
// start time: pids are reused), or a process it started (the delegate,
// host-local, iptables) still holds the record's lock. Records written
// before the lock existed are judged by the pid alone.
//
// A running ADD's verdict has a State; ended, when not empty, says that
// the ADD's overdue delegate was killed here (see overdue).
func (j *judge) addRunning(r *records.Record) (running Verdict, ended string) {
	if r.PID > 0 {
		if start, ok := j.Host.ProcessStart(r.PID); ok && start == r.PIDStart {
			return Verdict{State: Pending, Reason: fmt.Sprintf("ADD in progress, pid %d", r.PID)}, ""
		}
	}
	locked, err := j.records.AddRunning(r.Key())
	switch {
	case err != nil:
		// Cannot look: cannot prove the ADD is over, so keep it.
		return Verdict{State: Unknown, Reason: fmt.Sprintf("cannot tell whether its ADD still runs: %v", err)}, ""
	case locked && r.Deadline != 0 && uint64(j.Host.Now().Unix()) > r.Deadline:
		return j.overdue(r)
	case locked:
		return Verdict{State: Pending, Reason: fmt.Sprintf("ADD in progress, pid %d gone, its delegate still runs", r.PID)}, ""
	}
	return Verdict{}, ""
}

// overdue judges a pending ADD whose plugin is gone and whose processes
// (its delegate, host-local, iptables: they hold the record open) run on
// past the record's deadline, when nothing bounds them any more: it kills
// them, unless this is a dry run, and the ADD is over once they let go of
// the lock.
func (j *judge) overdue(r *records.Record) (Verdict, string) {
	deadline := time.Unix(int64(r.Deadline), 0).UTC().Format(time.RFC3339)
	if !j.endOverdue {
		return Verdict{State: Pending, Reason: fmt.Sprintf("ADD of pid %d (gone) still runs in its delegate, overdue since %s", r.PID, deadline)}, ""
	}
	killed, err := j.Host.KillLockHolders(j.records.PathOf(r.Key()))
	ended := fmt.Sprintf("its ADD's delegate ran past the deadline %s with the plugin (pid %d) gone: killed pids %v", deadline, r.PID, killed)
	j.Logf("%s: %s: %s", r.Network, r.Key(), ended)
	if err != nil {
		return Verdict{State: Unknown, Reason: fmt.Sprintf("its ADD's delegate is overdue since %s and could not all be killed: %v", deadline, err)}, ""
	}
	for start := time.Now(); time.Since(start) < overdueExitWait; time.Sleep(10 * time.Millisecond) {
		if locked, err := j.records.AddRunning(r.Key()); err == nil && !locked {
			return Verdict{}, ended
		}
	}
	return Verdict{State: Pending, Reason: fmt.Sprintf("its ADD's delegate, overdue since %s, was killed (pids %v) and has not exited yet", deadline, killed)}, ""
}

// validSet matches attachments against a GC list the way host-local does:
// a lease written before ifnames were recorded (no ifname in its key) is
// valid if its container ID is listed with any ifname.
type validSet map[records.Key]bool

func newValidSet(valid []types.GCAttachment) validSet {
	v := validSet{}
	for _, a := range valid {
		v[records.Key{ContainerID: a.ContainerID, IfName: a.IfName}] = true
		v[records.Key{ContainerID: a.ContainerID}] = true
	}
	return v
}
