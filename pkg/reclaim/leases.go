// Package reclaim finds and releases what reboots, crashes and lost
// namespaces leave behind on a host-local network: leases, bridge's ipMasq
// and portmap's NAT rules, and the wrapper's own records. It only releases
// what the staleness rules prove dead, and always under host-local's lock.
package reclaim

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/internal/crashpoint"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/internal/statefile"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
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

// leaseDir is a host-local network directory, open once: its reservations
// are looked at and removed relative to it (fstatat, unlinkat), with no
// walk of the whole path per file, which a sweep over thousands would
// pay. A nil leaseDir is a directory that does not exist: no lease.
type leaseDir struct {
	path string
	f    *os.File
}

func openLeaseDir(path string) (*leaseDir, error) {
	f, err := statefile.OpenDir(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list leases in %s: %w", path, err)
	}
	return &leaseDir{path: path, f: f}, nil
}

func (d *leaseDir) close() {
	if d != nil {
		d.f.Close()
	}
}

// read reads the lease named after ip.
func (d *leaseDir) read(ip net.IP) (Lease, error) {
	if d == nil {
		return Lease{}, fs.ErrNotExist
	}
	l, err := readLease(filepath.Join(d.path, ip.String()))
	l.IP = ip
	return l, err
}

// holds reports whether a regular file is named after ip, without reading
// it (never following a symlink), and gives the file's path.
func (d *leaseDir) holds(ip net.IP) (path string, ok bool) {
	if d == nil {
		return "", false
	}
	name := ip.String()
	var st unix.Stat_t
	err := unix.Fstatat(int(d.f.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW)
	return d.path + "/" + name, err == nil && st.Mode&unix.S_IFMT == unix.S_IFREG
}

// each calls fn with every reservation of the directory, read one at a
// time, except those skip (when set) turns down by address, unread.
// host-local's bookkeeping (lock, last_reserved_ip.N) is passed over; it
// treats every other regular file as a reservation, so each is read, and
// damaged ones are reported to bad and never to fn.
func (d *leaseDir) each(skip func([16]byte) bool, fn func(Lease), bad func(error)) error {
	if d == nil {
		return nil
	}
	// From its start: the directory is read more than once.
	if _, err := d.f.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("list leases in %s: %w", d.path, err)
	}
	err := statefile.EachDirEntry(d.f, func(e fs.DirEntry) {
		name := e.Name()
		ip := net.ParseIP(name)
		switch {
		case ipamdir.IsHostLocalBookkeeping(name):
			return
		case !e.Type().IsRegular():
			// disk.Store skips these too; nothing here removes them.
			bad(fmt.Errorf("%s: not a regular file", filepath.Join(d.path, name)))
			return
		case ip != nil && skip != nil && skip(ip16(ip)):
			return
		}
		l, err := readLease(filepath.Join(d.path, name))
		switch {
		case errors.Is(err, fs.ErrNotExist):
			// Released since the directory was read.
		case err != nil:
			bad(err)
		case ip == nil:
			bad(fmt.Errorf("%s: not named after an address", l.Path))
		default:
			l.IP = ip
			fn(l)
		}
	})
	if err != nil {
		return fmt.Errorf("list leases in %s: %w", d.path, err)
	}
	return nil
}

// remove removes lease files of the directory, each only if it still is
// the file that was read: a regular file (not followed if a symlink) with
// the same content, "" for an empty one (EmptyLeaseError). The caller
// holds host-local's lock.
func (d *leaseDir) remove(leases []Lease) error {
	if d == nil {
		return nil
	}
	dirfd := int(d.f.Fd())
	var errs []error
	for _, l := range leases {
		name := filepath.Base(l.Path)
		again, err := readLease(filepath.Join(d.path, name))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		var empty *EmptyLeaseError
		if errors.As(err, &empty) {
			again, err = Lease{}, nil // its content is ""
		}
		if err != nil || again.content != l.content {
			errs = append(errs, fmt.Errorf("lease %s changed since it was read; left in place", l.Path))
			continue
		}
		crashpoint.Step("unlink lease " + l.Path)
		if err := unix.Unlinkat(dirfd, name, 0); err != nil && err != unix.ENOENT {
			errs = append(errs, fmt.Errorf("release lease %s: %w", l.Path, err))
		}
	}
	return errors.Join(errs...)
}

// names reports whether l names key, or its container alone (a lease
// written before host-local recorded ifnames, which host-local matches by
// the container ID).
func (l Lease) names(key records.Key) bool {
	return l.Key == key || l.Key == records.Key{ContainerID: key.ContainerID}
}

// naming are the directory's leases that name key. Damaged files are
// passed over: a sweep reports them.
func (d *leaseDir) naming(key records.Key) ([]Lease, error) {
	var mine []Lease
	err := d.each(nil, func(l Lease) {
		if l.names(key) {
			mine = append(mine, l)
		}
	}, func(error) {})
	return mine, err
}

// EmptyLeaseError is a lease file with nothing in it. host-local creates
// a lease (O_EXCL) and writes it under its lock: one found empty by a
// holder of that lock is a write its host-local died in (killed with the
// runtime, by the OOM killer), which names nobody and which no DEL
// releases (see sweep.leaseProblem).
type EmptyLeaseError struct{ Path string }

func (e *EmptyLeaseError) Error() string { return "lease " + e.Path + ": empty" }

func readLease(path string) (Lease, error) {
	b, fi, err := statefile.ReadSmall(path, maxLeaseSize)
	if err != nil {
		return Lease{}, fmt.Errorf("read lease: %w", err)
	}
	cid, ifName, content, err := ipamdir.ParseLease(b)
	if errors.Is(err, ipamdir.ErrEmptyLease) {
		return Lease{}, &EmptyLeaseError{Path: path}
	}
	if err != nil {
		return Lease{}, fmt.Errorf("lease %s: %w", path, err)
	}
	return Lease{Path: path, Key: records.Key{ContainerID: cid, IfName: ifName}, ModTime: fi.ModTime(), content: content}, nil
}
