package sysinfo

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/dirstate"
	kitns "github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/netns"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/testhost"
)

func requireRoot(t *testing.T, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		testhost.SkipOrFail(t, why+" needs root")
	}
}

// A namespace's cookie is what a socket inside it says, and two
// namespaces have two cookies.
func TestNetnsCookieOfTwoNamespaces(t *testing.T) {
	requireRoot(t, "entering a namespace")
	r := &Real{}
	cookies := map[uint64]string{}
	for _, path := range []string{"/proc/self/ns/net", kitns.New(t, "nbc-nscookie").Path} {
		got, err := r.NetnsCookie(path)
		if err != nil || got == 0 {
			t.Fatalf("NetnsCookie(%s) = %d, %v", path, got, err)
		}
		if other, dup := cookies[got]; dup {
			t.Errorf("%s and %s have the same cookie %d", other, path, got)
		}
		cookies[got] = path
	}
	own, err := socketNetnsCookie()
	if err != nil {
		t.Fatal(err)
	}
	if cookies[own] != "/proc/self/ns/net" {
		t.Errorf("this process's socket says cookie %d; NetnsCookie said %v", own, cookies)
	}
}

// A FIFO planted where a namespace is expected is no namespace, and
// reading its cookie, either way, does not block on it.
func TestNetnsCookieOfAPlantedFIFO(t *testing.T) {
	fifo := dirstate.PlantFIFO(t, filepath.Join(t.TempDir(), "netns"))
	r := &Real{}
	for name, read := range map[string]func(string) (uint64, error){"NetnsCookie": r.NetnsCookie} {
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
			t.Fatalf("%s blocked on a FIFO", name)
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
