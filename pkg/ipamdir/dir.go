// Package ipamdir owns the on-disk layout of a network under the plugin's
// data directory, as host-local's backend/disk owns its directory:
//
//	<dataDir>/<network>/                    host-local's leases and its lock
//	<dataDir>/.nomad-bridge-cni/<network>/  the plugin's records and markers
//
// Everything else asks a Dir for a path, for its safety check or for
// host-local's lock, rather than joining names itself.
package ipamdir

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/containernetworking/cni/pkg/utils"
	"github.com/containernetworking/plugins/plugins/ipam/host-local/backend/disk"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/internal/statefile"
)

// RecordDirName is the plugin's directory under the data directory. A CNI
// network name must start with [a-zA-Z0-9], so no host-local network
// directory can ever be called this; and host-local never looks outside
// <dataDir>/<network>.
const RecordDirName = ".nomad-bridge-cni"

const (
	// DefaultDataDir is tmpfs on every systemd distribution (/var/run -> /run),
	// and where Nomad points its own bridge's host-local since 1.9.4
	// (client/allocrunner/cni/bridge.go, #24650; 1.8.8 and 1.7.16
	// Enterprise); v1.9.3 and earlier leave host-local's own default.
	DefaultDataDir = "/var/run/cni"
	// DefaultLegacyDataDir is host-local's own default, where leases written
	// before adoption live.
	DefaultLegacyDataDir = "/var/lib/cni/networks"
)

// Dir is one network's place under a data directory.
type Dir struct {
	DataDir string
	Network string
}

// New names network's directories under dataDir; nothing is created.
func New(dataDir, network string) Dir { return Dir{DataDir: dataDir, Network: network} }

// Leases is host-local's directory of the network.
func (d Dir) Leases() string { return filepath.Join(d.DataDir, d.Network) }

// IsHostLocalBookkeeping reports whether name, in a network's lease
// directory, is one of host-local's files that are not a reservation: its
// lock and its last_reserved_ip.<range> files.
func IsHostLocalBookkeeping(name string) bool {
	return name == LockFileName || strings.HasPrefix(name, lastReservedPrefix)
}

// lastReservedPrefix starts host-local's file of the last address it handed
// out of each range.
const lastReservedPrefix = "last_reserved_ip."

// Lease is the path of the lease of ip (host-local names a lease after
// its address).
func (d Dir) Lease(ip net.IP) string { return filepath.Join(d.Leases(), ip.String()) }

// LeaseContent is what host-local writes in the lease of an attachment
// (backend/disk: "<containerID>\r\n<ifname>").
func LeaseContent(containerID, ifName string) string {
	return containerID + disk.LineBreak + ifName
}

// ErrEmptyLease is a lease file with nothing in it.
var ErrEmptyLease = errors.New("empty")

// ParseLease decodes host-local's "<containerID>\r\n<ifname>" (or the
// older "<containerID>", with ifName ""), trimmed the way disk.Store trims
// before matching; content is what it matched on.
func ParseLease(b []byte) (containerID, ifName, content string, err error) {
	content = strings.TrimSpace(string(b))
	if content == "" {
		return "", "", "", ErrEmptyLease
	}
	containerID, ifName, _ = strings.Cut(content, disk.LineBreak)
	if containerID == "" || containerID != strings.TrimSpace(containerID) || strings.ContainsAny(containerID, "\r\n\x00") || strings.ContainsAny(ifName, "\r\n\x00") {
		// Its content is not shown: a data dir given by mistake (/etc)
		// must not have the plugin print what its files hold.
		return "", "", "", fmt.Errorf("not a host-local reservation (%d bytes that are not \"<container ID>\\r\\n<ifname>\")", len(b))
	}
	return containerID, ifName, content, nil
}

// RecordName is the file name of an attachment's record,
// "<containerID>@<ifname>": a container ID cannot contain '@' (skel
// enforces the network-name alphabet), so the split is unambiguous, and an
// ifname cannot contain '/'.
func RecordName(containerID, ifName string) string { return containerID + "@" + ifName }

