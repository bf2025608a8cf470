package ipamdir

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// EnsureDataDir creates the data directory (0700: leases name containers)
// if it is missing. An existing directory keeps its modes.
func (d Dir) EnsureDataDir() error {
	if err := os.MkdirAll(d.DataDir, 0o700); err != nil {
		return fmt.Errorf("create dataDir %s: %w", d.DataDir, err)
	}
	return nil
}

// OnTmpfs reports whether the data directory lives in memory (tmpfs, or
// ramfs), i.e. whether its leases die with the boot, and the filesystem
// magic it found.
func (d Dir) OnTmpfs() (bool, int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(d.DataDir, &st); err != nil {
		return false, 0, fmt.Errorf("statfs dataDir %s: %w", d.DataDir, err)
	}
	return st.Type == unix.TMPFS_MAGIC || st.Type == unix.RAMFS_MAGIC, st.Type, nil
}

// CheckUsable proves the data directory can hold a lease: it exists (or can
// be created), is a directory, and accepts a new file. Writing a probe is
// the only check that also catches read-only mounts and full filesystems.
func (d Dir) CheckUsable() error {
	if err := d.Check(); err != nil {
		return err
	}
	if err := d.EnsureDataDir(); err != nil {
		return err
	}
	fi, err := os.Stat(d.DataDir)
	if err != nil {
		return fmt.Errorf("stat dataDir %s: %w", d.DataDir, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("dataDir %s is not a directory", d.DataDir)
	}
	probe, err := os.CreateTemp(d.DataDir, ".status-probe-*")
	if err != nil {
		return fmt.Errorf("dataDir %s is not writable: %w", d.DataDir, err)
	}
	_, werr := probe.Write([]byte{0})
	return errors.Join(
		wrapIf(werr, "write to dataDir %s", d.DataDir),
		probe.Close(),
		os.Remove(probe.Name()),
	)
}

func wrapIf(err error, format string, args ...any) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf(format+": %w", append(args, err)...)
}
