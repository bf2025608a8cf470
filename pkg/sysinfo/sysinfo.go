// Package sysinfo reads the facts the staleness rules rest on: which boot
// this is, when it started, which network namespace a path names, and
// whether a process is still the one that wrote a record. Everything goes
// through the Host interface so the rules can be tested with a fixed clock
// and fake namespaces.
package sysinfo

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/internal/statefile"
)

// NetnsID identifies a network namespace: the device and inode of its nsfs
// file. A namespace re-created at the same path gets a new inode.
type NetnsID struct {
	Dev uint64 `json:"dev"`
	Ino uint64 `json:"ino"`
}

// ErrNotNetns is returned for a path that exists but is not an nsfs mount
// (for example the empty file left when a bind mount went away).
var ErrNotNetns = errors.New("not a network namespace (not nsfs)")

// Host is the source of boot, clock, namespace and process facts.
type Host interface {
	BootID() (string, error)
	BootTime() (time.Time, error)
	Now() time.Time
	// Netns identifies the namespace at path. A missing path gives an error
	// satisfying errors.Is(err, fs.ErrNotExist); a path that is not nsfs
	// gives ErrNotNetns.
	Netns(path string) (NetnsID, error)
	// NetnsCookie is the namespace's SO_NETNS_COOKIE (Linux 5.14+): unlike
	// its inode number, which the kernel hands out again once a namespace
	// is gone, a cookie is never reused within a boot. Reading it means
	// entering the namespace (tens of microseconds, and a capability).
	NetnsCookie(path string) (uint64, error)
	// LinkAddrs are the addresses of the link ifName in the namespace at
	// path, read inside it; none when there is no such link.
	LinkAddrs(path, ifName string) ([]net.IP, error)
	// ProcessStart is the start time (clock ticks since boot, field 22 of
	// /proc/<pid>/stat) of pid; ok is false when there is no such process.
	ProcessStart(pid int) (start uint64, ok bool)
	// NetnsHolders lists, by namespace, the processes and the nsfs mounts
	// that keep network namespaces alive. It is a scan of every process:
	// asked only when a namespace path no longer names its namespace.
	NetnsHolders() (Holders, error)
	// ConfirmHolder checks that h still holds namespace id, whose cookie
	// is cookie (0: not known), and fills in the holder's command. An
	// error means it cannot tell (the cookie cannot be read).
	ConfirmHolder(h Holder, id NetnsID, cookie uint64) (Holder, bool, error)
	// KillLockHolders SIGKILLs every other process with a descriptor on
	// the file at path that holds its exclusive flock, and returns their
	// pids: how a sweep ends the overdue delegates of an ADD whose plugin
	// was killed (they inherited its record, locked). A process that only
	// reads the file is spared. It is a scan of every process's
	// descriptors, asked only then.
	KillLockHolders(path string) ([]int, error)
	// CNIProcesses names, of containerIDs, those a CNI command runs for,
	// each with the pid of one of its processes: a process of this
	// effective user, other than this one, whose environment has
	// CNI_CONTAINERID=<id> (a runtime's DEL in portmap, say). It is a
	// read of every process's environment, bounded in time, asked only
	// before a sweep deletes portmap's chain of a container.
	CNIProcesses(containerIDs []string) (map[string]int, error)
}

// Real reads the running kernel. Boot facts are read once per process.
type Real struct {
	bootID   string
	bootTime time.Time
	// ProcRoot is where processes are read from; "" means /proc.
	ProcRoot string
}

var _ Host = (*Real)(nil)

// BootID is /proc/sys/kernel/random/boot_id: a new random UUID every boot.
func (r *Real) BootID() (string, error) {
	if r.bootID == "" {
		b, err := statefile.ReadFileNoFollow("/proc/sys/kernel/random/boot_id")
		if err != nil {
			return "", fmt.Errorf("read boot id: %w", err)
		}
		r.bootID = strings.TrimSpace(string(b))
	}
	return r.bootID, nil
}

// BootTime is btime from /proc/stat, the wall-clock second the kernel booted.
func (r *Real) BootTime() (time.Time, error) {
	if r.bootTime.IsZero() {
		b, err := os.ReadFile("/proc/stat")
		if err != nil {
			return time.Time{}, fmt.Errorf("read /proc/stat: %w", err)
		}
		if r.bootTime, err = parseBtime(b); err != nil {
			return time.Time{}, err
		}
	}
	return r.bootTime, nil
}

func parseBtime(stat []byte) (time.Time, error) {
	for _, line := range bytes.Split(stat, []byte("\n")) {
		if rest, ok := bytes.CutPrefix(line, []byte("btime ")); ok {
			sec, err := strconv.ParseInt(string(bytes.TrimSpace(rest)), 10, 64)
			if err != nil {
				return time.Time{}, fmt.Errorf("parse btime %q: %w", rest, err)
			}
			return time.Unix(sec, 0), nil
		}
	}
	return time.Time{}, errors.New("no btime line in /proc/stat")
}

func (r *Real) Now() time.Time { return time.Now() }

func (r *Real) Netns(path string) (NetnsID, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return NetnsID{}, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(path, &fs); err != nil {
		return NetnsID{}, &os.PathError{Op: "statfs", Path: path, Err: err}
	}
	if fs.Type != unix.NSFS_MAGIC {
		return NetnsID{}, fmt.Errorf("%s: %w", path, ErrNotNetns)
	}
	return NetnsID{Dev: st.Dev, Ino: st.Ino}, nil
}

func (r *Real) ProcessStart(pid int) (uint64, bool) {
	b, err := statefile.ReadFileNoFollow("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	start, err := parseStartTime(b)
	return start, err == nil
}

// parseStartTime reads field 22 of /proc/<pid>/stat. The command name (field
// 2) is in parentheses and may itself contain spaces and parentheses, so
// fields are counted from the last ')'.
func parseStartTime(stat []byte) (uint64, error) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, errors.New("malformed /proc/pid/stat")
	}
	fields := strings.Fields(string(stat[i+1:]))
	// fields[0] is field 3 (state); field 22 is fields[19].
	if len(fields) < 20 {
		return 0, errors.New("short /proc/pid/stat")
	}
	return strconv.ParseUint(fields[19], 10, 64)
}
