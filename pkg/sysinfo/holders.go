package sysinfo

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/internal/statefile"
)

// A path is not a namespace. The kernel keeps a network namespace alive
// while a process is in it or a mount or an open file holds it, whatever
// became of the path it was created at: Nomad, after a failed CHECK,
// unmounts /var/run/netns/<alloc>, creates a new namespace there and ADDs
// again, while the allocation's tasks run on in the old one. Before an
// attachment is judged dead because its path no longer names its namespace,
// the processes and mounts that hold namespaces are asked.

// Holder is a process or an nsfs mount that keeps a network namespace alive.
type Holder struct {
	// PID is the process in the namespace; 0 for a mount.
	PID int `json:"pid,omitempty"`
	// TID is, when not 0, the one thread of the process that is in the
	// namespace (its main thread is elsewhere, or has exited).
	TID int `json:"tid,omitempty"`
	// Command is the process's name (/proc/<pid>/comm), filled in by
	// ConfirmHolder.
	Command string `json:"command,omitempty"`
	// Mount is the mount point of an nsfs bind mount of the namespace.
	Mount string `json:"mount,omitempty"`
}

func (h Holder) String() string {
	if h.TID > 0 {
		return fmt.Sprintf("pid %d thread %d (%s)", h.PID, h.TID, h.Command)
	}
	if h.PID > 0 {
		return fmt.Sprintf("pid %d (%s)", h.PID, h.Command)
	}
	return "mount " + h.Mount
}

// Holders maps each network namespace to what holds it.
type Holders map[NetnsID][]Holder

func (r *Real) procRoot() string { return cmp.Or(r.ProcRoot, "/proc") }

// NetnsHolders reads, once per call, the network namespace of every process
// (the thread group leader's /proc/<pid>/ns/net: a stat each, no file
// read), of every other thread of a process that has more than one (a
// thread can enter a namespace of its own, and the leader can exit before
// its threads: the kernel keeps a namespace while any task is in it), and
// every nsfs mount in this process's mountinfo. A process that
// exits during the scan is skipped (a child it left is looked for: see
// holderScanPasses). Open namespace files of processes in
// other namespaces are not looked for: reading every fd of every process
// costs far more, and a runtime that keeps a namespace by fd also keeps a
// process or a mount on it (Nomad's tasks, a pause container, a bind mount).
func (r *Real) NetnsHolders() (Holders, error) {
	holders := Holders{}
	// A holder may fork and exit between the listing that named it and
	// its stat, leaving the namespace to a child the listing did not name:
	// the listing is taken again, each process not seen yet looked at,
	// until one names no new process (or holderScanPasses).
	seen := map[int]bool{}
	fresh := true
	var err error
	for pass := 0; fresh && pass < holderScanPasses && err == nil; pass++ {
		fresh = false
		err = r.eachProcess(func(procfd int, name string, pid int) {
			if !seen[pid] {
				seen[pid], fresh = true, true
				r.netnsOf(procfd, name, pid, holders)
			}
		})
	}
	if err == nil {
		err = r.scanMounts(holders)
	}
	if err != nil {
		return nil, err
	}
	return holders, nil
}

// holderScanPasses bounds NetnsHolders' listings of the processes: each
// after the first looks only at processes started since, which on a
// host whose processes come and go all the time does not end.
const holderScanPasses = 8

// netnsOf adds to holders the network namespace of the process pid (its
// directory name under procfd) and those of its other threads.
func (r *Real) netnsOf(procfd int, name string, pid int, holders Holders) {
	var st unix.Stat_t
	var leader NetnsID
	// Else it exited, or is a kernel thread we may not look into.
	if unix.Fstatat(procfd, name+"/ns/net", &st, 0) == nil {
		leader = NetnsID{Dev: st.Dev, Ino: st.Ino}
		holders[leader] = append(holders[leader], Holder{PID: pid})
	}
	// A task directory links each thread's directory: 2 + threads.
	if unix.Fstatat(procfd, name+"/task", &st, 0) != nil || st.Nlink == 3 {
		return
	}
	tasks, _ := os.ReadDir(filepath.Join(r.procRoot(), name, "task"))
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil || tid == pid || unix.Fstatat(procfd, name+"/task/"+t.Name()+"/ns/net", &st, 0) != nil {
			continue
		}
		if id := (NetnsID{Dev: st.Dev, Ino: st.Ino}); id != leader {
			holders[id] = append(holders[id], Holder{PID: pid, TID: tid})
		}
	}
}

// eachProcess calls fn for every process under procRoot, with its pid, its
// directory's name and a descriptor of procRoot to look under (fstatat:
// no walk of the path from / for each), listing as statefile.EachDirEntry
// does.
func (r *Real) eachProcess(fn func(procfd int, name string, pid int)) error {
	dir, err := os.Open(r.procRoot())
	if err == nil {
		defer dir.Close()
		err = statefile.EachDirEntry(dir, func(e fs.DirEntry) {
			if pid, perr := strconv.Atoi(e.Name()); perr == nil && pid > 0 {
				fn(int(dir.Fd()), e.Name(), pid)
			}
		})
	}
	if err != nil {
		return fmt.Errorf("list processes: %w", err)
	}
	return nil
}

// scanMounts adds the nsfs mounts of network namespaces. A mountinfo line is
// "id parent major:minor root mountpoint options... - fstype source opts";
// for nsfs, root is "net:[<inode>]" and major:minor is the nsfs device.
func (r *Real) scanMounts(holders Holders) error {
	b, err := os.ReadFile(filepath.Join(r.procRoot(), "self", "mountinfo"))
	if err != nil {
		return fmt.Errorf("read mountinfo: %w", err)
	}
	for line := range strings.Lines(string(b)) {
		if id, mount, ok := parseNsfsMount(strings.TrimSuffix(line, "\n")); ok {
			holders[id] = append(holders[id], Holder{Mount: mount})
		}
	}
	return nil
}

