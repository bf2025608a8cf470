// Package records keeps the wrapper's attachment records: one small JSON file
// per container ID + ifname, written before an ADD is delegated, completed
// with the IPs after it returns, and removed after a successful DEL. They
// carry what host-local's lease files do not: which namespace (by inode) and
// which boot an attachment belongs to, so a stale lease is proved, not guessed.
package records

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/internal/crashpoint"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/internal/statefile"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/sysinfo"
)

// FormatVersion is written into every record; a record of another version
// is reported and left alone.
const FormatVersion = 1

// Phase is where a record is in its attachment's life.
type Phase string

const (
	// Started: written before the ADD was delegated ("pending" on disk).
	Started Phase = "pending"
	// Complete: written after the delegated ADD returned.
	Complete Phase = "complete"
	// Migrated: a lease copied from the legacy lease directory at
	// adoption. Its runtime may DEL it through the configuration it cached
	// at ADD (plain bridge, legacy directory), which only releases the
	// legacy copy: so that copy stays, as the sign that the attachment is
	// alive (see LegacyLeases).
	Migrated Phase = "migrated"
)

// Record is one attachment as the wrapper saw it at ADD.
type Record struct {
	Version     int             `json:"version"`
	Network     string          `json:"network"`
	ContainerID string          `json:"containerID"`
	IfName      string          `json:"ifName"`
	Netns       string          `json:"netns"`
	NetnsID     sysinfo.NetnsID `json:"netnsID"`
	// NetnsCookie tells a namespace from a later one that got its inode
	// number (0: the kernel could not say).
	NetnsCookie uint64    `json:"netnsCookie,omitempty"`
	BootID      string    `json:"bootID"`
	Created     time.Time `json:"created"`
	State       Phase     `json:"state"`
	// PID and PIDStart name the ADD process while the record is pending.
	PID      int    `json:"pid,omitempty"`
	PIDStart uint64 `json:"pidStart,omitempty"`
	// Deadline (Unix seconds) is when the pending ADD's processes are
	// overdue: its delegate and rollback bounds have passed. A sweep ends
	// what still runs of it after that, even if the plugin was killed.
	Deadline uint64   `json:"deadline,omitempty"`
	IPs      []string `json:"ips,omitempty"`
	// LegacyLeases are a migrated attachment's lease files in the legacy
	// directory.
	LegacyLeases []string `json:"legacyLeases,omitempty"`
}

// Key identifies an attachment, as in the CNI GC verb.
type Key struct {
	ContainerID string
	IfName      string
}

func (k Key) String() string {
	if k.IfName == "" {
		return k.ContainerID
	}
	return k.ContainerID + "/" + k.IfName
}

// Key returns the record's attachment key.
func (r *Record) Key() Key { return Key{r.ContainerID, r.IfName} }

// Store is the record directory of one network.
type Store struct {
	dir     string
	network string
}

// NewStore names the record directory for network under dataDir; nothing
// is created until the first Write.
func NewStore(d ipamdir.Dir) *Store {
	return &Store{dir: d.Records(), network: d.Network}
}

// Write stores r atomically (statefile.WriteAtomic).
func (s *Store) Write(r *Record) error { return s.write(r, nil) }

// write is Write, calling beforeRename (when set) with the temp file's
// path once it holds the record.
func (s *Store) write(r *Record, beforeRename func(tmp string) error) error {
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return fmt.Errorf("create record directory %s: %w", s.dir, err)
	}
	b, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("encode record %s: %w", r.Key(), err)
	}
	if err := statefile.WriteAtomic(s.PathOf(r.Key()), b, beforeRename); err != nil {
		return fmt.Errorf("store record %s: %w", r.Key(), err)
	}
	return nil
}

// RemoveAbandonedTemps removes the temp files a walk listed (temps: name
// and writer's pid) whose writer died between creating and renaming them
// (kill -9 mid-ADD). A file whose writer's pid is running is kept, even if
// the pid was reused: that only delays it.
func (s *Store) RemoveAbandonedTemps(temps map[string]int, running func(pid int) bool) ([]string, error) {
	var removed []string
	var errs []error
	for name, pid := range temps {
		if running(pid) {
			continue
		}
		path := filepath.Join(s.dir, name)
		crashpoint.Step("remove " + path)
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, path)
	}
	return removed, errors.Join(errs...)
}

// PathOf is the file of k's record, which the processes of its pending
// ADD hold open (WriteLocked).
func (s *Store) PathOf(k Key) string {
	return filepath.Join(s.dir, ipamdir.RecordName(k.ContainerID, k.IfName))
}

// Read returns the record of k, or nil when there is none.
func (s *Store) Read(k Key) (*Record, error) {
	r, err := s.readFile(ipamdir.RecordName(k.ContainerID, k.IfName))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	return r, err
}

