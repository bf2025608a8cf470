package reclaim

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func (w *world) legacyLease(legacy, ip, content string, mtime time.Time) string {
	w.t.Helper()
	dir := filepath.Join(legacy, net1)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		w.t.Fatal(err)
	}
	path := filepath.Join(dir, ip)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		w.t.Fatal(err)
	}
	if err := os.Chtimes(path, mtime, mtime); err != nil {
		w.t.Fatal(err)
	}
	return path
}

func TestMigrateMovesThisBootsLeasesAndDropsOlderOnes(t *testing.T) {
	w := newWorld(t)
	legacy := t.TempDir()
	running := bootTime.Add(10 * time.Minute)
	w.legacyLease(legacy, "10.0.0.2", "running\r\neth0", running)
	w.legacyLease(legacy, "10.0.0.3", "deadbeforeboot\r\neth0", bootTime.Add(-time.Hour))
	w.legacyLease(legacy, "10.0.0.4", "conflict\r\neth0", running)
	w.lease("10.0.0.4", "someone-else\r\neth0", running)
	if err := os.WriteFile(filepath.Join(legacy, net1, "last_reserved_ip.0"), []byte("10.0.0.4"), 0o600); err != nil {
		t.Fatal(err)
	}

	m, err := w.sweeper.Migrate(w.dataDir, net1, legacy)
	if err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	if m.Moved != 1 || m.Dropped != 1 || len(m.Conflicts) != 1 {
		t.Errorf("migration = %+v", m)
	}
	moved := filepath.Join(w.dataDir, net1, "10.0.0.2")
	b, err := os.ReadFile(moved)
	if err != nil || string(b) != "running\r\neth0" {
		t.Fatalf("moved lease = %q, %v", b, err)
	}
	if fi, _ := os.Stat(moved); !fi.ModTime().Equal(running) || fi.Mode().Perm() != 0o600 {
		t.Errorf("moved lease mtime %v mode %v, want %v 0600", fi.ModTime(), fi.Mode(), running)
	}
	left, _ := os.ReadDir(filepath.Join(legacy, net1))
	var names []string
	for _, e := range left {
		names = append(names, e.Name())
	}
	// The conflicting lease stays where it is, host-local's own files too.
	equal(t, "legacy dir", names, []string{"10.0.0.4", "last_reserved_ip.0", "lock"})
	if b, _ := os.ReadFile(filepath.Join(w.dataDir, net1, "10.0.0.4")); string(b) != "someone-else\r\neth0" {
		t.Errorf("our lease was overwritten: %q", b)
	}
	if !strings.Contains(w.log.String(), "migrated 1 lease(s)") || !strings.Contains(w.log.String(), "not migrated") {
		t.Errorf("log = %q", w.log)
	}

	// Once per boot: a new legacy lease is not picked up again this boot.
	w.legacyLease(legacy, "10.0.0.5", "late\r\neth0", running)
	if m, err := w.sweeper.Migrate(w.dataDir, net1, legacy); err != nil || m.Moved != 0 {
		t.Errorf("second Migrate this boot = %+v, %v", m, err)
	}
	// Next boot, it is.
	w.host.ID = "boot-2"
	if m, err := w.sweeper.Migrate(w.dataDir, net1, legacy); err != nil || m.Moved != 1 {
		t.Errorf("Migrate in the next boot = %+v, %v", m, err)
	}
}

func TestMigrateResumesAfterACrashBetweenCopyAndRemove(t *testing.T) {
	w := newWorld(t)
	legacy := t.TempDir()
	running := bootTime.Add(time.Minute)
	src := w.legacyLease(legacy, "10.0.0.2", "c1\r\neth0", running)
	// The previous run copied, then died: the target exists, the source too,
	// and there is no marker.
	w.lease("10.0.0.2", "c1\r\neth0", running)

	m, err := w.sweeper.Migrate(w.dataDir, net1, legacy)
	if err != nil || m.Moved != 1 || len(m.Conflicts) != 0 {
		t.Fatalf("Migrate = %+v, %v", m, err)
	}
	if _, err := os.Stat(src); !os.IsNotExist(err) {
		t.Errorf("source lease still there: %v", err)
	}
}

func TestMigrateWithoutLegacyDirectoryOnlyMarks(t *testing.T) {
	w := newWorld(t)
	legacy := filepath.Join(t.TempDir(), "absent")
	if _, err := w.sweeper.Migrate(w.dataDir, net1, legacy); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(legacy); !os.IsNotExist(err) {
		t.Errorf("Migrate created the legacy dir: %v", err)
	}
	b, err := os.ReadFile(filepath.Join(w.dataDir, ".nomad-bridge-cni", net1, ".migrated"))
	if err != nil || string(b) != "boot-1" {
		t.Errorf("marker = %q, %v", b, err)
	}
}

// When the target of a migrated lease already exists, it is compared
// without following a symlink and without blocking on a FIFO: a symlink to
// an identical lease elsewhere is not "already moved", and neither hangs.
func TestCopyLeaseDoesNotFollowOrBlockOnAnExistingTarget(t *testing.T) {
	dir := t.TempDir()
	l := Lease{content: "c1\r\neth0", ModTime: time.Now()}
	elsewhere := filepath.Join(t.TempDir(), "lease")
	if err := os.WriteFile(elsewhere, []byte(l.content), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "10.0.0.2")
	if err := os.Symlink(elsewhere, link); err != nil {
		t.Fatal(err)
	}
	if moved, err := copyLease(l, link); moved || err == nil {
		t.Errorf("symlinked target: moved %v, err %v; want an error and no move", moved, err)
	}
	fifo := filepath.Join(dir, "10.0.0.3")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan bool, 1)
	go func() { moved, _ := copyLease(l, fifo); done <- moved }()
	select {
	case moved := <-done:
		if moved {
			t.Error("a FIFO target counted as the migrated lease")
		}
	case <-time.After(10 * time.Second):
		if w, err := os.OpenFile(fifo, os.O_WRONLY, 0); err == nil {
			w.Close()
		}
		t.Fatal("copyLease blocked on a FIFO")
	}
}
