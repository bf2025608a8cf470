package ipamdir

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/dirstate"
)

// The lock is host-local's: while it is held, host-local's own flock on the
// same file cannot be taken.
func TestLockIsHostLocalsLock(t *testing.T) {
	d := New(t.TempDir(), "net")
	unlock, err := d.Lock()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(d.Leases(), LockFileName)
	other, err := os.Open(path)
	if err != nil {
		t.Fatalf("host-local's lock file: %v", err)
	}
	defer other.Close()
	if err := unix.Flock(int(other.Fd()), unix.LOCK_EX|unix.LOCK_NB); !errors.Is(err, unix.EWOULDBLOCK) {
		t.Errorf("host-local's flock while the plugin holds the lock: %v, want EWOULDBLOCK", err)
	}
	unlock()
	unlock() // twice is harmless
	if err := unix.Flock(int(other.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Errorf("host-local's flock after unlock: %v", err)
	}
}

// A planted lock never hangs, never leads out of the data dir, and is
// refused with an error that says what it is.
func TestLockRefusesPlantedLocks(t *testing.T) {
	outside := filepath.Join(t.TempDir(), "target")
	for _, tc := range []struct {
		name  string
		plant func(t *testing.T, lock string)
		want  string
	}{
		{"fifo", func(t *testing.T, lock string) { dirstate.PlantFIFO(t, lock) }, "a FIFO"},
		{"directory", func(t *testing.T, lock string) { mustOK(t, os.Mkdir(lock, 0o700)) }, "a directory"},
		{"symlink", func(t *testing.T, lock string) { mustOK(t, os.Symlink(outside, lock)) }, "symlink"},
		{"symlink-to-fifo", func(t *testing.T, lock string) {
			fifo := dirstate.PlantFIFO(t, filepath.Join(t.TempDir(), "fifo"))
			mustOK(t, os.Symlink(fifo, lock))
		}, "symlink"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := New(t.TempDir(), "net")
			mustOK(t, os.Mkdir(d.Leases(), 0o755))
			tc.plant(t, filepath.Join(d.Leases(), LockFileName))
			for name, lock := range map[string]func() (func(), error){"Lock": d.Lock, "LockExisting": d.LockExisting} {
				done := make(chan error, 1)
				go func() {
					unlock, err := lock()
					if err == nil {
						unlock()
					}
					done <- err
				}()
				select {
				case err := <-done:
					if err == nil || !strings.Contains(err.Error(), tc.want) {
						t.Errorf("%s: %v, want a refusal naming %q", name, err, tc.want)
					}
				case <-time.After(10 * time.Second):
					t.Fatalf("%s hangs on a planted %s", name, tc.name)
				}
			}
			if _, err := os.Lstat(outside); err == nil {
				t.Errorf("the symlink's target %s was created", outside)
			}
		})
	}
}

// A symlinked network directory is refused, not followed.
func TestLockRefusesASymlinkedNetworkDir(t *testing.T) {
	d := New(t.TempDir(), "net")
	elsewhere := t.TempDir()
	mustOK(t, os.Symlink(elsewhere, d.Leases()))
	for name, lock := range map[string]func() (func(), error){"Lock": d.Lock, "LockExisting": d.LockExisting} {
		if _, err := lock(); err == nil || !strings.Contains(err.Error(), "symlink") {
			t.Errorf("%s: %v, want a refusal", name, err)
		}
	}
	if entries, _ := os.ReadDir(elsewhere); len(entries) != 0 {
		t.Errorf("created through the symlink: %v", entries)
	}
}

// What only reads creates nothing: no network directory, no lock file.
func TestLockExistingCreatesNothing(t *testing.T) {
	data := t.TempDir()
	d := New(data, "net")
	unlock, err := d.LockExisting()
	if err != nil {
		t.Fatal(err)
	}
	unlock()
	mustOK(t, os.Mkdir(d.Leases(), 0o755))
	unlock, err = d.LockExisting()
	if err != nil {
		t.Fatal(err)
	}
	unlock()
	if entries, _ := os.ReadDir(d.Leases()); len(entries) != 0 {
		t.Errorf("LockExisting created %v", entries)
	}
}

// A lock held beyond LockTimeout ends the wait with an error naming the
// holder; the lock is free again for later callers once it is released.
func TestLockTimesOutNamingTheHolder(t *testing.T) {
	old := LockTimeout
	LockTimeout = 200 * time.Millisecond
	t.Cleanup(func() { LockTimeout = old })
	d := New(t.TempDir(), "net")
	unlock, err := d.Lock()
	if err != nil {
		t.Fatal(err)
	}
	_, err = d.Lock()
	if !errors.Is(err, ErrLockTimeout) || !strings.Contains(err.Error(), fmt.Sprintf("pid %d", os.Getpid())) {
		t.Errorf("second Lock: %v, want ErrLockTimeout naming pid %d", err, os.Getpid())
	}
	unlock()
	unlock, err = d.Lock()
	if err != nil {
		t.Fatalf("Lock after the holder let go: %v", err)
	}
	unlock()
}