// ParseRecordName is the attachment a record's file name names, if it
// names one.
func ParseRecordName(name string) (containerID, ifName string, ok bool) {
	containerID, ifName, ok = strings.Cut(name, "@")
	return containerID, ifName, ok && containerID != ""
}

// Marker is a file of the plugin's own beside a network's records. Names
// start with '.', which no record's does.
type Marker string

const (
	// MigratedMarker: the boot ID in which legacy leases were migrated.
	MigratedMarker Marker = ".migrated"
	// NotTmpfsWarnedMarker: the boot ID in which the warning that dataDir
	// is not on tmpfs was given.
	NotTmpfsWarnedMarker Marker = ".warned-not-tmpfs"
	// LastSweepMarker: "<boot ID> <unix nanoseconds>" of the end of the
	// network's last sweep.
	LastSweepMarker Marker = ".last-sweep"
	// ReleasesMarker: how many attachments the network's sweeps and
	// re-ADDs released, by cause, as JSON; it lives as long as the records.
	ReleasesMarker Marker = ".releases"
	// OwnedMarker: an ADD through the plugin was made on the network in
	// this data dir, before any NAT rule of it existed. It proves the
	// network's NAT rules are the plugin's to release: a sweep of a
	// wrong, new or empty data dir releases no rule. Its content does not
	// matter, and it is kept across boots.
	OwnedMarker Marker = ".owned"
	// UnlistedMarker is `gc --runtime`'s memory: since when each
	// attachment has been missing from the runtime's list.
	UnlistedMarker Marker = ".unlisted"
	// RememberedMarker: the addresses of attachments a sweep released
	// because their namespace died, which their restore asks for again.
	RememberedMarker Marker = ".remembered"
	// NATCheckedMarker: the boot and NAT ruleset state (netfilter's
	// RulesetState) in which a sweep's listing found no orphan rule.
	NATCheckedMarker Marker = ".nat-checked"
)

// Marker is the path of one of the network's markers.
func (d Dir) Marker(m Marker) string { return filepath.Join(d.Records(), string(m)) }

// Records is the plugin's record directory of the network.
func (d Dir) Records() string { return filepath.Join(d.DataDir, RecordDirName, d.Network) }

// Served reports whether host-local or the plugin ever kept anything of
// the network here: its lease or its record directory is there.
func (d Dir) Served() bool { return statefile.Exists(d.Leases()) || statefile.Exists(d.Records()) }

// Check refuses directories someone else could have planted: the data
// directory itself (its last component: /var/run is a symlink to /run on
// most distributions, which is fine), host-local's network directory and
// the record directories must each be a real directory, not a symlink,
// and owned by the user the plugin runs as. Missing ones are fine: they
// are created with the right owner. Run it before touching anything.
func (d Dir) Check() error {
	for _, dir := range []string{d.DataDir, d.Leases(), filepath.Join(d.DataDir, RecordDirName), d.Records()} {
		if err := checkOwnDir(dir); err != nil {
			return err
		}
	}
	return nil
}

func checkOwnDir(dir string) error {
	fi, err := os.Lstat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("inspect %s: %w", dir, err)
	}
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		return fmt.Errorf("refusing %s: it is a symlink (a directory the plugin writes must not point elsewhere)", dir)
	case !fi.IsDir():
		return fmt.Errorf("refusing %s: it is not a directory", dir)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("refusing %s: owned by uid %d, not by uid %d that runs the plugin", dir, st.Uid, os.Geteuid())
	}
	return nil
}

// ErrNotServed is why List refuses an only network that holds nothing
// under the data dir.
var ErrNotServed = errors.New("no leases or records")

