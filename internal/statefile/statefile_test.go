package statefile

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
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
	if err := WriteFileAtomic(path, []byte("one")); err != nil {
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
// in: follow a symlink, block on a FIFO, read without bound.
func TestReadSmallFileAtRefusesWhatWasPlanted(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "target")
	if err := os.WriteFile(target, []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "big"), []byte(strings.Repeat("x", 100)), 0o600); err != nil {
		t.Fatal(err)
	}
	if b, err := ReadFileNoFollow(target); err != nil || string(b) != "secret" {
		t.Fatalf("plain file: %q, %v", b, err)
	}
	if _, err := ReadFileNoFollow(filepath.Join(dir, "link")); err == nil {
		t.Error("followed a symlink")
	}
	// Returns at once (an empty read), instead of waiting for a writer.
	if b, err := ReadFileNoFollow(filepath.Join(dir, "fifo")); err != nil || len(b) != 0 {
		t.Errorf("FIFO: %q, %v", b, err)
	}
	if _, _, err := ReadSmallFileAt(unix.AT_FDCWD, "", filepath.Join(dir, "big"), 99, false); err == nil || !strings.Contains(err.Error(), "larger than 99 bytes") {
		t.Errorf("oversized file: %v", err)
	}
}
