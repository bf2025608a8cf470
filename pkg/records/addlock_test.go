package records

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/dirstate"
)

func pendingSample() *Record {
	r := sample()
	r.State, r.IPs, r.PID, r.PIDStart = Started, nil, 31337, 1
	return r
}

func assertAddRunning(t *testing.T, s *Store, k Key, want bool) {
	t.Helper()
	got, err := s.AddRunning(k)
	if err != nil || got != want {
		t.Errorf("AddRunning(%s) = %v, %v; want %v", k, got, err, want)
	}
}

// The lock marks the ADD as running while any open file description of
// it is open, in this process or in a child that inherited it, and no
// longer once the last one is closed.
func TestAddRunningWhileAnyProcessHoldsTheLock(t *testing.T) {
	s := NewStore(ipamdir.New(t.TempDir(), "nomad"))
	r := pendingSample()
	held, err := s.WriteLocked(r)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if got, err := s.Read(r.Key()); err != nil || !reflect.DeepEqual(got, r) {
		t.Errorf("Read = %+v, %v; want %+v", got, err, r)
	}
	if _, err := held.Write([]byte("x")); err == nil {
		t.Error("the locked record is writable through the inherited file")
	}
	assertAddRunning(t, s, r.Key(), true)

	// A delegate inherits the file and outlives the plugin.
	child := exec.Command("sleep", "3600")
	child.ExtraFiles = []*os.File{held}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer child.Process.Kill()
	held.Close()
	assertAddRunning(t, s, r.Key(), true)

	if err := child.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = child.Wait()
	assertAddRunning(t, s, r.Key(), false)
}

// Records written without the lock (Write, or a binary from before it)
// and records that are gone have no ADD running; a completed record
// replaces the locked file, so the lock marks only the pending record.
func TestAddRunningOnlyForTheLockedPendingRecord(t *testing.T) {
	s := NewStore(ipamdir.New(t.TempDir(), "nomad"))
	assertAddRunning(t, s, Key{"c1", "eth0"}, false)

	r := pendingSample()
	if err := s.Write(r); err != nil {
		t.Fatal(err)
	}
	assertAddRunning(t, s, r.Key(), false)

	held, err := s.WriteLocked(r)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	assertAddRunning(t, s, r.Key(), true)
	r.State = Complete
	if err := s.Write(r); err != nil {
		t.Fatal(err)
	}
	assertAddRunning(t, s, r.Key(), false)
}

// A failed WriteLocked leaves nothing behind, no temp file either.
func TestWriteLockedFailureLeavesNothing(t *testing.T) {
	s := NewStore(ipamdir.New(t.TempDir(), "nomad"))
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		t.Fatal(err)
	}
	// A directory where the record goes: the rename fails.
	if err := os.Mkdir(s.dir+"/c1@eth0", 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s.dir+"/c1@eth0/x", nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if held, err := s.WriteLocked(pendingSample()); err == nil {
		held.Close()
		t.Fatal("WriteLocked over a directory succeeded")
	}
	entries, _ := os.ReadDir(s.dir)
	if len(entries) != 1 {
		t.Errorf("left behind: %v", entries)
	}
}

// WriteLocked opens its temp file again to hold its lock: a FIFO put in
// its place meanwhile (the temp file's name is in the record directory
// for all to see) is refused at once, never blocked on (regression: the
// ADD hung in open(2)).
func TestOpenLockedNeverBlocksOnAFIFO(t *testing.T) {
	fifo := dirstate.PlantFIFO(t, filepath.Join(t.TempDir(), ".tmp-4242-1"))
	done := make(chan error, 1)
	go func() {
		f, err := openLocked(fifo)
		if err == nil {
			f.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Error("a FIFO in the temp file's place was taken for the record")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("openLocked blocks on a FIFO")
	}
}
