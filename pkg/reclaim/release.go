package reclaim

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/plugins/ipam/host-local/backend/disk"
	"golang.org/x/sys/unix"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/records"
)

// releaseLeases removes the leases of the stale attachments, with the
// caller holding host-local's lock.
//
// The usual path is one disk.Store.GC pass with everything else as the
// keep list: host-local's own code, and a single directory walk whatever
// the number of stale leases (ReleaseByID walks the whole directory per
// attachment). GC unlocks the store when it returns. It is taken only when
// replaying GC's matching rules over every file read shows it would remove
// exactly the stale leases. Otherwise — a damaged or unreadable file, a
// pre-ifname lease sharing an ID with a kept one — each stale lease file is
// removed by its own path after re-checking its content (never through a
// symlink): disk.Store's ReleaseByKey would walk into directories and
// follow symlinks planted in the lease directory.
func releaseLeases(store *disk.Store, dir *leaseDir, stale map[records.Key]bool) (usedGC bool, err error) {
	var keep, release []string
	var releasePaths []Lease
	for _, l := range dir.leases {
		if stale[l.Key] {
			release = append(release, l.content)
			releasePaths = append(releasePaths, l)
		} else {
			keep = append(keep, l.content)
		}
	}
	if len(release) == 0 {
		return false, nil
	}
	keep = append(keep, dir.damaged...)

	gcList := make([]types.GCAttachment, 0, len(keep))
	for _, content := range keep {
		cid, ifname, _ := strings.Cut(content, disk.LineBreak)
		gcList = append(gcList, types.GCAttachment{ContainerID: cid, IfName: ifname})
	}
	if !dir.unreadable && gcKeepsExactly(gcList, keep, release) {
		if err := store.GC(gcList); err != nil {
			return true, fmt.Errorf("release leases: %w", err)
		}
		return true, nil
	}

	var errs []error
	for _, l := range releasePaths {
		if err := removeLeaseFile(l); err != nil {
			errs = append(errs, err)
		}
	}
	return false, errors.Join(errs...)
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

// gcKeepsExactly replays disk.Store.GC's matching (v1.10.0): a file is kept
// when its trimmed content is "<TrimSpace(id)>\r\n<ifname>" of a listed
// attachment, or, having no line break, equals a listed container ID.
func gcKeepsExactly(list []types.GCAttachment, keep, release []string) bool {
	valid := make(map[string]bool, len(list))
	validLegacy := make(map[string]bool, len(list))
	for _, a := range list {
		id := strings.TrimSpace(a.ContainerID)
		valid[id+disk.LineBreak+a.IfName] = true
		validLegacy[id] = true
	}
	kept := func(content string) bool {
		return valid[content] || (!strings.Contains(content, disk.LineBreak) && validLegacy[content])
	}
	for _, c := range keep {
		if !kept(c) {
			return false
		}
	}
	for _, c := range release {
		if kept(c) {
			return false
		}
	}
	return true
}
