//go:build linux && amd64

package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Every thread and child is followed: bridge, host-local and iptables are
// all part of the tree a runtime's kill -9 takes down. EXITKILL: if syskill
// dies, so does the tree, never left stopped.
const ptraceOptions = unix.PTRACE_O_TRACESYSGOOD | unix.PTRACE_O_TRACEFORK | unix.PTRACE_O_TRACEVFORK |
	unix.PTRACE_O_TRACECLONE | unix.PTRACE_O_TRACEEXEC | unix.PTRACE_O_EXITKILL

// syscallStopSig is a syscall-stop's signal under PTRACE_O_TRACESYSGOOD.
const syscallStopSig = unix.SIGTRAP | 0x80

// syscallInfo is struct ptrace_syscall_info (linux/ptrace.h) with its
// union's entry member. The kernel says itself whether a stop is an entry
// or an exit: no per-thread toggle to lose track of (a thread that execs
// takes over its leader's tid, a new tracee starts outside any call).
type syscallInfo struct {
	Op   uint8
	_    [3]uint8
	Arch uint32
	IP   uint64
	SP   uint64
	Nr   uint64
	Args [6]uint64
	_    [8]byte // the union's longest member (seccomp) is 4 bytes longer, padded
}

const syscallInfoEntry = 1 // PTRACE_SYSCALL_INFO_ENTRY

// calls maps the counted amd64 system calls to their names and classes.
var calls = map[uint64]struct{ name, class string }{
	unix.SYS_UNLINK:    {"unlink", "unlink"},
	unix.SYS_UNLINKAT:  {"unlinkat", "unlink"},
	unix.SYS_RENAME:    {"rename", "rename"},
	unix.SYS_RENAMEAT:  {"renameat", "rename"},
	unix.SYS_RENAMEAT2: {"renameat2", "rename"},
	unix.SYS_OPEN:      {"open", "create"},
	unix.SYS_OPENAT:    {"openat", "create"},
	unix.SYS_OPENAT2:   {"openat2", "create"},
	unix.SYS_CREAT:     {"creat", "create"},
	unix.SYS_WRITE:     {"write", "write"},
	unix.SYS_PWRITE64:  {"pwrite64", "write"},
	unix.SYS_WRITEV:    {"writev", "write"},
	unix.SYS_FLOCK:     {"flock", "flock"},
	unix.SYS_FCNTL:     {"fcntl", "flock"},
	unix.SYS_SENDTO:    {"sendto", "nlsend"},
	unix.SYS_SENDMSG:   {"sendmsg", "nlsend"},
	unix.SYS_EXECVE:    {"execve", "exec"},
	unix.SYS_EXECVEAT:  {"execveat", "exec"},
}

type tracer struct {
	options
	count   int
	byClass map[string]int
	at      *hit
	killed  bool
	// tids are the tracees not yet reported dead; fresh are those whose
	// first stop, the SIGSTOP of being auto-attached, is still to come.
	tids, fresh map[int]bool
}

