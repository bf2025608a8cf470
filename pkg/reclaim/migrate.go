package reclaim

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/containernetworking/cni/pkg/utils"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/internal/crashpoint"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/internal/statefile"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/records"
)

// Migrator moves the leases host-local kept outside the plugin's dataDir
// into it, once per boot and network.
type Migrator struct{ Env }

// Migrate moves the leases host-local kept in the legacy directory (the
// user's own ipam.dataDir, or /var/lib/cni/networks) into d.DataDir, once per
// boot and network: without it, right after adoption the empty dataDir
// would hand out addresses that running containers still hold. Leases
// from this boot are recorded (recordMigrated), then copied (content and
// mtime kept); those from before it are removed. Both host-local locks are
// held throughout, ours first. A crash loses nothing: without the marker the
// next run starts again, and keeps a copy already there.
func (s *Migrator) Migrate(d ipamdir.Dir, legacyDir string) error {
	bootID, err := s.Host.BootID()
	if err != nil {
		return err
	}
	if markedThisBoot(d, ipamdir.MigratedMarker, bootID) {
		return nil
	}
	legacyNet := ipamdir.New(legacyDir, d.Network).Leases()
	if legacyDir == "" || filepath.Clean(legacyDir) == filepath.Clean(d.DataDir) || !statefile.Exists(legacyNet) {
		// Nothing to move. No marker either: the next run looks again
		// (one stat), and a verb on a network the plugin never served
		// creates nothing.
		return nil
	}
	if err := s.migrate(d, legacyDir, bootID); err != nil {
		return err
	}
	if err := writeMarker(d, ipamdir.MigratedMarker, []byte(bootID)); err != nil {
		return fmt.Errorf("migration marker: %w", err)
	}
	return nil
}

// MigratedThisBoot reports whether d's network had its legacy leases
// migrated in this boot: those still in the legacy directory then are its
// migrated attachments' own, kept there until their runtime's DEL
// (recordMigrated), and no run of this boot moves them.
func (e *Env) MigratedThisBoot(d ipamdir.Dir) bool {
	bootID, err := e.Host.BootID()
	return err == nil && markedThisBoot(d, ipamdir.MigratedMarker, bootID)
}

// LegacyLeases counts the leases a migration of legacy's network would
// take from it, legacy being the network's directory in its legacy data
// dir: opened and listed as the migration opens and lists it (no symlink
// followed; only regular files named by an address that hold a
// reservation, host-local's bookkeeping and damaged files passed over),
// without host-local's lock and moving nothing: a count for a report. A
// directory that does not exist holds none; one the migration cannot open
// (a symlink, not a directory) is an error, as it is for the migration.
// Reading a lease takes root: host-local writes them 0600.
func LegacyLeases(legacy ipamdir.Dir) (int, error) {
	path := legacy.Leases()
	dir, err := openLeaseDir(path)
	if err != nil {
		// O_NOFOLLOW with O_DIRECTORY says ENOTDIR for a link, as for a file.
		if fi, lerr := os.Lstat(path); lerr == nil && fi.Mode()&fs.ModeSymlink != 0 {
			return 0, fmt.Errorf("refusing %s: it is a symlink, which the migration does not follow", path)
		}
		if errors.Is(err, syscall.ENOTDIR) {
			return 0, fmt.Errorf("refusing %s: not a directory", path)
		}
		return 0, err
	}
	defer dir.close()
	n := 0
	err = dir.each(nil, func(Lease) { n++ }, func(error) {})
	return n, err
}

func (s *Migrator) migrate(d ipamdir.Dir, legacyDir, bootID string) error {
	bootTime, err := s.Host.BootTime()
	if err != nil {
		return err
	}
	// Ours first, then the legacy one: every migration takes them in this
	// order, and host-local itself only ever holds one.
	unlockOurs, err := d.Lock()
	if err != nil {
		return err
	}
	defer unlockOurs()
	return withLeases(ipamdir.New(legacyDir, d.Network), func(dir *leaseDir) error {
		return s.move(d, dir, legacyDir, bootTime, bootID)
	})
}

