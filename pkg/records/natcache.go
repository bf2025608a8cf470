package records

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/internal/crashpoint"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/internal/statefile"
	"golang.org/x/sys/unix"
)

// A sweep of an owned network probes its NAT rules for their owners (the
// container IDs its rules name) on every run, and a probe of a full
// bridge's rules is a netlink dump of thousands of rules. nftables counts
// its commits, so a sweep can keep the owners it probed, under a key that
// names the ruleset they were read from (reclaim makes it: boot, network
// namespace, generation), and take them from here when the key is the
// same. Like the walk cache it is a shortcut only: what it names is only
// ever probed again, listed with iptables before anything goes; a
// damaged, planted or other-version file is ignored and replaced. A DEL
// removes it with the walk cache (DropCaches): no file names a container
// after its DEL.

// natCacheName is the file, next to the walk cache.
const natCacheName = ".nat-cache"

// natCacheMagic starts the file: its format's name and version.
const natCacheMagic = "nomad-bridge-cni nat cache 1\n"

// natCacheLimit bounds the file: a few thousand quoted container IDs.
const natCacheLimit = 1 << 20

// LoadNATCache is the owners the last probe kept under key; ok is false
// when the file is missing, damaged, or kept under another key.
func (s *Store) LoadNATCache(key string) (owners []string, ok bool) {
	b, _, err := statefile.ReadSmallFileAt(unix.AT_FDCWD, s.dir, filepath.Join(s.dir, natCacheName), natCacheLimit, statefile.WithStat|statefile.ShortReadEnds)
	if err != nil {
		return nil, false
	}
	return decodeNATCache(b, key)
}

// decodeNATCache parses the magic line, the Go-quoted key on a line, then
// one Go-quoted owner per line.
func decodeNATCache(b []byte, key string) ([]string, bool) {
	rest, ok := bytes.CutPrefix(b, []byte(natCacheMagic))
	if !ok {
		return nil, false
	}
	var lines []string
	for len(rest) > 0 {
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			return nil, false
		}
		v, err := strconv.Unquote(string(rest[:i]))
		if err != nil {
			return nil, false
		}
		lines, rest = append(lines, v), rest[i+1:]
	}
	if len(lines) == 0 || lines[0] != key {
		return nil, false
	}
	owners := lines[1:]
	for _, o := range owners {
		if o == "" {
			return nil, false
		}
	}
	return owners, true
}

// SaveNATCache keeps owners under key for the next sweep, in a record
// directory that exists. A store made WithoutCacheWrites writes nothing; a
// failure (a full or read-only filesystem) costs the next sweep a probe,
// and is not reported.
func (s *Store) SaveNATCache(key string, owners []string) {
	if s.noCacheWrites || key == "" {
		return
	}
	b := append([]byte(natCacheMagic), strconv.Quote(key)...)
	b = append(b, '\n')
	for _, o := range owners {
		b = strconv.AppendQuote(b, o)
		b = append(b, '\n')
	}
	// Only where the network has records: a sweep of another data dir
	// (gc --orphan-rules on a bare bridge's) creates nothing there.
	if fi, err := os.Lstat(s.dir); err != nil || !fi.IsDir() {
		return
	}
	_ = statefile.WriteFileAtomic(filepath.Join(s.dir, natCacheName), b)
}

// dropNATCache removes the NAT cache (DropCaches).
func (s *Store) dropNATCache() error {
	crashpoint.Step("remove NAT cache of " + s.network)
	if err := removeIfPresent(filepath.Join(s.dir, natCacheName)); err != nil {
		return fmt.Errorf("remove NAT cache of %s: %w", s.network, err)
	}
	return nil
}
