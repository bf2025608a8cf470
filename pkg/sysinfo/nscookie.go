package sysinfo

import (
	"errors"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The nsfs ioctls a namespace's cookie is read with, from outside it.
const (
	// nsGetNSType is NS_GET_NSTYPE (Linux 4.11): the CLONE_NEW* type of
	// the namespace a file names.
	nsGetNSType = 0xb703 // _IO(0xb7, 0x3)
	// nsGetID is NS_GET_ID (Linux 6.18): the namespace's 64-bit id, never
	// reused within a boot. Since that kernel a network namespace's
	// SO_NETNS_COOKIE is that same id (net_cookie is taken from the
	// namespace tree's id generator), which nsIDIsCookie checks once.
	nsGetID = 0x8008b70d // _IOR(0xb7, 13, __u64)
)

// errNoNSGetID is a kernel without NS_GET_ID (or NS_GET_NSTYPE): the
// cookie must be read by entering the namespace.
var errNoNSGetID = errors.New("the kernel has no NS_GET_ID")

// NetnsCookie reads the namespace's id with NS_GET_ID where the kernel
// makes it the cookie: an open and a few syscalls, no capability, and
// nothing entered. Entering the namespace costs a thread and two setns
// (a third of what an ADD added to the floor plugin's own time,
// BENCHMARKS.md), and is what older kernels still need.
func (r *Real) NetnsCookie(path string) (uint64, error) {
	if r.nsIDIsCookie() {
		id, err := netnsID(path)
		if !errors.Is(err, errNoNSGetID) {
			if err != nil {
				return 0, fmt.Errorf("namespace cookie of %s: %w", path, err)
			}
			return id, nil
		}
	}
	return r.cookieInside(path)
}

// nsIDIsCookie reports, once per process, whether this kernel's
// NS_GET_ID of a network namespace is its SO_NETNS_COOKIE: a record keeps
// the cookie, and a cookie read one way must compare equal to one read
// the other way, or a live namespace would look re-created. It compares
// the two for the namespace of a socket of its own (SIOCGSKNS): no path,
// no entering, and no thread of its own to lock.
func (r *Real) nsIDIsCookie() bool {
	r.cookieByID.Do(func() {
		sock, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return
		}
		defer unix.Close(sock)
		cookie, err := unix.GetsockoptUint64(sock, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
		if err != nil {
			return
		}
		nsfd, err := unix.IoctlRetInt(sock, unix.SIOCGSKNS)
		if err != nil {
			return
		}
		defer unix.Close(nsfd)
		id, err := ioctlNSGetID(nsfd)
		r.idIsCookie = err == nil && id == cookie
	})
	return r.idIsCookie
}

// netnsID is NS_GET_ID of the network namespace at path.
func netnsID(path string) (uint64, error) {
	fd, err := openNetns(path)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	return ioctlNSGetID(fd)
}

// ioctlNSGetID is NS_GET_ID of the namespace file open as fd.
func ioctlNSGetID(fd int) (uint64, error) {
	var id uint64
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), nsGetID, uintptr(unsafe.Pointer(&id))); errno != 0 {
		return 0, errNoNSGetID
	}
	return id, nil
}

// openNetns opens the network namespace at path, read-only and without
// blocking: a FIFO planted there cannot hang the caller, and what is not
// nsfs, or (where NS_GET_NSTYPE says) a namespace of another type, is
// ErrNotNetns.
func openNetns(path string) (int, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: path, Err: err}
	}
	var fs unix.Statfs_t
	if err := unix.Fstatfs(fd, &fs); err != nil {
		unix.Close(fd)
		return -1, &os.PathError{Op: "fstatfs", Path: path, Err: err}
	}
	if fs.Type != unix.NSFS_MAGIC {
		unix.Close(fd)
		return -1, fmt.Errorf("%s: %w", path, ErrNotNetns)
	}
	if typ, err := unix.IoctlRetInt(fd, nsGetNSType); err == nil && typ != unix.CLONE_NEWNET {
		unix.Close(fd)
		return -1, fmt.Errorf("%s: a namespace of another type: %w", path, ErrNotNetns)
	}
	return fd, nil
}

// socketNetnsCookie is SO_NETNS_COOKIE (Linux 5.14) of a socket made in
// the calling thread's network namespace.
func socketNetnsCookie() (uint64, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("socket: %w", err)
	}
	defer unix.Close(fd)
	cookie, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
	if err != nil {
		return 0, fmt.Errorf("SO_NETNS_COOKIE: %w", err)
	}
	return cookie, nil
}
