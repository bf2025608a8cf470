package sysinfo

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"
)

// LinkAddrs asks from outside the namespace where the kernel can answer
// for another namespace (rtnetlink's target netnsid, Linux 4.20): a link
// by name, then its addresses, over one socket. Entering the namespace
// costs a thread and two setns, a third of what a DEL added to the floor
// plugin's own time (BENCHMARKS.md); it is what is left for a namespace
// the host has no id for, and for older kernels.
func (r *Real) LinkAddrs(path, ifName string) ([]net.IP, error) {
	fd, err := openNetns(path)
	if err != nil {
		return nil, fmt.Errorf("addresses of %s in %s: %w", ifName, path, err)
	}
	defer unix.Close(fd)
	ips, err := linkAddrsOutside(fd, ifName)
	if errors.Is(err, errNotFromOutside) {
		ips, err = linkAddrsInside("/proc/self/fd/"+strconv.Itoa(fd), ifName)
	}
	if err != nil {
		return nil, fmt.Errorf("addresses of %s in %s: %w", ifName, path, err)
	}
	return ips, nil
}

// linkAddrsInside asks with the standard library's netlink dump
// (net.Interfaces), made on the thread that entered the namespace: a
// netlink library linked for this one question cost every verb's
// start-up its package init.
func linkAddrsInside(path, ifName string) ([]net.IP, error) {
	var ips []net.IP
	err := ns.WithNetNSPath(path, func(ns.NetNS) error {
		links, err := net.Interfaces()
		if err != nil {
			return err
		}
		i := slices.IndexFunc(links, func(l net.Interface) bool { return l.Name == ifName })
		if i < 0 {
			return nil
		}
		addrs, err := links[i].Addrs()
		if err != nil {
			return err
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				ips = append(ips, n.IP)
			}
		}
		return nil
	})
	return ips, nsError(err)
}

// errNotFromOutside is a question the kernel cannot answer from outside
// the namespace: no id for it here, an older kernel, or an answer that
// does not say it is about the namespace asked.
var errNotFromOutside = errors.New("cannot ask from outside the namespace")

// linkAddrsOutside reads the addresses of the link ifName in the
// namespace open as nsfd, none when it has no such link. Every answer
// must carry the target netnsid asked for: a kernel that ignored it
// would answer about this namespace's link of the same name.
func linkAddrsOutside(nsfd int, ifName string) ([]net.IP, error) {
	c, err := dialRoute()
	if err != nil {
		return nil, err
	}
	defer unix.Close(c.fd)
	nsid, err := c.netnsid(nsfd)
	if err != nil {
		return nil, err
	}
	index, err := c.linkIndex(nsid, ifName)
	if err != nil || index == 0 {
		return nil, err
	}
	return c.addrs(nsid, index)
}

// routeTimeout bounds the wait for each rtnetlink answer.
const routeTimeout = 5 * time.Second

// routeConn is an rtnetlink socket with strict checking of requests, which
// a dump needs for its target netnsid and its link filter to be read.
type routeConn struct {
	fd  int
	seq uint32
}

func dialRoute() (*routeConn, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("rtnetlink socket: %w", err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_GET_STRICT_CHK, 1); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("%w: strict checking: %v", errNotFromOutside, err)
	}
	// The kernel answers every request; a bound keeps a DEL from hanging
	// on one that got lost (a DEL that cannot tell lists the NAT rules).
	tv := unix.NsecToTimeval(routeTimeout.Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("rtnetlink receive timeout: %w", err)
	}
	return &routeConn{fd: fd}, nil
}

