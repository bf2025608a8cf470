package sysinfo

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func requireRoot(t *testing.T, why string) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatal(why + " needs root, and CI runs as root")
	}
	t.Skip(why + " needs root")
}

// newNetns starts a process in a network namespace of its own, killed at
// cleanup, and returns the path of that namespace.
func newNetns(t *testing.T) string {
	t.Helper()
	cmd := exec.Command("sleep", "600")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start a process in a network namespace of its own: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return "/proc/" + strconv.Itoa(cmd.Process.Pid) + "/ns/net"
}

// The cookie NetnsCookie reads from outside (NS_GET_ID, where the kernel
// makes the id the cookie) is what a socket inside the namespace says: a
// record written with one is judged with the other, and a difference
// would make a live namespace look re-created.
func TestNetnsCookieFromOutsideIsTheSocketCookie(t *testing.T) {
	requireRoot(t, "entering a namespace")
	r := &Real{}
	cookies := map[uint64]string{}
	for _, path := range []string{"/proc/self/ns/net", newNetns(t)} {
		got, err := r.NetnsCookie(path)
		if err != nil || got == 0 {
			t.Fatalf("NetnsCookie(%s) = %d, %v", path, got, err)
		}
		inside, err := r.cookieInside(path)
		if err != nil {
			t.Fatalf("cookie of %s read inside it: %v", path, err)
		}
		if got != inside {
			t.Errorf("NetnsCookie(%s) = %d, the socket inside says %d", path, got, inside)
		}
		if other, dup := cookies[got]; dup {
			t.Errorf("%s and %s have the same cookie %d", other, path, got)
		}
		cookies[got] = path
		id, err := netnsID(path)
		switch {
		case errors.Is(err, errNoNSGetID):
			t.Logf("this kernel has no NS_GET_ID: cookies are read inside the namespace")
		case err != nil:
			t.Errorf("NS_GET_ID of %s: %v", path, err)
		case id != inside:
			t.Errorf("NS_GET_ID of %s is %d, its cookie %d: the id must not be taken for the cookie", path, id, inside)
			if r.nsIDIsCookie() {
				t.Errorf("nsIDIsCookie is true where NS_GET_ID is not the cookie")
			}
		case !r.nsIDIsCookie():
			t.Errorf("NS_GET_ID is the cookie, but nsIDIsCookie says it is not: every cookie still enters its namespace")
		default:
			t.Logf("%s: cookie %d read with NS_GET_ID", path, got)
		}
	}
}

// A FIFO planted where a namespace is expected is no namespace, and
// reading its cookie, either way, does not block on it.
func TestNetnsCookieOfAPlantedFIFO(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "netns")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	r := &Real{}
	for name, read := range map[string]func(string) (uint64, error){"NetnsCookie": r.NetnsCookie, "cookieInside": r.cookieInside} {
		done := make(chan error, 1)
		go func() {
			_, err := read(fifo)
			done <- err
		}()
		select {
		case err := <-done:
			if !errors.Is(err, ErrNotNetns) {
				t.Errorf("%s of a FIFO: %v, want ErrNotNetns", name, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s blocked on a FIFO", name) // the open is left hanging
		}
	}
}

// A namespace file of another type (a mount namespace) is no network
// namespace: its id is no network cookie.
func TestNetnsCookieOfAnotherNamespaceType(t *testing.T) {
	r := &Real{}
	if _, err := r.NetnsCookie("/proc/self/ns/mnt"); !errors.Is(err, ErrNotNetns) {
		t.Errorf("NetnsCookie of a mount namespace: %v, want ErrNotNetns", err)
	}
}
