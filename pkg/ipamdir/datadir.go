package ipamdir

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/internal/statefile"
)

// OnTmpfs reports whether the data directory lives in memory (tmpfs, or
// ramfs), i.e. whether its leases die with the boot, and the filesystem
// magic it found.
func (d Dir) OnTmpfs() (bool, int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(d.DataDir, &st); err != nil {
		return false, 0, fmt.Errorf("statfs dataDir %s: %w", d.DataDir, err)
	}
	return statefile.InMemory(st.Type), st.Type, nil
}

// CheckUsable tells whether an ADD could keep a lease in the data
// directory, writing nothing: the directory (or, not made yet, the
// nearest directory it would be made in) must be a directory the plugin
// may write. A full or read-only filesystem is not an error but a problem
// (what an ADD would fail on): a DEL works through it, and STATUS, which
// Nomad asks before every teardown and drops the teardown on, must not fail
// for it.
func (d Dir) CheckUsable() (problem string, err error) {
	if err := d.Check(); err != nil {
		return "", err
	}
	dir := d.DataDir
	fi, err := os.Stat(dir)
	for errors.Is(err, os.ErrNotExist) && dir != filepath.Dir(dir) {
		dir = filepath.Dir(dir)
		fi, err = os.Stat(dir)
	}
	switch {
	case err != nil:
		return "", fmt.Errorf("stat %s: %w", dir, err)
	case !fi.IsDir():
		return "", fmt.Errorf("%s is not a directory", dir)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return "", fmt.Errorf("statfs %s: %w", dir, err)
	}
	switch {
	case st.Flags&unix.ST_RDONLY != 0:
		return fmt.Sprintf("%s is on a read-only filesystem", dir), nil
	// A filesystem that counts no inodes (btrfs, tmpfs with nr_inodes=0)
	// reports none free and makes them as it goes.
	case st.Bavail == 0 || (st.Files != 0 && st.Ffree == 0):
		return fmt.Sprintf("%s is on a full filesystem (%d blocks, %d inodes free)", dir, st.Bavail, st.Ffree), nil
	}
	if err := unix.Access(dir, unix.W_OK); err != nil {
		return "", fmt.Errorf("%s is not writable: %w", dir, err)
	}
	return "", nil
}
