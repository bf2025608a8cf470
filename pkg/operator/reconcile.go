package operator

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/internal/statefile"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/reclaim"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/runtimes"
)

// DefaultGrace is gc --runtime's default grace period.
const DefaultGrace = 5 * time.Minute

// Reconcile is what `gc --runtime` adds to a sweep: an attachment whose
// container the runtime does not list is released once it is older than
// the grace period and was missing from a list taken at least a grace
// earlier too (remembered in ipamdir.UnlistedMarker): a runtime still
// restoring after a restart lists its containers again within the grace.
type Reconcile struct {
	Runtime string
	Listing *runtimes.Listing
	Grace   time.Duration
	Now     time.Time
	// RemoveMounts unmounts the mount that alone still kept a released
	// attachment's namespace (a leaked nsfs bind mount).
	RemoveMounts bool
	// missing is, per network, this run's view: since when each unlisted
	// attachment has been missing.
	missing map[ipamdir.Dir]map[string]time.Time
}

// unlistedState is ipamdir.UnlistedMarker's content; it names each
// attachment as its record is named (ipamdir.RecordName).
type unlistedState struct {
	Runtime      string               `json:"runtime"`
	MissingSince map[string]time.Time `json:"missingSince"`
}

// For is the sweep's Request.Unlisted for the network of d.
func (r *Reconcile) For(d ipamdir.Dir) func(a *reclaim.Attachment) (string, bool) {
	before := r.load(d)
	if r.missing == nil {
		r.missing = map[ipamdir.Dir]map[string]time.Time{}
	}
	now := map[string]time.Time{}
	r.missing[d] = now
	return func(a *reclaim.Attachment) (string, bool) {
		if r.Listing.IDs[a.Key.ContainerID] {
			return "", false
		}
		key := ipamdir.RecordName(a.Key.ContainerID, a.Key.IfName)
		since, seen := before[key]
		if !seen {
			since = r.Now
		}
		now[key] = since
		born := created(a)
		switch {
		case !seen, r.Now.Sub(since) < r.Grace, born.IsZero(), r.Now.Sub(born) < r.Grace:
			return "", false
		}
		return fmt.Sprintf("not listed by %s since %s (grace %s)", r.Runtime, since.UTC().Format(time.RFC3339), r.Grace), true
	}
}

// released forgets a released attachment (should its files have stayed,
// the next run finds it missing afresh) and removes, with RemoveMounts,
// the nsfs mount that alone kept its namespace, or says why not.
func (r *Reconcile) released(d ipamdir.Dir, rel *reclaim.Release, dryRun bool) {
	delete(r.missing[d], ipamdir.RecordName(rel.Key.ContainerID, rel.Key.IfName))
	if rel.HeldBy == nil {
		return
	}
	if err := r.unmount(rel.HeldBy.Mount, dryRun); err != nil {
		rel.Reason += fmt.Sprintf(" (not removed: %v)", err)
	} else {
		rel.What = append(rel.What, "mount "+rel.HeldBy.Mount)
	}
}

func (r *Reconcile) unmount(mount string, dryRun bool) error {
	switch {
	case !r.RemoveMounts:
		return errors.New("--remove-mounts unmounts it")
	case dryRun:
		return nil
	}
	// Not followed: a symlink planted at the path since the holder scan
	// would have the mount it points to taken.
	if err := unix.Unmount(mount, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil {
		return err
	}
	// ip netns leaves an empty file as the mount point.
	if fi, err := os.Lstat(mount); err == nil && fi.Mode().IsRegular() && fi.Size() == 0 {
		os.Remove(mount)
	}
	return nil
}

// created is when the attachment was made: its record's time, else its
// oldest lease's.
func created(a *reclaim.Attachment) time.Time {
	if a.Record != nil && !a.Record.Created.IsZero() {
		return a.Record.Created
	}
	var t time.Time
	for _, l := range a.Leases {
		if t.IsZero() || l.ModTime.Before(t) {
			t = l.ModTime
		}
	}
	return t
}

func (r *Reconcile) load(d ipamdir.Dir) map[string]time.Time {
	b, err := statefile.ReadFileNoFollow(d.Marker(ipamdir.UnlistedMarker))
	var st unlistedState
	if err != nil || json.Unmarshal(b, &st) != nil || st.Runtime != r.Runtime {
		return map[string]time.Time{}
	}
	return st.MissingSince
}

// Save remembers, per network swept, the attachments missing from this
// run's list (those listed again, or gone, are forgotten).
func (r *Reconcile) Save() error {
	var errs []error
	for d, missing := range r.missing {
		path := d.Marker(ipamdir.UnlistedMarker)
		if len(missing) == 0 {
			if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			}
			continue
		}
		if _, err := os.Stat(d.Records()); err != nil {
			continue // a network without a record directory keeps no state
		}
		b, err := json.Marshal(unlistedState{Runtime: r.Runtime, MissingSince: missing})
		if err == nil {
			err = statefile.WriteAtomic(path, b, nil)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("remember what %s did not list: %w", r.Runtime, err))
		}
	}
	return errors.Join(errs...)
}

// Drift is leases --runtime: it marks each row listed or not listed by
// the runtime (one way of drift), and at the end names the containers the
// runtime lists that hold nothing on these networks (the other way: on
// another network, or without a network, or their attachment was lost)
// to Note, one line each.
type Drift struct {
	Sink    LeasesSink
	Runtime string
	Listing *runtimes.Listing
	Note    io.Writer
	seen    map[string]bool // listed containers met in rows: never more than the listing, whatever the leases
}

func (d *Drift) Row(r Row) {
	if d.seen == nil {
		d.seen = map[string]bool{}
	}
	r.Runtime = "not listed"
	if d.Listing.IDs[r.ContainerID] {
		r.Runtime = "listed"
		d.seen[r.ContainerID] = true
	}
	d.Sink.Row(r)
}

func (d *Drift) Kept(network string, addresses int) { d.Sink.Kept(network, addresses) }

func (d *Drift) End(problems *Problems) error {
	err := d.Sink.End(problems)
	note := output{w: d.Note}
	for _, id := range slices.Sorted(maps.Keys(d.Listing.IDs)) {
		if !d.seen[id] {
			note.printf("listed by %s, holding nothing on these networks: %s\n", printable(d.Runtime, id)...)
		}
	}
	return cmp.Or(err, note.err)
}
