package ipamdir

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/internal/statefile"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/sysinfo"
)

// LockFileName is host-local's lock file in a network's directory
// (backend/disk: the flock every host-local ADD and DEL takes).
const LockFileName = "lock"

// LockTimeout bounds the wait for host-local's lock. host-local holds it
// for milliseconds and a sweep for less than a second, so a lock held
// longer belongs to a stuck process; waiting on would hang the runtime's
// CHECK and every gc behind it.
var LockTimeout = 30 * time.Second

// ErrLockTimeout: the lock was not free within LockTimeout.
var ErrLockTimeout = errors.New("host-local's lock was not free in time")

// Lock takes host-local's lock of the network, as host-local does, and
// creates the network's directory and lock file if they are missing. It is
// not host-local's own code (backend/disk through go-filemutex, whose New
// opens with O_CREAT alone and whose Lock waits without bound): that
// follows a planted symlink, creating its target anywhere, blocks for ever
// opening a planted FIFO and waits for ever behind a stuck holder. Here
// the lock must be a regular file in a directory reached without following
// a link, it is opened without blocking, and the wait ends after
// LockTimeout with an error that names who holds it.
func (d Dir) Lock() (unlock func(), err error) { return d.lock(true) }

// LockExisting is Lock for what only reads (leases, a dry run): it creates
// nothing. Without the directory or the lock file no host-local ever ran
// there, and there is nothing to wait for.
func (d Dir) LockExisting() (unlock func(), err error) { return d.lock(false) }

func (d Dir) lock(create bool) (func(), error) {
	deadline := time.Now().Add(LockTimeout)
	for {
		unlock, again, err := d.lockOnce(create, deadline)
		if !again {
			return unlock, err
		}
	}
}

// lockOnce is one try of lock: again says that the lock file it got the
// flock of was no longer at its path by then (removed, with its directory,
// by whoever held it: a failed verb on a new network), so that a
// host-local after it takes another file's, and the lock must be taken
// again on the file the path names now.
func (d Dir) lockOnce(create bool, deadline time.Time) (unlock func(), again bool, err error) {
	dir := d.Leases()
	path := filepath.Join(dir, LockFileName)
	if create {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, false, fmt.Errorf("create %s: %w", dir, err)
		}
	}
	dirFD, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		unlock, err := lockOpenFailed(dir, err, create)
		return unlock, false, err
	}
	defer unix.Close(dirFD)
	flags := unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_CLOEXEC
	if create {
		flags |= unix.O_CREAT
	}
	fd, err := unix.Openat(dirFD, LockFileName, flags, 0o600)
	if err != nil {
		unlock, err := lockOpenFailed(path, err, create)
		return unlock, false, err
	}
	f := os.NewFile(uintptr(fd), path)
	if _, err := statefile.Regular(f); err != nil {
		f.Close()
		return nil, false, fmt.Errorf("refusing host-local's lock: %w (planted?)", err)
	}
	if err := flockWithin(f, time.Until(deadline)); err != nil {
		if errors.Is(err, ErrLockTimeout) {
			return nil, false, fmt.Errorf("lock %s: %w (waited %s; %s)", path, err, LockTimeout, lockHolders(path))
		}
		f.Close()
		return nil, false, fmt.Errorf("lock %s: %w", path, err)
	}
	var locked, now unix.Stat_t
	if err := unix.Fstat(fd, &locked); err != nil {
		f.Close()
		return nil, false, fmt.Errorf("lock %s: %w", path, err)
	}
	if unix.Lstat(path, &now) != nil || now.Dev != locked.Dev || now.Ino != locked.Ino {
		f.Close()
		return nil, true, nil
	}
	// Closing the one descriptor (close-on-exec: no child shares it)
	// drops the flock; a second close is harmless.
	return func() { f.Close() }, false, nil
}

// lockOpenFailed is lock's answer when it cannot open path, the network's
// directory or its lock file (a missing one LockExisting does not wait for).
func lockOpenFailed(path string, err error, create bool) (func(), error) {
	// O_NOFOLLOW says ELOOP for a link, and O_DIRECTORY ENOTDIR.
	fi, lerr := os.Lstat(path)
	switch {
	case !create && errors.Is(err, unix.ENOENT):
		return func() {}, nil
	case errors.Is(err, unix.ELOOP) || lerr == nil && fi.Mode()&os.ModeSymlink != 0:
		return nil, fmt.Errorf("refusing %s: it is a symlink (host-local's lock and its directory must not point elsewhere)", path)
	case errors.Is(err, unix.ENOTDIR):
		return nil, fmt.Errorf("refusing %s: not a directory", path)
	}
	return nil, fmt.Errorf("open %s: %w", path, err)
}

// flockWithin takes an exclusive flock on f, waiting at most timeout. A
// blocked flock cannot be interrupted, so on timeout the waiting goroutine
// keeps f, and closes it (which drops the lock) if it ever gets it.
func flockWithin(f *os.File, timeout time.Duration) error {
	fd := int(f.Fd())
	done := make(chan error, 1)
	go func() {
		err := unix.Flock(fd, unix.LOCK_EX)
		for errors.Is(err, unix.EINTR) {
			err = unix.Flock(fd, unix.LOCK_EX)
		}
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(timeout):
		go func() {
			<-done
			f.Close()
		}()
		return ErrLockTimeout
	}
}

