package sysinfo

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

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

// CNIProcesses skips a process that exits during the scan, whose
// environment cannot be read (none: a kernel thread), or whose read takes
// longer than cniPidBound: counting it as a command would keep its
// containers from every sweep for as long as it lives.
func (r *Real) CNIProcesses(containerIDs []string) (map[string]int, error) {
	found := map[string]int{}
	if len(containerIDs) == 0 {
		return found, nil
	}
	pids, err := r.ownProcesses()
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(cniScanBound)
	for _, pid := range pids {
		id, err := r.environContainerID(pid, time.Until(deadline))
		if err != nil {
			return nil, err
		}
		if _, seen := found[id]; !seen && slices.Contains(containerIDs, id) {
			found[id] = pid
		}
	}
	return found, nil
}

// ownProcesses lists the pids of this effective user's processes but this
// one: /proc/<pid> belongs to the process's effective user, and another
// user's process is not one of this user's runtimes.
func (r *Real) ownProcesses() (pids []int, err error) {
	self, euid := os.Getpid(), uint32(os.Geteuid())
	err = r.eachProcess(func(procfd int, name string, pid int) {
		var st unix.Stat_t
		if pid != self && unix.Fstatat(procfd, name, &st, 0) == nil && st.Uid == euid {
			pids = append(pids, pid)
		}
	})
	return pids, err
}

// environContainerID is the CNI_CONTAINERID in pid's environment: "" if
// there is none, or if it cannot be read (exited, not to be read) within
// cniPidBound. The read runs on a goroutine of its own, so that one stuck
// in the kernel is left to end when it can while the scan goes on; when
// the scan has not left it the time (left, of cniScanBound), it fails.
func (r *Real) environContainerID(pid int, left time.Duration) (string, error) {
	read := make(chan string, 1)
	go func() {
		var id string
		b, err := os.ReadFile(filepath.Join(r.procRoot(), strconv.Itoa(pid), "environ"))
		if err == nil {
			id, _ = cniContainerID(b)
		}
		read <- id
	}()
	bound := time.NewTimer(min(cniPidBound, left))
	defer bound.Stop()
	select {
	case id := <-read:
		return id, nil
	case <-bound.C:
	}
	// A read that came back just as the bound ran out is taken.
	select {
	case id := <-read:
		return id, nil
	default:
	}
	if left <= cniPidBound {
		return "", fmt.Errorf("the processes' environments were not read within %v", cniScanBound)
	}
	return "", nil
}

// cniContainerID is the value of CNI_CONTAINERID, the variable a runtime
// sets for every plugin of a chain it runs (CNI spec, "Parameters") and
// that they pass on to theirs, in a NUL-separated environment block.
func cniContainerID(environ []byte) (string, bool) {
	for entry := range bytes.SplitSeq(environ, []byte{0}) {
		if v, ok := bytes.CutPrefix(entry, []byte("CNI_CONTAINERID=")); ok {
			return string(v), true
		}
	}
	return "", false
}
