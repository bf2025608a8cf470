package statefile

import (
	"encoding/binary"
	"io/fs"
	"os"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// DirEnt is one directory entry as getdents64 gave it: its name, its type
// and its inode number, which os.File.ReadDir does not keep. On tmpfs an
// inode number is never given twice in a mount's life, so a name and an
// inode number together name one file's content for good when that file
// is only ever replaced by a rename (see WriteAtomic).
type DirEnt struct {
	name string
	typ  fs.FileMode
	ino  uint64
}

// Name is the entry's file name.
func (e DirEnt) Name() string { return e.name }

// Type is the entry's type bits (0 for a regular file).
func (e DirEnt) Type() fs.FileMode { return e.typ }

// Ino is the entry's inode number.
func (e DirEnt) Ino() uint64 { return e.ino }

// direntBufSize is getdents64's buffer: a few hundred record names a call.
const direntBufSize = 32 << 10

// EachDirBatchIno is EachDirBatch with inode numbers: fn gets the entries
// of dir 1024 at a time, each batch sorted by name. An entry whose type
// the filesystem does not give (DT_UNKNOWN) is looked at with fstatat;
// one removed meanwhile is left out.
func EachDirBatchIno(dir *os.File, fn func([]DirEnt)) error {
	batch := make([]DirEnt, 0, 1024)
	flush := func() {
		if len(batch) > 0 {
			slices.SortFunc(batch, func(a, b DirEnt) int { return strings.Compare(a.name, b.name) })
			fn(batch)
			batch = batch[:0]
		}
	}
	err := EachDirEnt(dir, func(e DirEnt) {
		if batch = append(batch, e); len(batch) == cap(batch) {
			flush()
		}
	})
	if err == nil {
		flush()
	}
	return err
}

// EachDirEnt calls fn with each entry of dir in the order the filesystem
// lists them, as EachDirBatchIno gives them: for what needs no order (a
// set of names), without the sort and the batch.
func EachDirEnt(dir *os.File, fn func(DirEnt)) error {
	fd := int(dir.Fd())
	buf := make([]byte, direntBufSize)
	for {
		n, err := unix.Getdents(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return &os.PathError{Op: "getdents64", Path: dir.Name(), Err: err}
		}
		if n <= 0 {
			return nil
		}
		for off := 0; off < n; {
			e, reclen, ok := parseDirent(buf[off:n])
			if !ok {
				return &os.PathError{Op: "getdents64", Path: dir.Name(), Err: unix.EBADMSG}
			}
			off += reclen
			if e.ino == 0 || e.name == "." || e.name == ".." {
				continue
			}
			if e.typ == fs.ModeIrregular {
				var st unix.Stat_t
				if err := unix.Fstatat(fd, e.name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
					continue // removed since it was listed
				}
				e.typ = modeOfStat(st.Mode)
			}
			fn(e)
		}
	}
}

// parseDirent reads one linux_dirent64 (u64 d_ino, s64 d_off, u16
// d_reclen, u8 d_type, NUL-terminated d_name) from the front of b.
// fs.ModeIrregular stands for DT_UNKNOWN.
func parseDirent(b []byte) (DirEnt, int, bool) {
	const nameOff = 19
	if len(b) < nameOff {
		return DirEnt{}, 0, false
	}
	reclen := int(binary.NativeEndian.Uint16(b[16:18]))
	if reclen < nameOff || reclen > len(b) {
		return DirEnt{}, 0, false
	}
	name := b[nameOff:reclen]
	if i := slices.Index(name, 0); i >= 0 {
		name = name[:i]
	}
	return DirEnt{
		name: string(name),
		typ:  modeOfDirentType(b[18]),
		ino:  binary.NativeEndian.Uint64(b[0:8]),
	}, reclen, true
}

func modeOfDirentType(t byte) fs.FileMode {
	switch t {
	case unix.DT_REG:
		return 0
	case unix.DT_DIR:
		return fs.ModeDir
	case unix.DT_LNK:
		return fs.ModeSymlink
	case unix.DT_FIFO:
		return fs.ModeNamedPipe
	case unix.DT_SOCK:
		return fs.ModeSocket
	case unix.DT_CHR:
		return fs.ModeDevice | fs.ModeCharDevice
	case unix.DT_BLK:
		return fs.ModeDevice
	}
	return fs.ModeIrregular
}

// modeOfStat is modeOfDirentType for st_mode: a dirent's d_type is its
// file's S_IFMT bits shifted down by 12 (DTTOIF in dirent.h).
func modeOfStat(mode uint32) fs.FileMode {
	return modeOfDirentType(byte(mode & unix.S_IFMT >> 12))
}

// OnTmpfs reports whether the directory open as fd is in memory (see
// InMemory).
func OnTmpfs(fd int) bool {
	var st unix.Statfs_t
	for {
		err := unix.Fstatfs(fd, &st)
		if err == unix.EINTR {
			continue
		}
		return err == nil && InMemory(st.Type)
	}
}

// InMemory is the one answer to "is this a tmpfs": a filesystem of type
// fsType (statfs's f_type) keeps its files in memory, and they die with
// the boot (tmpfs, or ramfs).
func InMemory(fsType int64) bool {
	return fsType == unix.TMPFS_MAGIC || fsType == unix.RAMFS_MAGIC
}