func mustOK(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// What host-local would block on or follow out is refused before it runs;
// what it reads harmlessly (leases, foreign regular files, links to files
// or directories, dangling links, planted directories of those) is fine.
func TestCheckPlanted(t *testing.T) {
	fine := func(t *testing.T, dir string) {
		mustOK(t, os.WriteFile(filepath.Join(dir, "10.0.0.2"), []byte("c1\r\neth0"), 0o600))
		mustOK(t, os.WriteFile(filepath.Join(dir, LockFileName), nil, 0o600))
		mustOK(t, os.WriteFile(filepath.Join(dir, "last_reserved_ip.0"), []byte("10.0.0.2"), 0o600))
		mustOK(t, os.WriteFile(filepath.Join(dir, "foreign"), nil, 0o600))
		mustOK(t, os.MkdirAll(filepath.Join(dir, "10.0.0.6", "x"), 0o700))
	}
	fifo := func(t *testing.T, path string) { dirstate.PlantFIFO(t, path) }
	for _, tc := range []struct {
		name  string
		plant func(t *testing.T, dir string)
		want  string
	}{
		{"nothing", func(*testing.T, string) {}, ""},
		{"harmless", fine, ""},
		{"fifo-lease", func(t *testing.T, dir string) { fine(t, dir); fifo(t, filepath.Join(dir, "10.0.0.9")) }, "a FIFO"},
		{"fifo-lock", func(t *testing.T, dir string) { fifo(t, filepath.Join(dir, LockFileName)) }, "a FIFO"},
		{"symlinked-lock", func(t *testing.T, dir string) {
			mustOK(t, os.Symlink(filepath.Join(t.TempDir(), "x"), filepath.Join(dir, LockFileName)))
		}, "follow it out"},
		// Regression: host-local wrote the address through a planted
		// last_reserved_ip.0 link. No link of any kind is host-local's.
		{"symlinked-last-reserved", func(t *testing.T, dir string) {
			mustOK(t, os.Symlink(filepath.Join(t.TempDir(), "x"), filepath.Join(dir, "last_reserved_ip.0")))
		}, "is a symlink"},
		{"link-to-file", func(t *testing.T, dir string) { mustOK(t, os.Symlink("/etc/hostname", filepath.Join(dir, "10.0.0.3"))) }, "is a symlink"},
		{"dangling-link", func(t *testing.T, dir string) { mustOK(t, os.Symlink("/nonexistent", filepath.Join(dir, "10.0.0.4"))) }, "is a symlink"},
		{"link-to-dir", func(t *testing.T, dir string) { mustOK(t, os.Symlink("/etc", filepath.Join(dir, "10.0.0.5"))) }, "is a symlink"},
		{"link-in-planted-dir", func(t *testing.T, dir string) {
			mustOK(t, os.MkdirAll(filepath.Join(dir, "sub"), 0o700))
			mustOK(t, os.Symlink("/etc/hostname", filepath.Join(dir, "sub", "x")))
		}, "is a symlink"},
		{"hard-linked-last-reserved", func(t *testing.T, dir string) {
			other := filepath.Join(dir, "10.0.0.6")
			mustOK(t, os.WriteFile(other, nil, 0o600))
			mustOK(t, os.Link(other, filepath.Join(dir, "last_reserved_ip.0")))
		}, "hard links"},
		{"link-to-fifo", func(t *testing.T, dir string) {
			target := filepath.Join(t.TempDir(), "fifo")
			fifo(t, target)
			mustOK(t, os.Symlink(target, filepath.Join(dir, "10.0.0.9")))
		}, "is a symlink"},
		{"fifo-in-planted-dir", func(t *testing.T, dir string) { fifo(t, filepath.Join(dir, "10.0.0.9", "deep", "f")) }, "a FIFO"},
		{"socket", func(t *testing.T, dir string) {
			fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
			mustOK(t, err)
			defer syscall.Close(fd)
			mustOK(t, syscall.Bind(fd, &syscall.SockaddrUnix{Name: filepath.Join(dir, "10.0.0.9")}))
		}, "a socket"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := New(t.TempDir(), "net")
			mustOK(t, os.Mkdir(d.Leases(), 0o755))
			tc.plant(t, d.Leases())
			err := d.CheckPlanted()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("CheckPlanted: %v, want a refusal saying %q", err, tc.want)
			}
		})
	}
	if err := New(t.TempDir(), "missing").CheckPlanted(); err != nil {
		t.Errorf("a missing directory: %v", err)
	}
}

// BenchmarkCheckPlanted is what every verb pays to refuse planted files
// before host-local runs, on a network of 1023 leases (bridge's limit of
// ports).
func BenchmarkCheckPlanted(b *testing.B) {
	d := New(b.TempDir(), "net")
	if err := os.Mkdir(d.Leases(), 0o755); err != nil {
		b.Fatal(err)
	}
	for i := range 1023 {
		if err := os.WriteFile(filepath.Join(d.Leases(), fmt.Sprintf("10.0.%d.%d", i/250, i%250+2)), []byte("c\r\neth0"), 0o600); err != nil {
			b.Fatal(err)
		}
	}
	for b.Loop() {
		if err := d.CheckPlanted(); err != nil {
			b.Fatal(err)
		}
	}
}

