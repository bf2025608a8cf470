package ipamdir

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/internal/statefile"
)

// Existing says which of a network's directories exist: what a verb notes
// before it runs, since one that fails on a network the plugin never
// served must leave nothing behind (RemoveUnused): no data dir, no lock,
// no marker (OwnedMarker would make the network's NAT rules the plugin's
// to release).
type Existing struct {
	DataDir, Leases, RecordRoot, Records bool
}

// Existing looks at the network's directories, creating nothing.
func (d Dir) Existing() Existing {
	return Existing{
		DataDir:    statefile.Exists(d.DataDir),
		Leases:     statefile.Exists(d.Leases()),
		RecordRoot: statefile.Exists(filepath.Join(d.DataDir, RecordDirName)),
		Records:    statefile.Exists(d.Records()),
	}
}

// RemoveUnused removes the directories of the network that did not exist
// before (was) and hold nothing of anyone: a lease directory with only
// host-local's lock and last_reserved_ip.N (emptied under that lock, so no
// host-local is inside), a record directory with only the plugin's
// markers, then the record root and the data dir if empty. A directory
// that holds anything else is left as it is: a concurrent ADD's. A kill
// part-way leaves a subset of the same files.
func (d Dir) RemoveUnused(was Existing) error {
	var errs []error
	if !was.Leases {
		errs = append(errs, d.removeUnusedLeases())
	}
	if !was.Records {
		// Only markers (not a record, nor one being written), OwnedMarker
		// last: it is what makes the network's rules the plugin's.
		isMarker := func(n string) bool {
			return strings.HasPrefix(n, ".") && !strings.HasPrefix(n, statefile.TempPrefix)
		}
		errs = append(errs, removeIfOnly(d.Records(), isMarker, string(OwnedMarker)))
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
	unlock, err := d.LockExisting()
	if err != nil {
		return err
	}
	defer unlock()
	// The lock last: whoever waits on it finds the directory gone, and
	// host-local then fails rather than allocating in a removed one.
	return removeIfOnly(d.Leases(), IsHostLocalBookkeeping, LockFileName)
}

// removeIfOnly removes dir when every name in it is one of removable's:
// its files, last the one named last, then dir. A missing dir is fine;
// one that holds anything else is left whole.
func removeIfOnly(dir string, removable func(string) bool, last string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil || slices.ContainsFunc(entries, func(e os.DirEntry) bool { return !removable(e.Name()) }) {
		return err
	}
	for _, e := range entries {
		if e.Name() != last {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	if err := os.Remove(filepath.Join(dir, last)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return os.Remove(dir)
}