// trace runs o.argv under ptrace until every tracee is gone and returns
// the report and the exit status.
func trace(o options) (report, int, error) {
	// The tracer is the thread that started the program: every ptrace
	// call must come from it, so this goroutine keeps it to the end.
	runtime.LockOSThread()
	// Orphans of the tree (a plugin whose runtime was killed) are ours to
	// reap, not init's: when syskill exits, no pid of the tree is left,
	// not even a zombie. An init that reaps late (some sandboxes' does
	// so about once a second) would leave the killed plugin's pid looking
	// alive to the next command that checks it.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return report{}, 0, fmt.Errorf("PR_SET_CHILD_SUBREAPER: %w", err)
	}
	cmd := exec.Command(o.argv[0], o.argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Ptrace: true}
	if err := cmd.Start(); err != nil {
		return report{}, 0, err
	}
	pid := cmd.Process.Pid
	// The first stop is the SIGTRAP of its exec under PTRACE_TRACEME.
	var ws unix.WaitStatus
	if _, err := wait4(pid, &ws); err != nil {
		return report{}, 0, err
	}
	if !ws.Stopped() {
		return report{}, 0, fmt.Errorf("%s did not stop after its exec (wait status %#x)", o.argv[0], ws)
	}
	if err := unix.PtraceSetOptions(pid, ptraceOptions); err != nil {
		return report{}, 0, fmt.Errorf("PTRACE_SETOPTIONS: %w", err)
	}
	t := &tracer{options: o, byClass: map[string]int{}, tids: map[int]bool{pid: true}, fresh: map[int]bool{}}
	t.resume(pid, 0)

	status := 0
	for {
		tid, err := wait4(-1, &ws)
		if errors.Is(err, unix.ECHILD) {
			break // every tracee is gone, and reaped
		}
		if err != nil {
			return report{}, 0, err
		}
		switch {
		case ws.Exited(), ws.Signaled():
			delete(t.tids, tid)
			delete(t.fresh, tid)
			if tid == pid {
				status = ws.ExitStatus()
				if ws.Signaled() {
					status = 128 + int(ws.Signal())
				}
			}
			continue
		case !ws.Stopped():
			continue
		}
		if t.killed {
			// Nothing runs again. A stopped tracee dies of the SIGKILL
			// already sent; one that shows up only now (forked just
			// before the kill) is killed on sight.
			if !t.tids[tid] {
				t.tids[tid] = true
				_ = unix.Kill(tid, unix.SIGKILL)
			}
			continue
		}
		if !t.tids[tid] {
			// A new tracee whose first stop came before its parent's
			// fork/clone event.
			t.tids[tid], t.fresh[tid] = true, true
		}
		switch sig := ws.StopSignal(); {
		case sig == syscallStopSig:
			t.syscallStop(tid)
			if !t.killed {
				t.resume(tid, 0)
			}
		case sig == unix.SIGTRAP && ws.TrapCause() > 0:
			t.event(tid, ws.TrapCause())
			t.resume(tid, 0)
		case sig == unix.SIGSTOP && t.fresh[tid]:
			delete(t.fresh, tid) // the auto-attach stop: not a real signal
			t.resume(tid, 0)
		case groupStop(tid):
			// Without PTRACE_SEIZE a group-stop cannot be kept; resume
			// as strace does without seize.
			t.resume(tid, 0)
		default:
			t.resume(tid, int(sig)) // a real signal: deliver it
		}
	}
	rep := report{Killed: t.killed, Count: t.count, At: t.at, ByClass: t.byClass}
	if t.killed {
		return rep, 128 + int(unix.SIGKILL), nil
	}
	return rep, status, nil
}

func wait4(pid int, ws *unix.WaitStatus) (int, error) {
	for {
		tid, err := unix.Wait4(pid, ws, unix.WALL, nil)
		if err != unix.EINTR {
			return tid, err
		}
	}
}

// resume lets tid run to its next syscall entry or exit. A tracee killed
// meanwhile (a thread of an exiting process) is no error.
func (t *tracer) resume(tid, sig int) {
	if err := unix.PtraceSyscall(tid, sig); err != nil && err != unix.ESRCH {
		fmt.Fprintf(os.Stderr, "syskill: resume %d: %v\n", tid, err)
	}
}

// groupStop reports whether tid's stop is a group-stop rather than a
// signal-delivery-stop: only the latter has a siginfo.
func groupStop(tid int) bool {
	var si [128]byte
	_, _, errno := syscall.Syscall6(syscall.SYS_PTRACE, unix.PTRACE_GETSIGINFO, uintptr(tid), 0, uintptr(unsafe.Pointer(&si[0])), 0, 0)
	return errno == unix.EINVAL
}

