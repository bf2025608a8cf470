// Package statefile reads and writes the plugin's small state files
// (attachment records, boot markers, host-local's leases) the way a root
// process must in a directory others may have planted things in: writes
// are atomic, reads never follow a symlink, never block on a FIFO and
// never read without bound.
package statefile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/internal/crashpoint"
)

// TempPrefix starts the temp files of WriteAtomic, followed by the writer's
// pid: a temp file whose writer is gone was abandoned mid-write.
const TempPrefix = ".tmp-"

// TempWriter is the pid of the process that created the temp file name, if
// name is one of WriteAtomic's.
func TempWriter(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, TempPrefix)
	if !ok {
		return 0, false
	}
	pidText, _, _ := strings.Cut(rest, "-")
	pid, err := strconv.Atoi(pidText)
	return pid, err == nil && pid > 0
}

// WriteFileAtomic replaces path with data through a 0600 temp file in the
// same directory and a rename: a reader, or a crash, sees the old content
// or the new, never a mix.
func WriteFileAtomic(path string, data []byte) error { return WriteAtomic(path, data, nil) }

// WriteAtomic is WriteFileAtomic, calling beforeRename (when set) with the
// temp file's path once it holds data: the last moment nobody else can
// see the file.
func WriteAtomic(path string, data []byte, beforeRename func(tmp string) error) error {
	crashpoint.Step("create temp for " + path)
	tmp, err := os.CreateTemp(filepath.Dir(path), TempPrefix+strconv.Itoa(os.Getpid())+"-")
	if err != nil {
		return err
	}
	_, werr := tmp.Write(data)
	if err := errors.Join(werr, tmp.Close()); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	if beforeRename != nil {
		if err := beforeRename(tmp.Name()); err != nil {
			os.Remove(tmp.Name())
			return err
		}
	}
	crashpoint.Step("rename " + path)
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return nil
}

// DefaultLimit bounds what ReadFileNoFollow reads: a state file is a few
// hundred bytes.
const DefaultLimit = 64 << 10

// ReadFileNoFollow reads a small state file without following a symlink
// planted in its place, and refuses files larger than DefaultLimit.
func ReadFileNoFollow(path string) ([]byte, error) {
	b, _, err := ReadSmallFileAt(unix.AT_FDCWD, "", path, DefaultLimit, 0)
	return b, err
}

// OpenAt opens name in the directory open as dirfd (unix.AT_FDCWD for a
// plain path) read-only, without following a symlink and without blocking
// on a FIFO planted in its place (O_NONBLOCK changes nothing for a regular
// file). It returns a raw descriptor: an *os.File costs four fcntl and a
// failing epoll_ctl more per file, which dominates a sweep over thousands
// of tiny files.
func OpenAt(dirfd int, name string) (int, error) {
	for {
		fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
		if err != unix.EINTR {
			return fd, err
		}
	}
}

// ReadMode says how ReadSmallFileAt reads.
type ReadMode uint8

const (
	// WithStat also returns the file's fstat, and reads into a buffer
	// of the file's size.
	WithStat ReadMode = 1 << iota
	// ShortReadEnds takes a read that returns less than asked as the
	// end of the file, saving the read that would return 0. A regular
	// file on a local filesystem (tmpfs, ext4, xfs: where data dirs
	// live) returns less only at its end; a /proc file may return less
	// at any point, so its readers must not set it. For state files whose
	// content is checked when decoded: what is cut short is reported as
	// damaged, never taken for something else.
	ShortReadEnds
)

// ReadSmallFileAt reads name, in the directory dir open as dirfd (openat:
// no walk of the whole path per file; unix.AT_FDCWD and "" for a plain
// path), if it holds at most limit bytes: OpenAt, read until EOF, close,
// and fstat when mode has WithStat. dir only names the file in errors,
// joined when one happens (a Join per file costs 10 % of a sweep).
func ReadSmallFileAt(dirfd int, dir, name string, limit int, mode ReadMode) ([]byte, *unix.Stat_t, error) {
	path := func() string { return filepath.Join(dir, name) }
	fd, err := OpenAt(dirfd, name)
	if err != nil {
		return nil, nil, &os.PathError{Op: "open", Path: path(), Err: err}
	}
	defer unix.Close(fd)
	var st *unix.Stat_t
	if mode&WithStat != 0 {
		st = &unix.Stat_t{}
		if err := unix.Fstat(fd, st); err != nil {
			return nil, nil, &os.PathError{Op: "fstat", Path: path(), Err: err}
		}
	}
	size := 512
	if st != nil && st.Size >= 0 && st.Size < int64(limit) {
		// One allocation and (with ShortReadEnds) one read: growing from
		// 512 bytes costs a large file dozens of both.
		size = int(st.Size) + 1
	}
	b := make([]byte, 0, size)
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		want := min(cap(b), limit+1) - len(b)
		n, err := unix.Read(fd, b[len(b):len(b)+want])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, nil, fmt.Errorf("read %s: %w", path(), err)
		}
		if n == 0 {
			return b, st, nil
		}
		b = b[:len(b)+n]
		if len(b) > limit {
			return nil, nil, fmt.Errorf("%s: larger than %d bytes", path(), limit)
		}
		if n < want && mode&ShortReadEnds != 0 {
			return b, st, nil
		}
	}
}

// EachDirEntry calls fn for every entry of dir, read 1024 at a time, so a
// network of 65534 leases does not hold 65534 DirEntry values at once.
// Each batch is sorted by name: what is printed from a directory (leases,
// gc) comes in the same order on every filesystem, fully sorted up to
// 1024 entries.
func EachDirEntry(dir *os.File, fn func(fs.DirEntry)) error {
	return EachDirBatch(dir, func(entries []fs.DirEntry) {
		for _, e := range entries {
			fn(e)
		}
	})
}

// EachDirBatch is EachDirEntry that hands over each sorted batch at once.
func EachDirBatch(dir *os.File, fn func([]fs.DirEntry)) error {
	for {
		entries, err := dir.ReadDir(1024)
		slices.SortFunc(entries, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
		if len(entries) > 0 {
			fn(entries)
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}