// Remove deletes the record of k; a missing record is not an error.
func (s *Store) Remove(k Key) error {
	crashpoint.Step("remove record " + k.String())
	// A read-only filesystem says EROFS even for a file that is not
	// there: nothing to remove is not an error.
	if err := os.Remove(s.PathOf(k)); err != nil && statefile.Exists(s.PathOf(k)) {
		return fmt.Errorf("remove record %s: %w", k, err)
	}
	return nil
}

// Names is EachName keeping the records of k's container ID other than k
// itself (a container attached twice to one network, e.g. eth0 and eth1).
func (s *Store) Names(k Key) (others []Key, temps map[string]int, err error) {
	temps, err = s.EachName(func(o Key) {
		if o.ContainerID == k.ContainerID && o.IfName != k.IfName {
			others = append(others, o)
		}
	})
	return others, temps, err
}

// EachName calls fn with the attachment each record file is named for,
// reading the directory's names once and no record (eachEntry).
func (s *Store) EachName(fn func(Key)) (temps map[string]int, err error) {
	return s.eachEntry(func(e fs.DirEntry) {
		if cid, ifname, ok := ipamdir.ParseRecordName(e.Name()); ok {
			fn(Key{ContainerID: cid, IfName: ifname})
		}
	})
}

// eachEntry calls fn with each entry of the record directory
// (statefile.EachDirEntry) but statefile.WriteAtomic's temp files, which
// it returns, each with its writer's pid (a record being written, whose
// attachment its name does not give); a missing directory holds nothing.
func (s *Store) eachEntry(fn func(fs.DirEntry)) (temps map[string]int, err error) {
	dir, err := statefile.OpenDir(s.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err == nil {
		defer dir.Close()
		err = statefile.EachDirEntry(dir, func(e fs.DirEntry) {
			pid, ok := statefile.TempWriter(e.Name())
			if !ok || !e.Type().IsRegular() {
				fn(e)
				return
			}
			if temps == nil {
				temps = map[string]int{}
			}
			temps[e.Name()] = pid
		})
	}
	if err != nil {
		return nil, fmt.Errorf("list records in %s: %w", s.dir, err)
	}
	return temps, nil
}

// Walk reads the records of the network, calling fn with each, so that a
// sweep holds one record at a time, not the network, and hands each file
// that is not a valid record to damaged, with the attachment its name
// gives, if any (a damaged record must never stop a sweep, nor make it
// release anything, and it may be a live container's): 100 000 planted
// files are never held at once. Records come in name order within each
// batch of the directory (statefile.EachDirEntry).
//
// One record after the other, each read from its file, no cache: the
// sweep over bridge's 1023 live attachments stays within make bench's
// bound (BENCHMARKS.md, "Decisions the numbers made").
func (s *Store) Walk(fn func(*Record), damaged func(err error, k Key, named bool)) (temps map[string]int, err error) {
	bad := func(name string, err error) {
		cid, ifname, named := ipamdir.ParseRecordName(name)
		damaged(err, Key{ContainerID: cid, IfName: ifname}, named)
	}
	return s.eachEntry(func(e fs.DirEntry) {
		name := e.Name()
		switch {
		case strings.HasPrefix(name, "."):
			// A boot marker (.migrated, ...) or a temp file of unknown
			// origin.
		case !e.Type().IsRegular():
			bad(name, fmt.Errorf("record %s: not a regular file", filepath.Join(s.dir, name)))
		default:
			r, err := s.readFile(name)
			switch {
			case errors.Is(err, fs.ErrNotExist):
				// Removed since the directory was read: a DEL.
			case err != nil:
				bad(name, err)
			default:
				fn(r)
			}
		}
	})
}

// readFile reads and decodes the record file name (a missing one is an
// fs.ErrNotExist).
func (s *Store) readFile(name string) (*Record, error) {
	b, err := statefile.ReadFileNoFollow(filepath.Join(s.dir, name))
	if err != nil {
		return nil, fmt.Errorf("read record: %w", err)
	}
	return s.decode(name, b)
}

// decode parses a record and checks it belongs where it was found.
func (s *Store) decode(name string, b []byte) (*Record, error) {
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("record %s: %w", filepath.Join(s.dir, name), err)
	}
	var problem string
	switch {
	case r.Version != FormatVersion:
		problem = fmt.Sprintf("unsupported format version %d", r.Version)
	case r.Network != s.network:
		problem = fmt.Sprintf("belongs to network %q", r.Network)
	case r.ContainerID == "" || r.IfName == "" || name != ipamdir.RecordName(r.ContainerID, r.IfName):
		problem = fmt.Sprintf("names attachment %s", r.Key())
	case r.State != Started && r.State != Complete && r.State != Migrated:
		problem = fmt.Sprintf("unknown state %q", r.State)
	default:
		return &r, nil
	}
	return nil, fmt.Errorf("record %s: %s", filepath.Join(s.dir, name), problem)
}