// A data dir whose path has glob metacharacters ("[", "*", "?") still has
// its last_reserved_ip.N checked (regression: a glob of the path matched
// nothing there, and a sweep reported no hard link).
func TestCheckBookkeepingInADataDirWithGlobCharacters(t *testing.T) {
	d := New(filepath.Join(t.TempDir(), "data[1]*?"), "net")
	mustOK(t, os.MkdirAll(d.Leases(), 0o755))
	other := filepath.Join(d.Leases(), "10.0.0.6")
	mustOK(t, os.WriteFile(other, nil, 0o600))
	mustOK(t, os.Link(other, filepath.Join(d.Leases(), "last_reserved_ip.0")))
	if err := d.CheckBookkeeping(); err == nil || !strings.Contains(err.Error(), "hard links") {
		t.Fatalf("CheckBookkeeping = %v, want the hard-linked last_reserved_ip.0 reported", err)
	}
}

// The holder a timed-out wait names is named by its command, which a
// process sets itself: a terminal's escape sequences in it are written as
// Go escapes (regression: the error carried them raw to the terminal of
// gc and leases, and to the runtime).
func TestLockTimeoutEscapesTheHoldersCommand(t *testing.T) {
	old := LockTimeout
	LockTimeout = 200 * time.Millisecond
	t.Cleanup(func() { LockTimeout = old })
	comm, err := os.ReadFile("/proc/self/comm")
	if err != nil {
		t.Fatal(err)
	}
	// The thread group leader's name, this test's process's.
	if err := os.WriteFile("/proc/self/comm", []byte("\x1b]2;x\x07"), 0); err != nil {
		t.Skipf("cannot rename this process: %v", err)
	}
	t.Cleanup(func() { _ = os.WriteFile("/proc/self/comm", comm, 0) })
	d := New(t.TempDir(), "net")
	unlock, err := d.Lock()
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	_, err = d.Lock()
	if want := fmt.Sprintf(`pid %d (\x1b]2;x\a)`, os.Getpid()); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("second Lock: %q, want it to name %s", err, want)
	}
}

// A lock file removed while Lock waits on it (a failed verb on a new
// network removes the directory it made, lock last, under that lock) is
// not the lock any more: a host-local that comes after creates another at
// the path and takes that one. Lock holds the lock file that is at the
// path when it returns, or host-local runs beside it.
func TestLockHoldsTheFileAtThePathNotOneRemovedWhileItWaited(t *testing.T) {
	d := New(t.TempDir(), "net")
	mustOK(t, os.Mkdir(d.Leases(), 0o755))
	path := filepath.Join(d.Leases(), LockFileName)
	held, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE, 0o600)
	mustOK(t, err)
	defer held.Close()
	mustOK(t, unix.Flock(int(held.Fd()), unix.LOCK_EX))
	var old unix.Stat_t
	mustOK(t, unix.Fstat(int(held.Fd()), &old))

	done := make(chan error, 1)
	unlocked := make(chan func(), 1)
	go func() {
		unlock, err := d.Lock()
		if err == nil {
			unlocked <- unlock
		}
		done <- err
	}()
	// Wait until Lock has the old lock file open (it then waits on it).
	for deadline := time.Now().Add(10 * time.Second); openCount(t, old) < 2; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("Lock never opened the lock file")
		}
	}
	// The holder removes the lock (and the directory, then a host-local
	// makes both again) and lets go. Whether Lock is in its flock by then
	// or gets there after, it flocks the removed file: the same case.
	mustOK(t, os.Remove(path))
	mustOK(t, os.Remove(d.Leases()))
	mustOK(t, os.Mkdir(d.Leases(), 0o755))
	fresh, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE, 0o600)
	mustOK(t, err)
	defer fresh.Close()
	held.Close()

	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Lock: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Lock still waits after the holder let go")
	}
	unlock := <-unlocked
	if err := unix.Flock(int(fresh.Fd()), unix.LOCK_EX|unix.LOCK_NB); !errors.Is(err, unix.EWOULDBLOCK) {
		t.Errorf("host-local's flock on the lock file now at %s while Lock holds the lock: %v, want EWOULDBLOCK", path, err)
	}
	unlock()
	if err := unix.Flock(int(fresh.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Errorf("host-local's flock after unlock: %v", err)
	}
}

// openCount is how many of this process's descriptors are on the file st.
func openCount(t *testing.T, st unix.Stat_t) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	mustOK(t, err)
	n := 0
	for _, fd := range fds {
		var fst unix.Stat_t
		if unix.Stat(filepath.Join("/proc/self/fd", fd.Name()), &fst) == nil && fst.Dev == st.Dev && fst.Ino == st.Ino {
			n++
		}
	}
	return n
}