func parseNsfsMount(line string) (id NetnsID, mount string, ok bool) {
	pre, post, found := strings.Cut(line, " - ")
	f := strings.Fields(pre)
	if !found || !strings.HasPrefix(post, "nsfs ") || len(f) < 5 {
		return NetnsID{}, "", false
	}
	var major, minor uint32
	if _, err := fmt.Sscanf(f[2]+" "+f[3], "%d:%d net:[%d]", &major, &minor, &id.Ino); err != nil {
		return NetnsID{}, "", false
	}
	id.Dev = unix.Mkdev(major, minor)
	return id, mountinfoUnescaper.Replace(f[4]), true
}

// mountinfoUnescaper undoes the kernel's octal escaping of space, tab,
// newline and backslash in mount points.
var mountinfoUnescaper = strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`)

// ConfirmHolder checks, right before a verdict rests on it, that h still
// holds namespace id — a process may have exited, or moved, since the scan
// — and, when cookie is not zero, that the namespace it holds has that
// cookie (an inode alone may name a younger one: Host.NetnsCookie). It
// fills in the command. When the cookie cannot be read (a user looking at
// its own rootless container from outside lacks the capability setns
// needs), it cannot tell, and says so with an error.
func (r *Real) ConfirmHolder(h Holder, id NetnsID, cookie uint64) (Holder, bool, error) {
	path := h.Mount // or the process's (or its thread's) ns/net link
	task := filepath.Join(r.procRoot(), strconv.Itoa(h.PID))
	if h.TID > 0 {
		task = filepath.Join(task, "task", strconv.Itoa(h.TID))
	}
	if h.PID > 0 {
		path = filepath.Join(task, "ns", "net")
	}
	holds := func() bool {
		var st unix.Stat_t
		return unix.Stat(path, &st) == nil && (NetnsID{Dev: st.Dev, Ino: st.Ino}) == id
	}
	if !holds() {
		return h, false, nil
	}
	if cookie != 0 {
		got, err := r.NetnsCookie(path)
		switch {
		case errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ESRCH):
			return h, false, nil // gone meanwhile
		case err != nil && !holds():
			// It exited (or moved) while its cookie was read, whatever
			// the error said.
			return h, false, nil
		case err != nil:
			return h, false, err
		case got != cookie:
			return h, false, nil
		}
	}
	if h.PID > 0 {
		comm, err := os.ReadFile(filepath.Join(task, "comm"))
		if errors.Is(err, fs.ErrNotExist) {
			return h, false, nil
		}
		// The process names itself: it is shown to operators.
		h.Command = statefile.Printable(strings.TrimSpace(string(comm)))
	}
	return h, true, nil
}

func (r *Real) KillLockHolders(path string) ([]int, error) {
	holders, err := r.FlockHolders(path)
	if err != nil {
		return nil, err
	}
	var killed []int
	var errs []error
	for _, pid := range holders {
		if pid == os.Getpid() {
			continue
		}
		if err := unix.Kill(pid, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("kill pid %d: %w", pid, err))
		} else {
			killed = append(killed, pid)
		}
	}
	return killed, errors.Join(errs...)
}

// FlockHolders are the processes with a descriptor
// on the file at path (same device and inode, by a stat of every
// /proc/<pid>/fd/<n>) through which its exclusive flock is held (a
// "FLOCK ... WRITE" lock line in /proc/<pid>/fdinfo/<n>): descriptors
// inherited from the locker share its lock, which /proc/locks names by
// the locker's pid alone, however long ago it exited.
func (r *Real) FlockHolders(path string) ([]int, error) {
	// Not through a link: what a symlink, or a second hard link, in the
	// file's place names is another file, whose holders are nobody's to
	// kill.
	var target unix.Stat_t
	if err := unix.Lstat(path, &target); err != nil {
		return nil, &os.PathError{Op: "lstat", Path: path, Err: err}
	}
	if target.Nlink > 1 {
		return nil, fmt.Errorf("%s has %d hard links: it may be another file", path, target.Nlink)
	}
	var holders []int
	err := r.eachProcess(func(_ int, name string, pid int) {
		fdDir := filepath.Join(r.procRoot(), name, "fd")
		fds, err := os.ReadDir(fdDir)
		if err != nil {
			return // exited, or a kernel thread
		}
		for _, fd := range fds {
			var st unix.Stat_t
			if unix.Stat(filepath.Join(fdDir, fd.Name()), &st) == nil && st.Dev == target.Dev && st.Ino == target.Ino &&
				holdsExclusiveFlock(filepath.Join(r.procRoot(), name, "fdinfo", fd.Name())) {
				holders = append(holders, pid)
				return
			}
		}
	})
	return holders, err
}

// holdsExclusiveFlock reports whether the fdinfo file of a descriptor shows
// an exclusive flock held through it.
func holdsExclusiveFlock(fdinfo string) bool {
	b, err := os.ReadFile(fdinfo)
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "lock:"); ok {
			f := strings.Fields(rest)
			// "1: FLOCK ADVISORY WRITE pid dev:ino start end"; a waiter's
			// line has "->" before FLOCK.
			if len(f) >= 4 && f[1] == "FLOCK" && f[3] == "WRITE" {
				return true
			}
		}
	}
	return false
}
