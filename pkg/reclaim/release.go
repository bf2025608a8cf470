package reclaim

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

	"golang.org/x/sys/unix"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/records"
)

// releaseLeases removes the lease files of the stale attachments, each by
// its own path once its content is checked again (removeLeaseFile), with
// the caller holding host-local's lock. Damaged or unreadable files are not
// in dir.leases and stay.
func releaseLeases(dir *leaseDir, stale map[records.Key]bool) error {
	var errs []error
	for _, l := range dir.leases {
		if stale[l.Key] {
			if err := removeLeaseFile(l); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// removeLeaseFile removes one lease file if it still is the file that was
// read: a regular file (not followed if a symlink) with the same content.
func removeLeaseFile(l Lease) error {
	again, _, err := readLease(unix.AT_FDCWD, "", l.Path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil || again.content != l.content {
		return fmt.Errorf("lease %s changed since it was read; left in place", l.Path)
	}
	if err := os.Remove(l.Path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("release lease %s: %w", l.Path, err)
	}
	return nil
}
