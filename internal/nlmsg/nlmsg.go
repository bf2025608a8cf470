// Package nlmsg is the little of netlink the plugin speaks itself: a raw
// socket that sends requests and hands back the messages of their
// answers, and attributes walked and appended in place. It serves
// nftables (pkg/netfilter: rule dumps and deletions) and rtnetlink
// (pkg/sysinfo: a link's addresses); a general netlink library cost every
// verb's start-up its package init (BENCHMARKS.md, "Cold start").
package nlmsg

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Conn is a netlink socket and the sequence number of its last request.
type Conn struct {
	FD  int
	Seq uint32
	buf []byte
}

// Dial opens and binds a netlink socket of protocol proto (e.g.
// unix.NETLINK_ROUTE) whose answers are read bufSize bytes at a time.
func Dial(proto, bufSize int) (*Conn, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
	if err != nil {
		return nil, fmt.Errorf("netlink socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("netlink bind: %w", err)
	}
	return &Conn{FD: fd, buf: make([]byte, bufSize)}, nil
}

// Close closes the socket.
func (c *Conn) Close() error { return unix.Close(c.FD) }

// Send sends one datagram (one or more messages) to the kernel.
func (c *Conn) Send(msg []byte) error {
	if err := unix.Sendto(c.FD, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("netlink send: %w", err)
	}
	return nil
}

// Receive reads messages and hands each to fn, until fn says it is done
// or returns an error.
func (c *Conn) Receive(fn func(h *unix.NlMsghdr, msg []byte) (done bool, err error)) error {
	for {
		n, _, err := unix.Recvfrom(c.FD, c.buf, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("netlink receive: %w", err)
		}
		b := c.buf[:n]
		for len(b) >= unix.NLMSG_HDRLEN {
			h := *(*unix.NlMsghdr)(unsafe.Pointer(&b[0]))
			if h.Len < unix.NLMSG_HDRLEN || int(h.Len) > len(b) {
				return errors.New("netlink: malformed message")
			}
			msg := b[unix.NLMSG_HDRLEN:h.Len]
			b = b[min(Align(int(h.Len)), len(b)):]
			if done, err := fn(&h, msg); done || err != nil {
				return err
			}
		}
	}
}

// PutHeader writes msg's header: its whole length, type, flags and
// sequence number.
func PutHeader(msg []byte, typ, flags uint16, seq uint32) {
	*(*unix.NlMsghdr)(unsafe.Pointer(&msg[0])) = unix.NlMsghdr{Len: uint32(len(msg)), Type: typ, Flags: flags, Seq: seq}
}

// Errno is an NLMSG_ERROR's error number (0: an acknowledgement).
func Errno(msg []byte) (unix.Errno, error) {
	if len(msg) < 4 {
		return 0, errors.New("netlink: short error message")
	}
	return unix.Errno(-int32(NativeUint32(msg))), nil
}

// Netlink attributes, walked in place: a 4-byte header (length, type,
// native order), the payload, padding to 4 bytes.
func Align(n int) int { return (n + 3) &^ 3 }

// NativeUint32 is the first four bytes of b in the host's order.
func NativeUint32(b []byte) uint32 { return *(*uint32)(unsafe.Pointer(&b[0])) }

// EachAttr calls fn with each attribute's type (nested flag cleared) and
// payload; it reports whether b was well formed.
func EachAttr(b []byte, fn func(typ uint16, data []byte)) bool {
	for len(b) >= unix.SizeofNlAttr {
		l := int(*(*uint16)(unsafe.Pointer(&b[0])))
		typ := *(*uint16)(unsafe.Pointer(&b[2])) &^ (unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)
		if l < unix.SizeofNlAttr || l > len(b) {
			return false
		}
		fn(typ, b[unix.SizeofNlAttr:l])
		b = b[min(Align(l), len(b)):]
	}
	return len(b) == 0
}

// AppendAttr appends one attribute, padded.
func AppendAttr(b []byte, typ uint16, data []byte) []byte {
	l := unix.SizeofNlAttr + len(data)
	b = binary.NativeEndian.AppendUint16(b, uint16(l))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = append(b, data...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// AppendStringAttr appends a NUL-terminated string attribute, padded.
func AppendStringAttr(b []byte, typ uint16, s string) []byte {
	l := unix.SizeofNlAttr + len(s) + 1
	b = binary.NativeEndian.AppendUint16(b, uint16(l))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = append(b, s...)
	b = append(b, 0)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}
