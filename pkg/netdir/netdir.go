// Package netdir owns the on-disk layout of a network under the plugin's
// data directory, as host-local's backend/disk owns its directory:
//
//	<dataDir>/<network>/                    host-local's leases and its lock
//	<dataDir>/.nomad-bridge-cni/<network>/  the plugin's records and markers
//
// Everything else asks a Dir for a path, for its safety check or for
// host-local's lock, rather than joining names itself.
package netdir

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"github.com/containernetworking/cni/pkg/utils"
)

// RecordDirName is the plugin's directory under the data directory. A CNI
// network name must start with [a-zA-Z0-9], so no host-local network
// directory can ever be called this; and host-local never looks outside
// <dataDir>/<network>.
const RecordDirName = ".nomad-bridge-cni"

// Dir is one network's place under a data directory.
type Dir struct {
	DataDir string
	Network string
}

// New names network's directories under dataDir; nothing is created.
func New(dataDir, network string) Dir { return Dir{DataDir: dataDir, Network: network} }

// Leases is host-local's directory of the network.
func (d Dir) Leases() string { return filepath.Join(d.DataDir, d.Network) }

// ScratchIPAM is an empty data dir the plugin gives host-local when it must
// not read the network's own directory (a DEL beside planted files):
// host-local creates only <ScratchIPAM>/<network>/lock there. Its name
// starts with a dot, so it is never taken for a network.
func (d Dir) ScratchIPAM() string { return filepath.Join(d.DataDir, RecordDirName, ".scratch-ipam") }

// Records is the plugin's record directory of the network.
func (d Dir) Records() string { return filepath.Join(d.DataDir, RecordDirName, d.Network) }

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
	var names []string
	if only != "" {
		if e := utils.ValidateNetworkName(only); e != nil {
			return nil, nil, fmt.Errorf("network %q: %s", only, e.Msg)
		}
		d := New(dataDir, only)
		if !isDir(d.Leases()) && !isDir(d.Records()) {
			return nil, nil, fmt.Errorf("network %q: no leases or records under %s", only, dataDir)
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
	if names, err = networkNames(dataDir); err != nil {
		return nil, nil, err
	}
	if len(names) == 0 && looksLikeHostLocal(dataDir) {
		return nil, nil, fmt.Errorf("%s is host-local's directory of one network, not a data dir: give its parent", dataDir)
	}
	if len(names) == 0 && !isDir(filepath.Join(dataDir, RecordDirName)) && !isEmptyDir(dataDir) {
		return nil, nil, fmt.Errorf("%s is not a data dir: it has no %s directory of the plugin's, and none of its directories looks like host-local's (a lock, leases named by address)", dataDir, RecordDirName)
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
	seen := map[string]bool{}
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
			seen[e.Name()] = true
		}
	}
	out := make([]string, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	sort.Strings(out)
	return out, nil
}

// looksLikeHostLocal reports whether dir looks like host-local's directory
// of a network: among its first entries, its lock, a last_reserved_ip.N
// file or a file named by an address, each a regular file. host-local creates the lock on its
// first run and never removes it.
func looksLikeHostLocal(dir string) bool {
	f, err := os.Open(dir)
	if err != nil {
		return false
	}
	defer f.Close()
	entries, _ := f.ReadDir(hostLocalProbe)
	for _, e := range entries {
		n := e.Name()
		// Regular files only: /run/lock is a directory.
		if e.Type().IsRegular() && (n == LockFileName || strings.HasPrefix(n, "last_reserved_ip.") || net.ParseIP(n) != nil) {
			return true
		}
	}
	return false
}

// hostLocalProbe bounds the entries looksLikeHostLocal reads of a
// directory: a network's lock or a lease is among the first of a real one.
const hostLocalProbe = 64

func isEmptyDir(dir string) bool {
	f, err := os.Open(dir)
	if err != nil {
		return false
	}
	defer f.Close()
	names, _ := f.Readdirnames(1)
	return len(names) == 0
}

func isDir(path string) bool {
	fi, err := os.Lstat(path)
	return err == nil && fi.IsDir()
}
