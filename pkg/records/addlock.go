package records

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

	"golang.org/x/sys/unix"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/internal/statefile"
)

// A pending record names the plugin process that wrote it, but an ADD is
// more processes than that: the delegate runs in a process group of its
// own (so its timeout can kill it whole) and starts host-local and
// iptables. A runtime that gives up on an ADD kills the plugin (go-cni:
// its direct child; others: the caller's process group) while bridge runs
// on and allocates. So every process of the ADD holds the record's flock:
// the plugin opens the record locked and its delegate inherits the
// descriptor, which exec keeps open (it is not close-on-exec in the
// delegate, and Go's os/exec, bridge's, closes no descriptor it did not
// open), down to the children. The lock belongs to the open file
// description, so it is held until the last of them exits, however they
// die, and a sweep can test it without blocking.

// WriteLocked stores a pending record as Write does and returns it open
// read-only (every process of the ADD inherits it: it cannot change the
// record) with an exclusive flock, taken before the rename so the record
// is never visible unlocked. Closing the file drops the plugin's hold; a
// record written later for the same key is another file, so the lock only
// ever marks this pending record.
func (s *Store) WriteLocked(r *Record) (*os.File, error) {
	var held *os.File
	err := s.write(r, func(tmp string) (err error) {
		held, err = openLocked(tmp)
		return err
	})
	if err != nil && held != nil {
		held.Close()
		held = nil
	}
	return held, err
}

// openLocked opens path read-only and takes its exclusive flock, which
// cannot be contended: the file is new. Its name is in the record
// directory for all to see, so what was put in its place is refused
// (statefile.Open, statefile.Regular).
func openLocked(path string) (*os.File, error) {
	f, err := statefile.Open(path)
	if err != nil {
		return nil, err
	}
	if _, err := statefile.Regular(f); err != nil {
		f.Close()
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, &os.PathError{Op: "flock", Path: path, Err: err}
	}
	return f, nil
}

// AddRunning reports whether a process of the ADD that wrote k's record
// still holds its lock (WriteLocked). A record that is gone has no ADD
// running. It opens the record with statefile.Open: a FIFO planted in its
// place cannot block it.
func (s *Store) AddRunning(k Key) (bool, error) {
	f, err := statefile.Open(s.PathOf(k))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("test the lock of record %s: %w", k, err)
	}
	defer f.Close()
	// A shared lock, dropped with the descriptor: it never keeps the
	// record's writer from anything.
	switch err := unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB); {
	case err == unix.EWOULDBLOCK:
		return true, nil
	case err != nil:
		return false, fmt.Errorf("test the lock of record %s: %w", k, &os.PathError{Op: "flock", Path: f.Name(), Err: err})
	}
	return false, nil
}
