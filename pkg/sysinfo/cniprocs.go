package sysinfo

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// cniContainerIDVar is the variable a runtime sets for every plugin of a
// chain it runs (CNI spec, "Parameters"), and that they pass on to theirs.
const cniContainerIDVar = "CNI_CONTAINERID="

// cniScanBound bounds the scan of environments: reading another process's
// environment reads its memory, which a process stuck in the kernel with
// its memory map locked can hold up.
const cniScanBound = 2 * time.Second

// CNIProcesses reads the environment of every process of this effective
// user but this one, once. A process that exits during the scan, or whose
// environment cannot be read, is skipped.
func (r *Real) CNIProcesses(containerIDs []string) (map[string]int, error) {
	if len(containerIDs) == 0 {
		return map[string]int{}, nil
	}
	want := make(map[string]bool, len(containerIDs))
	for _, id := range containerIDs {
		want[id] = true
	}
	type outcome struct {
		found map[string]int
		err   error
	}
	// Buffered: a scan that outlives its bound ends without a reader.
	done := make(chan outcome, 1)
	go func() {
		found, err := r.scanEnvirons(want)
		done <- outcome{found, err}
	}()
	select {
	case o := <-done:
		return o.found, o.err
	case <-time.After(cniScanBound):
		return nil, fmt.Errorf("the processes' environments were not read within %v", cniScanBound)
	}
}

func (r *Real) scanEnvirons(want map[string]bool) (map[string]int, error) {
	root := r.procRoot()
	dir, err := os.Open(root)
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	defer dir.Close()
	procfd := int(dir.Fd())
	self, euid := os.Getpid(), uint32(os.Geteuid())
	found := map[string]int{}
	buf := make([]byte, 0, 16<<10)
	for {
		names, err := dir.Readdirnames(1024)
		for _, name := range names {
			pid, perr := strconv.Atoi(name)
			if perr != nil || pid <= 0 || pid == self {
				continue
			}
			// /proc/<pid> belongs to the process's effective user: another
			// user's process is not one of this user's runtimes.
			var st unix.Stat_t
			if unix.Fstatat(procfd, name, &st, 0) != nil || st.Uid != euid {
				continue
			}
			var rerr error
			if buf, rerr = readEnviron(procfd, name, buf[:0]); rerr != nil {
				continue // exited, or not to be read
			}
			if id, ok := cniContainerID(buf); ok && want[id] {
				if _, seen := found[id]; !seen {
					found[id] = pid
				}
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return found, nil
			}
			return nil, fmt.Errorf("list processes: %w", err)
		}
	}
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
