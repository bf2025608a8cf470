package sysinfo

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// cniContainerIDVar is the variable a runtime sets for every plugin of a
// chain it runs (CNI spec, "Parameters"), and that they pass on to theirs.
const cniContainerIDVar = "CNI_CONTAINERID="

// cniScanBound bounds the scan of environments, and cniPidBound the read
// of one: reading another process's environment reads its memory, which a
// process stuck in the kernel with its memory map locked (faulting on a
// hung NFS mount, say: what makes `ps` hang) holds up. Such a process is
// passed over after cniPidBound, and the scan goes on without it; a scan
// that takes longer than cniScanBound in all fails.
const (
	cniScanBound = 2 * time.Second
	cniPidBound  = 200 * time.Millisecond
)

// CNIProcesses reads the environment of every process of this effective
// user but this one, once. A process that exits during the scan, whose
// environment cannot be read (none: a kernel thread), or whose read takes
// longer than cniPidBound, is skipped: counting it as a command would keep
// its containers from every sweep for as long as it lives.
func (r *Real) CNIProcesses(containerIDs []string) (map[string]int, error) {
	found := map[string]int{}
	if len(containerIDs) == 0 {
		return found, nil
	}
	want := make(map[string]bool, len(containerIDs))
	for _, id := range containerIDs {
		want[id] = true
	}
	procfd, pids, err := r.ownProcesses()
	if err != nil {
		return nil, err
	}
	defer unix.Close(procfd)
	take := func(e environRead) {
		if want[e.containerID] {
			if _, seen := found[e.containerID]; !seen {
				found[e.containerID] = e.pid
			}
		}
	}
	deadline := time.NewTimer(cniScanBound)
	defer deadline.Stop()
	stuck := time.NewTimer(cniPidBound)
	defer stuck.Stop()
	// next is the first pid not yet read: a read that has not come back
	// within cniPidBound is stuck on it, and a new reader starts after it.
	for next := 0; next < len(pids); next++ {
		read, err := r.readEnvirons(procfd, pids[next:])
		if err != nil {
			return nil, err
		}
	reading:
		for {
			stuck.Reset(cniPidBound)
			var e environRead
			var ok bool
			select {
			case e, ok = <-read:
			case <-deadline.C:
				return nil, fmt.Errorf("the processes' environments were not read within %v", cniScanBound)
			case <-stuck.C:
				// A read that came back just as the bound ran out is taken.
				select {
				case e, ok = <-read:
				default:
					break reading
				}
			}
			if !ok {
				return found, nil
			}
			take(e)
			next++
		}
	}
	return found, nil
}

// ownProcesses lists the pids of this effective user's processes but this
// one: /proc/<pid> belongs to the process's effective user, and another
// user's process is not one of this user's runtimes. The directory stays
// open for the reads (and for a read left stuck: it is the process's
// to close at exit).
func (r *Real) ownProcesses() (procfd int, pids []int, err error) {
	dir, err := os.Open(r.procRoot())
	if err != nil {
		return -1, nil, fmt.Errorf("list processes: %w", err)
	}
	names, err := dir.Readdirnames(-1)
	if err != nil {
		dir.Close()
		return -1, nil, fmt.Errorf("list processes: %w", err)
	}
	fd, err := unix.Dup(int(dir.Fd()))
	dir.Close()
	if err != nil {
		return -1, nil, fmt.Errorf("list processes: %w", err)
	}
	self, euid := os.Getpid(), uint32(os.Geteuid())
	for _, name := range names {
		pid, perr := strconv.Atoi(name)
		if perr != nil || pid <= 0 || pid == self {
			continue
		}
		var st unix.Stat_t
		if unix.Fstatat(fd, name, &st, 0) != nil || st.Uid != euid {
			continue
		}
		pids = append(pids, pid)
	}
	return fd, pids, nil
}

// environRead is what readEnvirons read of one process: the
// CNI_CONTAINERID in its environment ("" if none, or if it cannot be read).
type environRead struct {
	pid         int
	containerID string
}

// readEnvirons reads the environments of pids in order, on a goroutine of
// its own with its own descriptor of the /proc directory, and sends the
// CNI_CONTAINERID of each. The channel holds them all: a
// reader that gives up on a stuck process never blocks the goroutine,
// which ends, and closes its descriptor, once that read returns.
func (r *Real) readEnvirons(procfd int, pids []int) (<-chan environRead, error) {
	fd, err := unix.Dup(procfd)
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	out := make(chan environRead, len(pids))
	go func() {
		defer close(out)
		defer unix.Close(fd)
		buf := make([]byte, 0, 16<<10)
		for _, pid := range pids {
			var id string
			b, err := readEnviron(fd, strconv.Itoa(pid), buf[:0])
			if err == nil { // else exited, or not to be read
				id, _ = cniContainerID(b)
			}
			out <- environRead{pid: pid, containerID: id}
			buf = b
		}
	}()
	return out, nil
}

// readEnviron appends /proc/<pid>/environ to buf.
func readEnviron(procfd int, pid string, buf []byte) ([]byte, error) {
	fd, err := unix.Openat(procfd, pid+"/environ", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return buf, err
	}
	defer unix.Close(fd)
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := unix.Read(fd, buf[len(buf):cap(buf)])
		if n > 0 {
			buf = buf[:len(buf)+n]
		}
		if err == unix.EINTR {
			continue
		}
		if err != nil || n == 0 {
			return buf, err
		}
	}
}

// cniContainerID is the value of CNI_CONTAINERID in a NUL-separated
// environment block.
func cniContainerID(environ []byte) (string, bool) {
	for len(environ) > 0 {
		entry := environ
		if i := bytes.IndexByte(environ, 0); i >= 0 {
			entry, environ = environ[:i], environ[i+1:]
		} else {
			environ = nil
		}
		if v, ok := bytes.CutPrefix(entry, []byte(cniContainerIDVar)); ok {
			return string(v), true
		}
	}
	return "", false
}