// List names the networks under dataDir — host-local's directories and the
// record directories, by valid CNI network name — each checked as the CNI
// verbs check it. A network that fails the check is left out, with why in
// skipped, so that one bad directory does not keep the others from being
// swept. With only set, it is that one network, which must exist and pass.
func List(dataDir, only string) (dirs []Dir, skipped []error, err error) {
	if dataDir == "" {
		return nil, nil, errors.New("no data dir given (--data-dir is empty)")
	}
	fi, err := os.Stat(dataDir)
	if err != nil {
		return nil, nil, fmt.Errorf("data dir: %w", err)
	}
	if !fi.IsDir() {
		return nil, nil, fmt.Errorf("data dir %s is not a directory", dataDir)
	}
	if only != "" {
		if e := utils.ValidateNetworkName(only); e != nil {
			return nil, nil, fmt.Errorf("network %q: %s", only, e.Msg)
		}
		d := New(dataDir, only)
		if !d.Served() {
			return nil, nil, fmt.Errorf("network %q: %w under %s", only, ErrNotServed, dataDir)
		}
		if err := d.Check(); err != nil {
			return nil, nil, fmt.Errorf("network %s: unsafe data directory: %w", only, err)
		}
		return []Dir{d}, nil, nil
	}
	// What every network shares fails them all.
	for _, dir := range []string{dataDir, filepath.Join(dataDir, RecordDirName)} {
		if err := checkOwnDir(dir); err != nil {
			return nil, nil, fmt.Errorf("unsafe data directory: %w", err)
		}
	}
	names, err := networkNames(dataDir)
	if err != nil {
		return nil, nil, err
	}
	if len(names) == 0 && looksLikeHostLocal(dataDir) {
		return nil, nil, fmt.Errorf("%s is host-local's directory of one network, not a data dir: give its parent", dataDir)
	}
	if len(names) == 0 && !statefile.Exists(filepath.Join(dataDir, RecordDirName)) {
		if entries, _ := os.ReadDir(dataDir); len(entries) > 0 {
			return nil, nil, fmt.Errorf("%s is not a data dir: it has no %s directory of the plugin's, and none of its directories looks like host-local's (a lock, leases named by address)", dataDir, RecordDirName)
		}
	}
	dirs = make([]Dir, 0, len(names))
	for _, n := range names {
		d := New(dataDir, n)
		if err := d.Check(); err != nil {
			skipped = append(skipped, fmt.Errorf("network %s skipped: unsafe data directory: %w", n, err))
			continue
		}
		dirs = append(dirs, d)
	}
	return dirs, skipped, nil
}

// networkNames lists the networks under dataDir: those with a record
// directory, and those whose directory looks like host-local's. Other
// directories are not networks: a data dir given by mistake (/etc, /) is
// not swept, and nothing is created in its directories.
func networkNames(dataDir string) ([]string, error) {
	var names []string
	for _, dir := range []string{dataDir, filepath.Join(dataDir, RecordDirName)} {
		entries, err := os.ReadDir(dir)
		if err != nil && dir == dataDir {
			return nil, fmt.Errorf("read data dir: %w", err)
		}
		for _, e := range entries {
			if !e.IsDir() || strings.HasPrefix(e.Name(), ".") || utils.ValidateNetworkName(e.Name()) != nil {
				continue
			}
			if dir == dataDir && !looksLikeHostLocal(filepath.Join(dir, e.Name())) {
				continue
			}
			names = append(names, e.Name())
		}
	}
	slices.Sort(names)
	return slices.Compact(names), nil
}

// looksLikeHostLocal reports whether dir looks like host-local's directory
// of a network: among its first entries, its lock, a last_reserved_ip.N
// file or a file named by an address, each a regular file. host-local creates the lock on its
// first run and never removes it.
func looksLikeHostLocal(dir string) bool {
	f, err := statefile.OpenDir(dir)
	if err != nil {
		return false
	}
	defer f.Close()
	entries, _ := f.ReadDir(hostLocalProbe)
	for _, e := range entries {
		n := e.Name()
		// Regular files only: /run/lock is a directory.
		if e.Type().IsRegular() && (IsHostLocalBookkeeping(n) || net.ParseIP(n) != nil) {
			return true
		}
	}
	return false
}

// hostLocalProbe bounds the entries looksLikeHostLocal reads of a
// directory: a network's lock or a lease is among the first of a real one.
const hostLocalProbe = 64
