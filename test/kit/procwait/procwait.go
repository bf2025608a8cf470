// Package procwait waits for processes to exit without polling: a pidfd
// becomes readable the moment its process exits (a zombie has exited), so
// tests wait on that instead of sleeping and looking again.
package procwait

import (
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"
)

// Exit waits until every process in pids has exited or deadline passes, and
// returns those still running then. A pid that no longer exists has exited.
// A process that cannot be watched is an error.
func Exit(pids []int, deadline time.Time) ([]int, error) {
	type watched struct {
		pid int
		fd  unix.PollFd
	}
	var ws []watched
	defer func() {
		for _, w := range ws {
			unix.Close(int(w.fd.Fd))
		}
	}()
	for _, pid := range pids {
		fd, err := unix.PidfdOpen(pid, 0)
		if errors.Is(err, unix.ESRCH) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("pidfd_open(%d): %w", pid, err)
		}
		ws = append(ws, watched{pid, unix.PollFd{Fd: int32(fd), Events: unix.POLLIN}})
	}
	fds := make([]unix.PollFd, len(ws))
	running := make([]int, 0, len(ws))
	for i, w := range ws {
		fds[i] = w.fd
		running = append(running, w.pid)
	}
	for len(fds) > 0 && time.Now().Before(deadline) {
		_, err := unix.Poll(fds, int(time.Until(deadline).Milliseconds())+1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return running, fmt.Errorf("poll pidfds: %w", err)
		}
		fds, running = stillRunning(fds, running)
	}
	return running, nil
}

// stillRunning keeps the entries whose pidfd is not readable yet.
func stillRunning(fds []unix.PollFd, pids []int) ([]unix.PollFd, []int) {
	keptFDs, keptPIDs := fds[:0], pids[:0]
	for i, f := range fds {
		if f.Revents == 0 {
			keptFDs = append(keptFDs, f)
			keptPIDs = append(keptPIDs, pids[i])
		}
	}
	return keptFDs, keptPIDs
}
