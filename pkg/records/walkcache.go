package records

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/internal/crashpoint"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/internal/statefile"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
)

// A walk of a network's records costs three system calls per record
// (openat, read, close), most of a CHECK's sweep over a full bridge. Yet
// almost every record a sweep reads is the one the sweep before read: a
// record is never changed in place, only replaced by a rename (Write), and
// on tmpfs — where the data dir belongs — an inode number is never given
// twice in a mount's life. So the walk keeps, in walkCacheName, the bytes
// of the complete records it read, each under its file's name and inode
// number; the next walk of the same directory takes a record from there
// when the directory lists the same name with the same inode number, and
// reads the file otherwise.
//
// The cache is only ever a shortcut to a record's bytes, never a source
// of truth: a file it does not list, or lists with another inode, is read;
// it is written after a walk that read something (atomically, as records
// are); a damaged or foreign one is ignored and replaced. And no sweep
// acts on what it says: a record from the cache that is not judged live
// is read again from its file and judged on that (Record.FromCache), so a
// wrong cache can delay a release but never make one. Off tmpfs (ext4
// gives a removed file's inode number to the next new one) it is neither
// read nor written.

// walkCacheName is the cache's file in the record directory: a name with
// a leading dot is no record's, and the walk passes it over.
const walkCacheName = ".walk-cache"

// walkCacheMax bounds the records the cache holds: a bridge has at most
// 1024 ports, so a network's live records fit with room to spare. A
// directory with more (a leak waiting for its sweep) is read file by file,
// as before the cache, and its walk holds no bytes for the next.
const walkCacheMax = 2048

// walkCacheLimit bounds the cache file: walkCacheMax records of at most a
// few hundred bytes each.
const walkCacheLimit = 4 << 20

// walkCacheMagic starts the file: its format's name and version.
const walkCacheMagic = "nomad-bridge-cni walk cache 1\n"

// cachedRecord is one record file's bytes as a walk read them.
type cachedRecord struct {
	name string
	ino  uint64
	data []byte
}

// walkCache is the cache a walk found: a record's bytes by file name.
type walkCache map[string]cachedRecord

// lookup is the bytes of the record file name with inode ino, if cached.
func (c walkCache) lookup(name string, ino uint64) ([]byte, bool) {
	e, ok := c[name]
	if !ok || e.ino != ino {
		return nil, false
	}
	return e.data, true
}

// loadWalkCache reads the cache of the directory open as dirfd; nil when
// there is none or it cannot be used.
func loadWalkCache(dirfd int, dir string) walkCache {
	b, _, err := statefile.ReadSmallFileAt(dirfd, dir, walkCacheName, walkCacheLimit, statefile.WithStat|statefile.ShortReadEnds)
	if err != nil {
		return nil
	}
	c, ok := decodeWalkCache(b)
	if !ok {
		return nil
	}
	return c
}

// decodeWalkCache parses the cache file: the magic line, the number of
// records on a line, then for each record
// "<inode> <name length> <data length>\n<name><data>\n". Anything else
// (truncation, a name that is not a record's, a duplicate, too many
// records or too large a record) makes the whole file unusable.
func decodeWalkCache(b []byte) (walkCache, bool) {
	rest, ok := bytes.CutPrefix(b, []byte(walkCacheMagic))
	if !ok {
		return nil, false
	}
	var count [1]uint64
	if rest, ok = parseUintsLine(rest, count[:]); !ok || count[0] > walkCacheMax {
		return nil, false
	}
	c := make(walkCache, count[0])
	for len(rest) > 0 {
		var head [3]uint64 // inode, name length, data length
		if rest, ok = parseUintsLine(rest, head[:]); !ok {
			return nil, false
		}
		ino, nameLen, dataLen := head[0], int(head[1]), int(head[2])
		if ino == 0 || head[1] == 0 || head[1] > 255 || head[2] == 0 || head[2] > statefile.DefaultLimit ||
			len(rest) < nameLen+dataLen+1 || rest[nameLen+dataLen] != '\n' {
			return nil, false
		}
		name := string(rest[:nameLen])
		if _, _, ok := ipamdir.ParseRecordName(name); !ok {
			return nil, false
		}
		if _, dup := c[name]; dup || uint64(len(c)) == count[0] {
			return nil, false
		}
		c[name] = cachedRecord{name: name, ino: ino, data: rest[nameLen : nameLen+dataLen : nameLen+dataLen]}
		rest = rest[nameLen+dataLen+1:]
	}
	if uint64(len(c)) != count[0] {
		return nil, false
	}
	return c, true
}

// parseUintsLine parses a line of len(out) decimal numbers separated by
// single spaces, and returns what follows the line.
func parseUintsLine(b []byte, out []uint64) ([]byte, bool) {
	i := 0
	for k := range out {
		start := i
		var n uint64
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			if i-start == 19 {
				return nil, false // more than a uint64 need not be parsed
			}
			n = n*10 + uint64(b[i]-'0')
			i++
		}
		sep := byte(' ')
		if k == len(out)-1 {
			sep = '\n'
		}
		if i == start || i == len(b) || b[i] != sep {
			return nil, false
		}
		out[k] = n
		i++
	}
	return b[i:], true
}

// encodeWalkCache is the file decodeWalkCache reads.
func encodeWalkCache(recs []cachedRecord) []byte {
	size := len(walkCacheMagic) + 8
	for _, r := range recs {
		size += 48 + len(r.name) + len(r.data)
	}
	b := make([]byte, 0, size)
	b = append(b, walkCacheMagic...)
	b = strconv.AppendInt(b, int64(len(recs)), 10)
	b = append(b, '\n')
	for _, r := range recs {
		b = strconv.AppendUint(b, r.ino, 10)
		b = append(b, ' ')
		b = strconv.AppendInt(b, int64(len(r.name)), 10)
		b = append(b, ' ')
		b = strconv.AppendInt(b, int64(len(r.data)), 10)
		b = append(b, '\n')
		b = append(b, r.name...)
		b = append(b, r.data...)
		b = append(b, '\n')
	}
	return b
}

// cacheable says whether a walk keeps r's bytes for the next: a complete
// or migrated record with addresses, which only a DEL or a new ADD (a new
// file) changes. A pending record is read every time: its ADD is under way.
func cacheable(r *Record) bool {
	return (r.State == Complete || r.State == Migrated) && len(r.IPs) > 0
}

// saveWalkCache replaces the cache of dir with recs, or removes it when
// there is nothing to keep. It is a shortcut only: a failure (a full or
// read-only filesystem) costs the next walk its reads, nothing else, and
// is not reported.
func saveWalkCache(dir string, recs []cachedRecord) {
	path := filepath.Join(dir, walkCacheName)
	if len(recs) == 0 {
		_ = os.Remove(path)
		return
	}
	_ = statefile.WriteFileAtomic(path, encodeWalkCache(recs))
}

// DropCaches removes the walk cache and the NAT cache, as a DEL does
// before it removes a record: no file in the data dir may name a container
// after its DEL (the walk cache holds its record's bytes, the NAT cache its
// ID), and the next sweep writes them anew. A DEL does not take host-local's
// lock for this, so a sweep that read the container before may still write
// a cache naming it after; that cache is out of date (its record or its
// ruleset generation is gone) and the next sweep replaces it. A missing
// cache is not an error.
func (s *Store) DropCaches() error {
	crashpoint.Step("remove walk cache of " + s.network)
	if err := removeIfPresent(filepath.Join(s.dir, walkCacheName)); err != nil {
		return fmt.Errorf("remove walk cache of %s: %w", s.network, err)
	}
	return s.dropNATCache()
}