// event notes a new tracee (fork, vfork, clone) or a thread that took over
// its leader's tid in an exec.
func (t *tracer) event(tid, cause int) {
	msg, err := unix.PtraceGetEventMsg(tid)
	if err != nil {
		return
	}
	other := int(msg)
	switch cause {
	case unix.PTRACE_EVENT_FORK, unix.PTRACE_EVENT_VFORK, unix.PTRACE_EVENT_CLONE:
		if !t.tids[other] {
			t.tids[other], t.fresh[other] = true, true
		}
	case unix.PTRACE_EVENT_EXEC:
		if other != tid {
			delete(t.tids, other)
			delete(t.fresh, other)
		}
	}
}

// syscallStop counts tid's call if it is one of the chosen classes, and
// kills the tree at the K-th.
func (t *tracer) syscallStop(tid int) {
	var si syscallInfo
	_, _, errno := syscall.Syscall6(syscall.SYS_PTRACE, unix.PTRACE_GET_SYSCALL_INFO, uintptr(tid), unsafe.Sizeof(si), uintptr(unsafe.Pointer(&si)), 0, 0)
	if errno != 0 || si.Op != syscallInfoEntry || si.Arch != unix.AUDIT_ARCH_X86_64 {
		return
	}
	c, ok := calls[si.Nr]
	if !ok || !t.calls[c.class] || !counts(tid, si) {
		return
	}
	t.count++
	t.byClass[c.class]++
	if t.log == nil && t.count != t.k {
		return
	}
	h := hit{K: t.count, PID: tgid(tid), TID: tid, Comm: comm(tid), Call: c.name, Class: c.class, Detail: detail(tid, si)}
	if t.log != nil {
		_ = t.log.Encode(h)
	}
	if t.count == t.k {
		t.at = &h
		t.killAll()
	}
}

// counts applies the conditions within a class: only creating opens, only
// fcntl's locks, only netlink sends.
func counts(tid int, si syscallInfo) bool {
	a := si.Args
	switch si.Nr {
	case unix.SYS_OPEN:
		return a[1]&unix.O_CREAT != 0
	case unix.SYS_OPENAT:
		return a[2]&unix.O_CREAT != 0
	case unix.SYS_OPENAT2:
		var flags [8]byte // struct open_how's first member
		return readMem(tid, a[2], flags[:]) == nil && *(*uint64)(unsafe.Pointer(&flags))&unix.O_CREAT != 0
	case unix.SYS_FCNTL:
		switch a[1] {
		case unix.F_SETLK, unix.F_SETLKW, unix.F_OFD_SETLK, unix.F_OFD_SETLKW:
			return true
		}
		return false
	case unix.SYS_SENDTO, unix.SYS_SENDMSG:
		proto, err := netlinkProtocol(tid, int(a[0]))
		if err != nil {
			fmt.Fprintf(os.Stderr, "syskill: cannot tell the family of fd %d of %d, not counted: %v\n", a[0], tid, err)
		}
		return proto >= 0
	}
	return true
}

// netlinkProtocol is the netlink protocol of tid's socket fd, -1 if it is
// no netlink socket. It asks a copy of the fd: /proc/<pid>/net/netlink
// lists the thread's current namespace, not necessarily the socket's.
func netlinkProtocol(tid, fd int) (int, error) {
	pidfd, err := unix.PidfdOpen(tgid(tid), 0)
	if err != nil {
		return -1, err
	}
	defer unix.Close(pidfd)
	cp, err := unix.PidfdGetfd(pidfd, fd, 0)
	if err != nil {
		return -1, err
	}
	defer unix.Close(cp)
	domain, err := unix.GetsockoptInt(cp, unix.SOL_SOCKET, unix.SO_DOMAIN)
	if err != nil || domain != unix.AF_NETLINK {
		return -1, err
	}
	return unix.GetsockoptInt(cp, unix.SOL_SOCKET, unix.SO_PROTOCOL)
}