// lockHolders names the processes that hold the lock file at path, for an
// error message (sysinfo's FlockHolders, the one finder of a flock's
// holders).
func lockHolders(path string) string {
	pids, err := (&sysinfo.Real{}).FlockHolders(path)
	if err != nil {
		return "cannot tell who holds it: " + err.Error()
	}
	if len(pids) == 0 {
		return "no process of this pid namespace holds it"
	}
	holders := make([]string, len(pids))
	for i, pid := range pids {
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		holders[i] = fmt.Sprintf("pid %d (%s)", pid, statefile.Printable(strings.TrimSpace(string(comm))))
	}
	return "held by " + strings.Join(holders, ", ")
}

// plantedDepth bounds how deep CheckPlanted looks into directories planted
// in host-local's directory (host-local's DEL and CHECK walk them all).
const plantedDepth = 4

// CheckPlanted refuses a network directory that host-local, run as the
// delegate's IPAM, would block on for ever or follow out of the data dir:
// a lock that is not a regular file (a FIFO blocks its open, a symlink is
// followed and its target created), an entry host-local's DEL and CHECK
// would read and block on (a FIFO, socket or device, or one inside a
// planted directory), any symlink (host-local reads and writes through
// them), or a last_reserved_ip.N with a second hard link. The plugin's own reads never
// block on these (they are opened non-blocking, without following links);
// host-local's are not. A missing directory is fine.
func (d Dir) CheckPlanted() error {
	dir := d.Leases()
	lock := filepath.Join(dir, LockFileName)
	if fi, err := os.Lstat(lock); err == nil && !fi.Mode().IsRegular() {
		return &PlantedError{Lock: true, err: fmt.Errorf("%s is %s, not host-local's lock file: host-local would %s (planted? remove it)", lock, statefile.Kind(fi.Mode()), map[bool]string{true: "follow it out of the data dir", false: "block on it for ever"}[fi.Mode()&os.ModeSymlink != 0])}
	}
	if err := checkPlantedIn(dir, plantedDepth); err != nil {
		return &PlantedError{err: err}
	}
	return d.CheckBookkeeping()
}

// CheckBookkeeping refuses a last_reserved_ip.N that host-local would
// write through: host-local rewrites it in place on every ADD
// (os.WriteFile), so a symlink's target or a second hard link's file
// would get the address. Its leases it only creates (O_EXCL) and removes,
// which no link can redirect. A sweep reports it (the verbs refuse the
// network until it is removed).
func (d Dir) CheckBookkeeping() error {
	return firstPlanted(d.Leases(), func(e fs.DirEntry) error {
		if !strings.HasPrefix(e.Name(), lastReservedPrefix) {
			return nil
		}
		path := filepath.Join(d.Leases(), e.Name())
		var st unix.Stat_t
		switch {
		case unix.Lstat(path, &st) != nil:
		case st.Mode&unix.S_IFMT == unix.S_IFLNK:
			return &PlantedError{err: fmt.Errorf("%s is a symlink: host-local would write the address it hands out through it, out of the data dir (planted? remove it)", path)}
		case st.Mode&unix.S_IFMT == unix.S_IFREG && st.Nlink > 1:
			return &PlantedError{err: fmt.Errorf("%s has %d hard links: host-local would write the address it hands out into each of them (planted? remove it)", path, st.Nlink)}
		}
		return nil
	})
}

// PlantedError is CheckPlanted's refusal. Lock says it is host-local's
// lock: then nothing may be done in the directory under it.
type PlantedError struct {
	Lock bool
	err  error
}

func (e *PlantedError) Error() string { return e.err.Error() }
func (e *PlantedError) Unwrap() error { return e.err }

// checkPlantedIn refuses, in dir and the directories under it up to
// depth levels, what is not a regular file.
func checkPlantedIn(dir string, depth int) error {
	return firstPlanted(dir, func(e fs.DirEntry) error {
		mode := e.Type()
		if mode.IsRegular() {
			return nil
		}
		path := filepath.Join(dir, e.Name())
		switch {
		case mode.IsDir() && depth == 0:
			return fmt.Errorf("%s is a directory tree deeper than %d levels in host-local's directory: host-local would walk it all (planted? remove it)", path, plantedDepth)
		case mode.IsDir():
			return checkPlantedIn(path, depth-1)
		case mode&os.ModeSymlink != 0:
			return fmt.Errorf("%s is a symlink: host-local would read or write through it, out of the data dir (planted? remove it)", path)
		default:
			return fmt.Errorf("%s is %s: host-local would block on it for ever (planted? remove it)", path, statefile.Kind(mode))
		}
	})
}

// firstPlanted lists dir (a missing one is fine) and gives the first
// error check returns of its entries, or else the listing's own.
func firstPlanted(dir string, check func(fs.DirEntry) error) error {
	f, err := statefile.OpenDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list %s: %w", dir, err)
	}
	defer f.Close()
	var planted error
	err = statefile.EachDirEntry(f, func(e fs.DirEntry) {
		if planted == nil {
			planted = check(e)
		}
	})
	if err != nil && planted == nil {
		planted = fmt.Errorf("list %s: %w", dir, err)
	}
	return planted
}
