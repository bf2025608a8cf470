package reclaim

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/records"
)

// releaseLeases removes the lease files of the stale attachments, each
// once its content is checked again (removeLeaseFiles), with the caller
// holding host-local's lock. Damaged or unreadable files are not in
// dir.leases and stay.
func releaseLeases(dir *leaseDir, stale map[records.Key]bool) error {
	var doomed []Lease
	for _, l := range dir.leases {
		if stale[l.Key] {
			doomed = append(doomed, l)
		}
	}
	if len(doomed) == 0 {
		return nil
	}
	return removeLeaseFiles(filepath.Dir(doomed[0].Path), doomed)
}

// removeLeaseFile removes one lease file (see removeLeaseFiles).
func removeLeaseFile(l Lease) error { return removeLeaseFiles(filepath.Dir(l.Path), []Lease{l}) }

// removeLeaseFiles removes lease files of the directory dirPath, each only
// if it still is the file that was read: a regular file (not followed if a
// symlink) with the same content. The directory is opened once and every
// file read and unlinked relative to it: no walk of the whole path per
// lease, which a sweep releasing thousands would pay.
func removeLeaseFiles(dirPath string, leases []Lease) error {
	d, err := os.Open(dirPath)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open lease directory %s: %w", dirPath, err)
	}
	defer d.Close()
	dirfd := int(d.Fd())
	var errs []error
	for _, l := range leases {
		name := filepath.Base(l.Path)
		again, _, err := readLease(dirfd, dirPath, name)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil || again.content != l.content {
			errs = append(errs, fmt.Errorf("lease %s changed since it was read; left in place", l.Path))
			continue
		}
		if err := unix.Unlinkat(dirfd, name, 0); err != nil && err != unix.ENOENT {
			errs = append(errs, fmt.Errorf("release lease %s: %w", l.Path, err))
		}
	}
	return errors.Join(errs...)
}