// detail says what a counted call is about: paths, or the fd and what it
// is open on.
func detail(tid int, si syscallInfo) string {
	a := si.Args
	const cwd = unix.AT_FDCWD
	switch si.Nr {
	case unix.SYS_UNLINK, unix.SYS_OPEN, unix.SYS_CREAT, unix.SYS_EXECVE:
		return pathAt(tid, cwd, a[0])
	case unix.SYS_UNLINKAT, unix.SYS_OPENAT, unix.SYS_OPENAT2, unix.SYS_EXECVEAT:
		return pathAt(tid, int32(a[0]), a[1])
	case unix.SYS_RENAME:
		return pathAt(tid, cwd, a[0]) + " -> " + pathAt(tid, cwd, a[1])
	case unix.SYS_RENAMEAT, unix.SYS_RENAMEAT2:
		return pathAt(tid, int32(a[0]), a[1]) + " -> " + pathAt(tid, int32(a[2]), a[3])
	case unix.SYS_SENDTO, unix.SYS_SENDMSG:
		proto, _ := netlinkProtocol(tid, int(a[0]))
		return fmt.Sprintf("fd %d netlink protocol %d", a[0], proto)
	}
	return fdName(tid, int32(a[0]))
}

func fdName(tid int, fd int32) string {
	target, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%d", tid, fd))
	return fmt.Sprintf("fd %d %s", fd, target)
}

// pathAt is the path at addr in tid's memory, made absolute against dirfd.
func pathAt(tid int, dirfd int32, addr uint64) string {
	p := readString(tid, addr)
	if p == "" || filepath.IsAbs(p) {
		return p
	}
	dir := fmt.Sprintf("/proc/%d/cwd", tid)
	if dirfd != unix.AT_FDCWD {
		dir = fmt.Sprintf("/proc/%d/fd/%d", tid, dirfd)
	}
	if base, err := os.Readlink(dir); err == nil {
		return filepath.Join(base, p)
	}
	return p
}

// readString reads a NUL-terminated string of at most 4 KiB, in 256-byte
// aligned pieces: a read must not cross into an unmapped page.
func readString(tid int, addr uint64) string {
	var out []byte
	buf := make([]byte, 256)
	for len(out) < 4096 {
		piece := buf[:256-addr%256]
		if readMem(tid, addr, piece) != nil {
			break
		}
		if i := strings.IndexByte(string(piece), 0); i >= 0 {
			return string(append(out, piece[:i]...))
		}
		out = append(out, piece...)
		addr += uint64(len(piece))
	}
	return string(out)
}

func readMem(tid int, addr uint64, buf []byte) error {
	local := []unix.Iovec{{Base: &buf[0]}}
	local[0].SetLen(len(buf))
	n, err := unix.ProcessVMReadv(tid, local, []unix.RemoteIovec{{Base: uintptr(addr), Len: len(buf)}}, 0)
	if err == nil && n != len(buf) {
		err = fmt.Errorf("short read at %#x", addr)
	}
	return err
}

func comm(tid int) string {
	raw, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", tid))
	return strings.TrimSpace(string(raw))
}

// tgid is the process (thread group) of thread tid.
func tgid(tid int) int {
	raw, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", tid))
	for line := range strings.SplitSeq(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "Tgid:"); ok {
			if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil {
				return n
			}
		}
	}
	return tid
}

// killAll SIGKILLs every tracee's process, as kill -9 of the runtime and
// all it started would; by pid, not process group (plugins may lead their
// own). The thread at the K-th call is in its entry stop, and the kernel
// skips a call whose entry stop ends with a fatal signal pending. A tracee
// that entered a call after it waits in that entry stop, never resumed,
// and dies there too: no call entered after the K-th one runs (only those
// entered before it may still finish).
func (t *tracer) killAll() {
	t.killed = true
	for tid := range t.tids {
		_ = unix.Kill(tid, unix.SIGKILL) // a thread's tid names its whole process
	}
}
