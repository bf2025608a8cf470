package statefile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/dirstate"
)

func TestTempWriter(t *testing.T) {
	for name, want := range map[string]int{".tmp-4242-123": 4242, ".tmp-1-x": 1, ".tmp-0-1": 0, ".tmp-x-1": 0, "c1@eth0": 0, ".migrated": 0} {
		pid, ok := TempWriter(name)
		if pid != want || ok != (want > 0) {
			t.Errorf("TempWriter(%q) = %d, %v; want %d", name, pid, ok, want)
		}
	}
}

func TestWriteAtomic(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rec")
	if err := WriteAtomic(path, []byte("one"), nil); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("written file: %v, %v", fi, err)
	}
	// A failing hook leaves the old content and no temp file.
	boom := errors.New("boom")
	err = WriteAtomic(path, []byte("two"), func(tmp string) error {
		if pid, ok := TempWriter(filepath.Base(tmp)); !ok || pid != os.Getpid() {
			t.Errorf("temp file %s does not name its writer", tmp)
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("WriteAtomic = %v", err)
	}
	if b, _ := os.ReadFile(path); string(b) != "one" {
		t.Errorf("content after a failed write = %q", b)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("left behind: %v", entries)
	}
}

// What a root process must not do in a directory others can plant things
// in: follow a symlink, block on a FIFO (even one a writer holds open),
// read without bound.
func TestReadSmallRefusesWhatWasPlanted(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "target")
	if err := os.WriteFile(target, []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	fifo := dirstate.PlantFIFO(t, filepath.Join(dir, "fifo"))
	writer, err := os.OpenFile(fifo, os.O_RDWR, 0) // a writer that never writes
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Close()
	if err := os.WriteFile(filepath.Join(dir, "big"), []byte(strings.Repeat("x", 100)), 0o600); err != nil {
		t.Fatal(err)
	}
	if b, err := ReadFileNoFollow(target); err != nil || string(b) != "secret" {
		t.Fatalf("plain file: %q, %v", b, err)
	}
	if _, err := ReadFileNoFollow(filepath.Join(dir, "link")); err == nil {
		t.Error("followed a symlink")
	}
	if _, err := ReadFileNoFollow(fifo); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("FIFO: %v", err)
	}
	if _, _, err := ReadSmall(filepath.Join(dir, "big"), 99); err == nil || !strings.Contains(err.Error(), "larger than 99 bytes") {
		t.Errorf("oversized file: %v", err)
	}
}

// Every size up to the limit is read whole, with its FileInfo, and one
// byte more is refused.
func TestReadSmallReadsEverySizeWhole(t *testing.T) {
	dir := t.TempDir()
	const limit = 3000
	for _, size := range []int{0, 1, 511, 512, 513, 1023, 1024, 1025, 2048, limit} {
		name := fmt.Sprintf("f%d", size)
		want := strings.Repeat("r", size)
		if err := os.WriteFile(filepath.Join(dir, name), []byte(want), 0o600); err != nil {
			t.Fatal(err)
		}
		b, fi, err := ReadSmall(filepath.Join(dir, name), limit)
		if err != nil || string(b) != want || fi.Size() != int64(size) {
			t.Errorf("size %d: read %d bytes, %v, %v", size, len(b), fi, err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "over"), []byte(strings.Repeat("r", limit+1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ReadSmall(filepath.Join(dir, "over"), limit); err == nil {
		t.Error("a file one byte over the limit was read")
	}
}

// A configuration file is read through a symlink, as its own program
// reads it, and otherwise as ReadSmall reads: a FIFO, even one a writer
// holds open, is refused, never blocked on, and so is an oversized file.
func TestReadConfigFollowsASymlinkOnly(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "target")
	if err := os.WriteFile(target, []byte("conf"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if b, err := ReadConfig(filepath.Join(dir, "link"), 4); err != nil || string(b) != "conf" {
		t.Errorf("through a symlink: %q, %v", b, err)
	}
	if _, err := ReadConfig(target, 3); err == nil {
		t.Error("an oversized file was read")
	}
	fifo := dirstate.PlantFIFO(t, filepath.Join(dir, "fifo"))
	writer, err := os.OpenFile(fifo, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Close()
	if _, err := ReadConfig(fifo, 4); err == nil || !strings.Contains(err.Error(), "a FIFO, not a regular file") {
		t.Errorf("FIFO: %v", err)
	}
}
