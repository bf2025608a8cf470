package statefile

import (
	"encoding/binary"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// EachDirBatchIno gives what os.ReadDir gives (names, types), the inode
// numbers lstat gives, in sorted batches of at most 1024.
func TestEachDirBatchInoAgreesWithReadDirAndLstat(t *testing.T) {
	dir := t.TempDir()
	for i := range 1500 {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%04d", 1499-i)), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var got []DirEnt
	batches := 0
	err = EachDirBatchIno(f, func(batch []DirEnt) {
		batches++
		if len(batch) > 1024 {
			t.Errorf("batch of %d entries", len(batch))
		}
		if !slices.IsSortedFunc(batch, func(a, b DirEnt) int { return strings.Compare(a.Name(), b.Name()) }) {
			t.Error("batch not sorted by name")
		}
		got = append(got, batch...) // the batch's slice is reused: copy the values
	})
	if err != nil {
		t.Fatal(err)
	}
	if batches != 2 {
		t.Errorf("%d batches for %d entries, want 2", batches, len(want))
	}
	slices.SortFunc(got, func(a, b DirEnt) int { return strings.Compare(a.Name(), b.Name()) })
	if len(got) != len(want) {
		t.Fatalf("%d entries, want %d", len(got), len(want))
	}
	for i, e := range got {
		if e.Name() != want[i].Name() || e.Type() != want[i].Type() {
			t.Errorf("entry %d = %s %v, want %s %v", i, e.Name(), e.Type(), want[i].Name(), want[i].Type())
		}
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(dir, e.Name()), &st); err != nil || st.Ino != e.Ino() {
			t.Errorf("%s: inode %d, lstat says %d (%v)", e.Name(), e.Ino(), st.Ino, err)
		}
	}
}

func TestParseDirentRefusesWhatIsCutShort(t *testing.T) {
	rec := make([]byte, 24)
	binary.NativeEndian.PutUint64(rec[0:], 42)
	binary.NativeEndian.PutUint16(rec[16:], 24)
	rec[18] = unix.DT_REG
	copy(rec[19:], "name\x00")
	e, n, ok := parseDirent(rec)
	if !ok || n != 24 || e.Name() != "name" || e.Ino() != 42 || e.Type() != 0 {
		t.Fatalf("parseDirent = %+v, %d, %v", e, n, ok)
	}
	for _, b := range [][]byte{rec[:18], rec[:23]} {
		if _, _, ok := parseDirent(b); ok {
			t.Errorf("parseDirent took %d bytes of a 24-byte record", len(b))
		}
	}
	short := slices.Clone(rec)
	binary.NativeEndian.PutUint16(short[16:], 10)
	if _, _, ok := parseDirent(short); ok {
		t.Error("parseDirent took a record length shorter than its header")
	}
	unknown := slices.Clone(rec)
	unknown[18] = unix.DT_UNKNOWN
	if e, _, _ := parseDirent(unknown); e.Type() != fs.ModeIrregular {
		t.Errorf("DT_UNKNOWN read as %v", e.Type())
	}
}

// WithStat sizes the buffer to the file: a file larger than the default
// first buffer comes back whole, in one allocation.
func TestReadSmallFileAtWithStatReadsALargeFileWhole(t *testing.T) {
	path := filepath.Join(t.TempDir(), "big")
	want := []byte(strings.Repeat("0123456789abcdef", 40000))
	if err := os.WriteFile(path, want, 0o600); err != nil {
		t.Fatal(err)
	}
	var got []byte
	allocs := testing.AllocsPerRun(5, func() {
		b, st, err := ReadSmallFileAt(unix.AT_FDCWD, "", path, 1<<20, WithStat|ShortReadEnds)
		if err != nil || st == nil {
			t.Fatal(err)
		}
		got = b
	})
	if string(got) != string(want) {
		t.Errorf("read %d bytes, want %d", len(got), len(want))
	}
	if allocs > 4 {
		t.Errorf("%v allocations to read a %d-byte file, want a buffer of its size", allocs, len(want))
	}
}