// move moves the leases of dir, the legacy directory's network under
// legacyDir, into d, with both host-local locks held.
func (s *Migrator) move(d ipamdir.Dir, dir *leaseDir, legacyDir string, bootTime time.Time, bootID string) error {
	var leases []Lease
	if err := dir.each(nil, func(l Lease) { leases = append(leases, l) }, func(err error) {
		s.Logf("%s: legacy lease skipped: %v", d.Network, err)
	}); err != nil {
		return err
	}
	moved, dropped := 0, 0
	unrecorded := map[records.Key]bool{}
	kept := map[records.Key]bool{}
	// This boot's leases, by attachment.
	var keys []records.Key
	ofKey := map[records.Key][]Lease{}
	for _, l := range leases {
		if l.ModTime.Before(bootTime) {
			dropped++
			continue
		}
		if ofKey[l.Key] == nil {
			keys = append(keys, l.Key)
		}
		ofKey[l.Key] = append(ofKey[l.Key], l)
	}
	var errs []error
	for _, k := range keys {
		// The record before the copies: it is what finds them once the
		// attachment's runtime DELs its legacy lease. A run killed
		// between a copy and its record left a lease nothing names,
		// which no sweep releases, if that DEL came before the next run.
		recErr := recordMigrated(d, k, ofKey[k], bootID)
		for _, l := range ofKey[k] {
			target := d.Lease(l.IP)
			copied, err := copyLease(l, target)
			switch {
			case err != nil:
				errs = append(errs, err)
				kept[k] = true
			case !copied:
				kept[k] = true
				s.Logf("%s: legacy lease %s for %s not migrated: %s already holds it", d.Network, l.IP, l.Key, target)
			default:
				moved++
			}
		}
		// A lease kept where it is (its address has another owner here)
		// keeps the others there too, and the record, which finds the
		// copies made.
		if recErr != nil && !kept[k] {
			s.Logf("%s: %s: %v; its legacy lease is removed instead", d.Network, k, recErr)
			unrecorded[k] = true
		}
	}
	// What goes: each lease from before this boot, by itself (its
	// attachment's lease from this boot, in another range, stays), and
	// those of an attachment not recorded; nothing of one kept there.
	var doomed []Lease
	for _, l := range leases {
		if (l.ModTime.Before(bootTime) || unrecorded[l.Key]) && !kept[l.Key] {
			doomed = append(doomed, l)
		}
	}
	if err := dir.remove(doomed); err != nil {
		errs = append(errs, err)
	}
	if moved+dropped > 0 {
		s.Logf("%s: migrated %d lease(s) from %s to %s, removed %d from before this boot", d.Network, moved, legacyDir, d.DataDir, dropped)
	}
	return errors.Join(errs...)
}

// recordMigrated keeps a copied attachment's legacy leases where they are
// and records them: a runtime that adopted the plugin in place (podman
// after a conflist edit) DELs the attachment with the configuration it
// cached at ADD, plain bridge on the legacy directory, which releases only
// the legacy copy. While that copy exists the attachment is alive
// (migratedVerdict). A lease written before host-local recorded ifnames,
// one naming a container ID or ifname no runtime could have given (the
// record's file name is made of them), or an attachment that already has
// a record, fails here: its legacy lease is removed instead. A migrated
// record of this boot is no such record but this migration's own, left by
// a run killed before its marker: it is written again, and the legacy
// lease stays.
func recordMigrated(d ipamdir.Dir, k records.Key, leases []Lease, bootID string) error {
	if k.IfName == "" {
		return errors.New("lease names no ifname")
	}
	// The record's file name is made of them: only what skel lets a
	// runtime pass host-local, never a '/' that climbs out of the record
	// directory (a legacy lease is a file, read back as such).
	if e := utils.ValidateContainerID(k.ContainerID); e != nil {
		return fmt.Errorf("lease names no valid container ID: %s", e.Msg)
	}
	if e := utils.ValidateInterfaceName(k.IfName); e != nil {
		return fmt.Errorf("lease names no valid ifname: %s", e.Msg)
	}
	store := records.NewStore(d)
	if old, err := store.Read(k); err != nil || old != nil && (old.State != records.Migrated || old.BootID != bootID) {
		return fmt.Errorf("already has a record (%v)", err)
	}
	rec := &records.Record{Version: records.FormatVersion, Network: d.Network, ContainerID: k.ContainerID, IfName: k.IfName,
		BootID: bootID, Created: leases[0].ModTime.UTC(), State: records.Migrated}
	for _, l := range leases {
		rec.LegacyLeases = append(rec.LegacyLeases, l.Path)
	}
	return store.Write(rec)
}

// copyLease writes l at target as host-local's Reserve would (O_EXCL,
// 0600, same content), with its mtime, which the boot rule reads. It
// reports false, without error, when target already holds another
// attachment; a target identical to l (an earlier run died after copying)
// counts as moved, and an empty one (an earlier run died between creating
// and writing it: an empty reservation names nobody, and no DEL could
// ever release it) is written again.
func copyLease(l Lease, target string) (bool, error) {
	content := []byte(l.content)
	crashpoint.Step("create lease " + target)
	// O_NOFOLLOW: a planted symlink is never written through.
	f, err := os.OpenFile(target, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if errors.Is(err, fs.ErrExist) {
		st, serr := os.Lstat(target)
		switch {
		case serr != nil:
			return false, fmt.Errorf("inspect %s: %w", target, serr)
		case st.Mode()&fs.ModeSymlink != 0:
			return false, fmt.Errorf("%s is a symlink (planted?): not followed", target)
		case !st.Mode().IsRegular():
			return false, nil // something else holds the address
		}
		existing, rerr := statefile.ReadFileNoFollow(target)
		if rerr != nil {
			return false, fmt.Errorf("read %s: %w", target, rerr)
		}
		if len(existing) > 0 {
			return bytes.Equal(bytes.TrimSpace(existing), content), nil
		}
		crashpoint.Step("rewrite empty lease " + target)
		f, err = os.OpenFile(target, os.O_WRONLY|os.O_TRUNC|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0o600)
	}
	if err != nil {
		return false, fmt.Errorf("create %s: %w", target, err)
	}
	crashpoint.Step("write lease " + target)
	_, werr := f.Write(content)
	if err := errors.Join(werr, f.Close()); err != nil {
		os.Remove(target)
		return false, fmt.Errorf("write %s: %w", target, err)
	}
	if err := os.Chtimes(target, l.ModTime, l.ModTime); err != nil {
		return true, fmt.Errorf("keep mtime of %s: %w", target, err)
	}
	return true, nil
}