// netnsid is the id this namespace has for the one open as nsfd
// (RTM_GETNSID, which assigns none: the kernel gives one when a link
// joins the two, as bridge's veth does).
func (c *routeConn) netnsid(nsfd int) (int32, error) {
	req := newRouteRequest(unix.RTM_GETNSID, 0, make([]byte, 4)) // rtgenmsg, AF_UNSPEC
	req = appendUint32Attr(req, unix.NETNSA_FD, uint32(nsfd))
	nsid := int32(-1)
	err := c.ask(req, func(typ uint16, body []byte) error {
		if typ != unix.RTM_NEWNSID || len(body) < 4 {
			return fmt.Errorf("%w: unexpected answer %d to RTM_GETNSID", errNotFromOutside, typ)
		}
		if v, ok := routeAttr(body[4:], unix.NETNSA_NSID); ok && len(v) == 4 {
			nsid = int32(binary.NativeEndian.Uint32(v))
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("%w: %v", errNotFromOutside, err)
	}
	if nsid < 0 {
		return 0, fmt.Errorf("%w: the namespace has no id here", errNotFromOutside)
	}
	return nsid, nil
}

// linkIndex is the index of the link ifName in the namespace nsid, 0 when
// there is none.
func (c *routeConn) linkIndex(nsid int32, ifName string) (int32, error) {
	req := newRouteRequest(unix.RTM_GETLINK, 0, make([]byte, unix.SizeofIfInfomsg))
	req = appendUint32Attr(req, unix.IFLA_TARGET_NETNSID, uint32(nsid))
	req = appendRouteAttr(req, unix.IFLA_IFNAME, append([]byte(ifName), 0))
	var index int32
	err := c.ask(req, func(typ uint16, body []byte) error {
		if typ != unix.RTM_NEWLINK || len(body) < unix.SizeofIfInfomsg {
			return fmt.Errorf("%w: unexpected answer %d to RTM_GETLINK", errNotFromOutside, typ)
		}
		if !answersFor(body[unix.SizeofIfInfomsg:], unix.IFLA_TARGET_NETNSID, nsid) {
			return fmt.Errorf("%w: the link's answer is not about namespace %d", errNotFromOutside, nsid)
		}
		index = int32(binary.NativeEndian.Uint32(body[4:8]))
		return nil
	})
	if errors.Is(err, unix.ENODEV) {
		return 0, nil
	}
	return index, err
}

// addrs lists the addresses of link index in the namespace nsid, both
// families, as the standard library reads them: the local address where
// there is one (a point-to-point link), else the address.
func (c *routeConn) addrs(nsid, index int32) ([]net.IP, error) {
	ifa := make([]byte, unix.SizeofIfAddrmsg) // AF_UNSPEC: both families
	binary.NativeEndian.PutUint32(ifa[4:], uint32(index))
	req := newRouteRequest(unix.RTM_GETADDR, unix.NLM_F_DUMP, ifa)
	req = appendUint32Attr(req, unix.IFA_TARGET_NETNSID, uint32(nsid))
	var ips []net.IP
	err := c.ask(req, func(typ uint16, body []byte) error {
		if typ != unix.RTM_NEWADDR || len(body) < unix.SizeofIfAddrmsg {
			return fmt.Errorf("%w: unexpected answer %d to RTM_GETADDR", errNotFromOutside, typ)
		}
		attrs := body[unix.SizeofIfAddrmsg:]
		if !answersFor(attrs, unix.IFA_TARGET_NETNSID, nsid) {
			return fmt.Errorf("%w: the address's answer is not about namespace %d", errNotFromOutside, nsid)
		}
		if int32(binary.NativeEndian.Uint32(body[4:8])) != index {
			return nil // a kernel that did not filter by link
		}
		ip, ok := routeAttr(attrs, unix.IFA_LOCAL)
		if !ok {
			ip, ok = routeAttr(attrs, unix.IFA_ADDRESS)
		}
		if ok && (len(ip) == net.IPv4len || len(ip) == net.IPv6len) {
			ips = append(ips, net.IP(slices.Clone(ip)))
		}
		return nil
	})
	if errors.Is(err, unix.ENODEV) {
		return nil, nil // the link went meanwhile
	}
	return ips, err
}

// ask sends req and hands each message of its answer to fn: one message,
// or a dump to its NLMSG_DONE. An NLMSG_ERROR is its errno.
func (c *routeConn) ask(req []byte, fn func(typ uint16, body []byte) error) error {
	c.seq++
	seq := c.seq
	binary.NativeEndian.PutUint32(req[8:], seq)
	dump := binary.NativeEndian.Uint16(req[6:])&unix.NLM_F_DUMP != 0
	if err := unix.Sendto(c.fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("rtnetlink send: %w", err)
	}
	buf := make([]byte, 32<<10)
	var ferr error
	for {
		n, _, err := unix.Recvfrom(c.fd, buf, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("rtnetlink receive: %w", err)
		}
		msgs, err := parseNetlink(buf[:n])
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if m.seq != seq {
				continue
			}
			switch m.typ {
			case unix.NLMSG_DONE:
				return ferr
			case unix.NLMSG_ERROR:
				if len(m.body) < 4 {
					return errors.New("rtnetlink: short error message")
				}
				if errno := -int32(binary.NativeEndian.Uint32(m.body)); errno != 0 {
					return unix.Errno(errno)
				}
				return ferr
			}
			if ferr == nil {
				ferr = fn(m.typ, m.body)
			}
			if !dump {
				return ferr
			}
		}
	}
}

type netlinkMsg struct {
	typ  uint16
	seq  uint32
	body []byte
}

// parseNetlink splits one datagram into its messages.
func parseNetlink(b []byte) ([]netlinkMsg, error) {
	var msgs []netlinkMsg
	for len(b) >= unix.NLMSG_HDRLEN {
		l := int(binary.NativeEndian.Uint32(b))
		if l < unix.NLMSG_HDRLEN || l > len(b) {
			return nil, errors.New("rtnetlink: malformed message")
		}
		msgs = append(msgs, netlinkMsg{typ: binary.NativeEndian.Uint16(b[4:]), seq: binary.NativeEndian.Uint32(b[8:]), body: b[unix.NLMSG_HDRLEN:l]})
		b = b[min(nlmsgAlign(l), len(b)):]
	}
	return msgs, nil
}

func nlmsgAlign(n int) int { return (n + unix.NLMSG_ALIGNTO - 1) &^ (unix.NLMSG_ALIGNTO - 1) }

// newRouteRequest is a request message with its fixed header; the
// sequence number is set when it is sent.
func newRouteRequest(typ, flags uint16, header []byte) []byte {
	b := make([]byte, unix.NLMSG_HDRLEN, unix.NLMSG_HDRLEN+len(header)+64)
	binary.NativeEndian.PutUint16(b[4:], typ)
	binary.NativeEndian.PutUint16(b[6:], unix.NLM_F_REQUEST|flags)
	b = append(b, header...)
	binary.NativeEndian.PutUint32(b, uint32(len(b)))
	return b
}

// appendRouteAttr appends one attribute and updates the message length.
func appendRouteAttr(msg []byte, typ uint16, data []byte) []byte {
	l := unix.SizeofRtAttr + len(data)
	msg = binary.NativeEndian.AppendUint16(msg, uint16(l))
	msg = binary.NativeEndian.AppendUint16(msg, typ)
	msg = append(msg, data...)
	msg = append(msg, make([]byte, nlmsgAlign(l)-l)...)
	binary.NativeEndian.PutUint32(msg, uint32(len(msg)))
	return msg
}

func appendUint32Attr(msg []byte, typ uint16, v uint32) []byte {
	return appendRouteAttr(msg, typ, binary.NativeEndian.AppendUint32(nil, v))
}

// routeAttr is the value of the first attribute of type typ in attrs.
func routeAttr(attrs []byte, typ uint16) ([]byte, bool) {
	for len(attrs) >= unix.SizeofRtAttr {
		l := int(binary.NativeEndian.Uint16(attrs))
		if l < unix.SizeofRtAttr || l > len(attrs) {
			return nil, false
		}
		if binary.NativeEndian.Uint16(attrs[2:])&nlaTypeMask == typ {
			return attrs[unix.SizeofRtAttr:l], true
		}
		attrs = attrs[min(nlmsgAlign(l), len(attrs)):]
	}
	return nil, false
}

// nlaTypeMask leaves an attribute's type without its nested and
// byte-order flags.
const nlaTypeMask = ^uint16(unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)

// answersFor reports whether attrs carry the target netnsid nsid.
func answersFor(attrs []byte, typ uint16, nsid int32) bool {
	v, ok := routeAttr(attrs, typ)
	return ok && len(v) == 4 && int32(binary.NativeEndian.Uint32(v)) == nsid
}
