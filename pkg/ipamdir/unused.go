package ipamdir

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/internal/statefile"
)

// A verb that fails on a network the plugin never served must leave
// nothing behind: no data dir, no marker (OwnedMarker would make the
// network's NAT rules the plugin's to release), no lock. A verb notes what
// existed before it ran (Existing), and a failed one removes what it
// created, as long as it holds nothing of anyone (RemoveUnused).

// Existing says which of a network's directories exist.
type Existing struct {
	DataDir, Leases, RecordRoot, Records bool
}

// Existing looks at the network's directories, creating nothing.
func (d Dir) Existing() Existing {
	return Existing{
		DataDir:    exists(d.DataDir),
		Leases:     exists(d.Leases()),
		RecordRoot: exists(filepath.Join(d.DataDir, RecordDirName)),
		Records:    exists(d.Records()),
	}
}

// RemoveUnused removes the directories of the network that did not exist
// before (was) and hold nothing of anyone: a lease directory with only
// host-local's lock and last_reserved_ip.N (emptied under that lock, so no
// host-local is inside), a record directory with only the plugin's
// markers (OwnedMarker last: it is what makes the network's rules the
// plugin's), then the record root and the data dir if empty. A directory
// that holds anything else is left as it is: a concurrent ADD's. A kill
// part-way leaves a subset of the same files.
func (d Dir) RemoveUnused(was Existing) error {
	var errs []error
	if !was.Leases {
		errs = append(errs, d.removeUnusedLeases())
	}
	if !was.Records {
		errs = append(errs, d.removeUnusedRecords())
	}
	if !was.RecordRoot {
		_ = os.Remove(filepath.Join(d.DataDir, RecordDirName)) // fails unless empty
	}
	if !was.DataDir {
		_ = os.Remove(d.DataDir) // fails unless empty
	}
	return errors.Join(errs...)
}

func (d Dir) removeUnusedLeases() error {
	names, err := dirNames(d.Leases())
	if err != nil || names == nil {
		return err
	}
	for _, n := range names {
		if !IsHostLocalBookkeeping(n) {
			return nil
		}
	}
	unlock, err := d.LockExisting()
	if err != nil {
		return err
	}
	defer unlock()
	if names, err = dirNames(d.Leases()); err != nil {
		return err
	}
	// The lock last: whoever waits on it finds the directory gone, and
	// host-local then fails rather than allocating in a removed one.
	var lock bool
	for _, n := range names {
		switch {
		case n == LockFileName:
			lock = true
		case IsHostLocalBookkeeping(n):
			if err := os.Remove(filepath.Join(d.Leases(), n)); err != nil {
				return err
			}
		default:
			return nil // a lease appeared: someone's ADD
		}
	}
	if lock {
		if err := os.Remove(filepath.Join(d.Leases(), LockFileName)); err != nil {
			return err
		}
	}
	return os.Remove(d.Leases())
}

func (d Dir) removeUnusedRecords() error {
	names, err := dirNames(d.Records())
	if err != nil || names == nil {
		return err
	}
	for _, n := range names {
		if !strings.HasPrefix(n, ".") || strings.HasPrefix(n, statefile.TempPrefix) {
			return nil // a record, or a record being written
		}
	}
	owned := false
	for _, n := range names {
		if n == string(OwnedMarker) {
			owned = true
			continue
		}
		if err := os.Remove(filepath.Join(d.Records(), n)); err != nil {
			return err
		}
	}
	if owned {
		if err := os.Remove(d.Marker(OwnedMarker)); err != nil {
			return err
		}
	}
	if err := os.Remove(d.Records()); err != nil {
		return fmt.Errorf("remove %s: %w", d.Records(), err)
	}
	return nil
}

// dirNames lists dir; nil, without error, when it does not exist.
func dirNames(dir string) ([]string, error) {
	f, err := os.Open(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if names == nil {
		names = []string{}
	}
	return names, err
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return !errors.Is(err, os.ErrNotExist)
}
