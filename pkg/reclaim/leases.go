// Package reclaim finds and releases what reboots, crashes and lost
// namespaces leave behind on a host-local network: leases, bridge's ipMasq
// and portmap's NAT rules, and the wrapper's own records. It only releases
// what the staleness rules prove dead, and always under host-local's lock.
package reclaim

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containernetworking/plugins/plugins/ipam/host-local/backend/disk"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/internal/statefile"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/records"
)

// maxLeaseSize bounds what is read of a lease file: host-local writes
// "<containerID>\r\n<ifname>", far below this.
const maxLeaseSize = 4096

// Lease is one host-local reservation file.
type Lease struct {
	IP   net.IP
	Path string
	// Key is the attachment holding it. A lease written by host-local before
	// it recorded ifnames has an empty IfName.
	Key     records.Key
	ModTime time.Time
	// content is the file's trimmed content, what disk.Store matches on.
	content string
}

// leaseDir is what one read of a host-local network directory found.
type leaseDir struct {
	leases []Lease
	// damaged holds the trimmed content of reservation files that are not
	// valid leases; a sweep must leave them where they are.
	damaged []string
	// unreadable is set when some reservation file could not be read in
	// full, so its content is unknown.
	unreadable bool
	// skipped counts leases not read because a live record claims them.
	skipped  int
	problems []error
}

// readLeases reads every reservation in a host-local network directory,
// one open per file. Files that are not reservations (lock,
// last_reserved_ip.N) are skipped silently; damaged ones are skipped and
// reported as problems.
//
// A file named after an address in claimed is not read: a live record says
// whose it is, and a sweep keeps it either way. That makes the common sweep
// (nothing stale) read records only. Whoever is about to release must read
// the directory again in full (claimed nil): GC's keep list needs every
// file's content.
func readLeases(dir string, claimed map[string]records.Key) (*leaseDir, error) {
	d := &leaseDir{}
	df, err := os.Open(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return d, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list leases in %s: %w", dir, err)
	}
	defer df.Close()
	dirfd := int(df.Fd())
	err = statefile.EachDirEntry(df, func(e fs.DirEntry) {
		name := e.Name()
		if name == "lock" || strings.HasPrefix(name, "last_reserved_ip.") {
			return // host-local's own, never a reservation
		}
		path := filepath.Join(dir, name)
		ip := net.ParseIP(name)
		if !e.Type().IsRegular() {
			// disk.Store skips these too; nothing here removes them.
			d.problems = append(d.problems, fmt.Errorf("%s: not a regular file", path))
			return
		}
		if k, ok := claimed[name]; ok && ip != nil {
			d.leases = append(d.leases, Lease{IP: ip, Path: path, Key: k})
			d.skipped++
			return
		}
		// host-local treats every other regular file as a reservation, so
		// each one is read, even if its name is not an address, and a
		// damaged one is reported.
		l, content, err := readLease(dirfd, dir, name)
		switch {
		case err == nil && ip != nil:
			l.IP = ip
			d.leases = append(d.leases, l)
		case err == nil || content != nil:
			if content == nil {
				content = &l.content
			}
			d.damaged = append(d.damaged, *content)
			if err == nil {
				err = fmt.Errorf("%s: not named after an address", path)
			}
			d.problems = append(d.problems, err)
		default:
			d.unreadable = true
			d.problems = append(d.problems, err)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("list leases in %s: %w", dir, err)
	}
	return d, nil
}

// readLease reads one reservation, name in dir open as dirfd (or, with
// unix.AT_FDCWD and dir "", the path name). When the file was read in full but is
// not a valid lease, its trimmed content is returned with the error.
func readLease(dirfd int, dir, name string) (Lease, *string, error) {
	path := filepath.Join(dir, name)
	b, st, err := statefile.ReadSmallFileAt(dirfd, dir, name, maxLeaseSize, true)
	if err != nil {
		return Lease{}, nil, fmt.Errorf("read lease: %w", err)
	}
	key, content, err := parseLease(b)
	if err != nil {
		trimmed := strings.TrimSpace(string(b))
		return Lease{}, &trimmed, fmt.Errorf("lease %s: %w", path, err)
	}
	return Lease{Path: path, Key: key, ModTime: time.Unix(st.Mtim.Unix()), content: content}, nil, nil
}

// parseLease decodes host-local's "<containerID>\r\n<ifname>" (or the older
// "<containerID>"), trimmed the way disk.Store trims before matching.
func parseLease(b []byte) (records.Key, string, error) {
	content := strings.TrimSpace(string(b))
	if content == "" {
		return records.Key{}, "", errors.New("empty")
	}
	cid, ifname, _ := strings.Cut(content, disk.LineBreak)
	if cid == "" || cid != strings.TrimSpace(cid) || strings.ContainsAny(cid, "\r\n\x00") || strings.ContainsAny(ifname, "\r\n\x00") {
		return records.Key{}, "", fmt.Errorf("not a host-local reservation: %q", truncate(content))
	}
	return records.Key{ContainerID: cid, IfName: ifname}, content, nil
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
