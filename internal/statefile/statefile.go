// Package statefile reads and writes the plugin's small state files
// (attachment records, boot markers, host-local's leases) the way a root
// process must in a directory others may have planted things in: writes
// are atomic, reads never follow a symlink, never block on a FIFO and
// never read without bound.
package statefile

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

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

// WriteAtomic replaces path with data through a 0600 temp file in the
// same directory and a rename: a reader, or a crash, sees the old content
// or the new, never a mix. beforeRename, when set, is called with the temp
// file's path once it holds data: the last moment nobody else can see the
// file.
func WriteAtomic(path string, data []byte, beforeRename func(tmp string) error) error {
	crashpoint.Step("create temp for " + path)
	tmp, err := os.CreateTemp(filepath.Dir(path), TempPrefix+strconv.Itoa(os.Getpid())+"-")
	if err != nil {
		return err
	}
	_, werr := tmp.Write(data)
	err = errors.Join(werr, tmp.Close())
	if err == nil && beforeRename != nil {
		err = beforeRename(tmp.Name())
	}
	if err == nil {
		crashpoint.Step("rename " + path)
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
	}
	return err
}

// Exists is the one test that something is at path, a link not followed:
// what cannot be inspected counts as there, and whoever reads it next says
// why.
func Exists(path string) bool {
	_, err := os.Lstat(path)
	return !errors.Is(err, fs.ErrNotExist)
}

// ReadFileNoFollow reads a small state file without following a symlink
// planted in its place, and refuses files larger than 64 KiB (a state file
// is a few hundred bytes).
func ReadFileNoFollow(path string) ([]byte, error) {
	b, _, err := ReadSmall(path, 64<<10)
	return b, err
}

// Open opens path read-only without following a symlink planted in its
// place and without blocking on a FIFO planted there (O_NONBLOCK changes
// nothing for a regular file).
func Open(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
}

// OpenDir opens the directory at path to list it, as Open opens a file:
// a symlink planted in its place is not followed, and a FIFO or anything
// else that is not a directory is refused at once, never opened.
func OpenDir(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
}

// ReadSmall reads path, a regular file of at most limit bytes opened as
// Open opens it, and gives its FileInfo.
func ReadSmall(path string, limit int64) ([]byte, fs.FileInfo, error) {
	return readRegular(path, unix.O_NOFOLLOW, limit)
}

// ReadConfig reads a configuration file as its own program reads it,
// through a symlink, and otherwise as ReadSmall reads: never blocking on
// a FIFO, at most limit bytes of a regular file.
func ReadConfig(path string, limit int64) ([]byte, error) {
	b, _, err := readRegular(path, 0, limit)
	return b, err
}

// Regular is the FileInfo of f, an open file, or an error that says what
// f is when it is not a regular file: a FIFO with a writer would block its
// read.
func Regular(f *os.File) (fs.FileInfo, error) {
	fi, err := f.Stat()
	if err == nil && !fi.Mode().IsRegular() {
		err = fmt.Errorf("%s is %s, not a regular file", f.Name(), Kind(fi.Mode()))
	}
	return fi, err
}

// Kind says what a file that is not a regular one is, for an error.
func Kind(m fs.FileMode) string {
	switch {
	case m&fs.ModeSymlink != 0:
		return "a symlink"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeDevice != 0:
		return "a device"
	case m.IsDir():
		return "a directory"
	}
	return "an irregular file"
}

// readRegular reads path as ReadSmall does, following a last-component
// symlink unless nofollow is O_NOFOLLOW.
func readRegular(path string, nofollow int, limit int64) ([]byte, fs.FileInfo, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|nofollow|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	fi, err := Regular(f)
	if err != nil {
		return nil, nil, err
	}
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, nil, fmt.Errorf("read %s: %w", path, err)
	}
	if int64(len(b)) > limit {
		return nil, nil, fmt.Errorf("%s: larger than %d bytes", path, limit)
	}
	return b, fi, nil
}

// Printable is s as it may be printed to an operator's terminal: s itself
// when it holds only graphic characters (letters, marks, numbers,
// punctuation, symbols, spaces), else with every other character, and
// every byte that is not UTF-8, written as a Go escape ("\x1b", "\n",
// "\u202e"). What is read from a file anyone with the data dir can write
// (its name, a container ID or path in it), or a process's name, may hold
// a terminal's escape sequences, or a newline that forges a line.
func Printable(s string) string {
	if utf8.ValidString(s) && !strings.ContainsFunc(s, func(r rune) bool { return !unicode.IsGraphic(r) }) {
		return s
	}
	q := strconv.QuoteToGraphic(s)
	return q[1 : len(q)-1]
}

// PrintableJSON is encoded JSON as it may be printed, as Printable makes a
// string: encoding/json leaves C1 controls and format characters (bidi
// overrides) raw, so every character beyond ASCII that is not graphic is
// written \u-escaped. It can only be inside a string, where the escape
// decodes to it again.
func PrintableJSON(b []byte) []byte {
	if !bytes.ContainsFunc(b, func(r rune) bool { return r >= utf8.RuneSelf && !unicode.IsGraphic(r) }) {
		return b
	}
	var out []byte
	for _, r := range string(b) {
		if r < utf8.RuneSelf || unicode.IsGraphic(r) {
			out = utf8.AppendRune(out, r)
			continue
		}
		for _, u := range utf16.Encode([]rune{r}) {
			out = fmt.Appendf(out, `\u%04x`, u)
		}
	}
	return out
}

// InMemory is the one answer to "is this a tmpfs": a filesystem of type
// fsType (statfs's f_type) keeps its files in memory, and they die with
// the boot (tmpfs, or ramfs).
func InMemory(fsType int64) bool {
	return fsType == unix.TMPFS_MAGIC || fsType == unix.RAMFS_MAGIC
}

// EachDirEntry calls fn for every entry of dir, read 1024 at a time, so a
// network of 65534 leases does not hold 65534 DirEntry values at once.
// Each batch is sorted by name: what is printed from a directory (leases,
// gc) comes in the same order on every filesystem, fully sorted up to
// 1024 entries.
func EachDirEntry(dir *os.File, fn func(fs.DirEntry)) error {
	for {
		entries, err := dir.ReadDir(1024)
		slices.SortFunc(entries, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
		for _, e := range entries {
			fn(e)
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}
