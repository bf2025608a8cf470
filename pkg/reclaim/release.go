package reclaim

import (
	"errors"
	"fmt"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/plugins/ipam/host-local/backend/disk"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/records"
)

// releaseLeases removes the leases of the stale attachments through
// host-local's own store, with the caller holding its lock.
//
// The fast path is one disk.Store.GC pass with everything else as the keep
// list: a single directory walk whatever the number of stale leases
// (ReleaseByID walks the whole directory per attachment). GC unlocks the
// store when it returns. Before taking it, the keep list is checked against
// GC's own matching rules for every file read; if any kept file would go
// (or any stale one stay) — damaged content, a pre-ifname lease sharing an
// ID with a kept one — it falls back to ReleaseByKey per stale attachment.
func releaseLeases(store *disk.Store, dir *leaseDir, stale map[records.Key]bool) (usedGC bool, err error) {
	var keep, release []string
	for _, l := range dir.leases {
		if stale[l.Key] {
			release = append(release, l.content)
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
	seen := map[string]bool{}
	for _, content := range release {
		if seen[content] {
			continue
		}
		seen[content] = true
		if _, err := store.ReleaseByKey(content); err != nil {
			errs = append(errs, fmt.Errorf("release lease %q: %w", content, err))
		}
	}
	return false, errors.Join(errs...)
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
