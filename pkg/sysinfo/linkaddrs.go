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

	"github.com/nomad-bridge-cni/nomad-bridge-cni/internal/nlmsg"
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
	defer c.Close()
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
type routeConn struct{ *nlmsg.Conn }

func dialRoute() (*routeConn, error) {
	c, err := nlmsg.Dial(unix.NETLINK_ROUTE, 32<<10)
	if err != nil {
		return nil, err
	}
	if err := unix.SetsockoptInt(c.FD, unix.SOL_NETLINK, unix.NETLINK_GET_STRICT_CHK, 1); err != nil {
		c.Close()
		return nil, fmt.Errorf("%w: strict checking: %v", errNotFromOutside, err)
	}
	// The kernel answers every request; a bound keeps a DEL from hanging
	// on one that got lost (a DEL that cannot tell lists the NAT rules).
	tv := unix.NsecToTimeval(routeTimeout.Nanoseconds())
	if err := unix.SetsockoptTimeval(c.FD, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		c.Close()
		return nil, fmt.Errorf("rtnetlink receive timeout: %w", err)
	}
	return &routeConn{c}, nil
}

// netnsid is the id this namespace has for the one open as nsfd
// (RTM_GETNSID, which assigns none: the kernel gives one when a link
// joins the two, as bridge's veth does).
func (c *routeConn) netnsid(nsfd int) (int32, error) {
	req := make([]byte, unix.NLMSG_HDRLEN+4) // rtgenmsg, AF_UNSPEC, padded
	req = nlmsg.AppendAttr(req, unix.NETNSA_FD, binary.NativeEndian.AppendUint32(nil, uint32(nsfd)))
	nsid := int32(-1)
	err := c.ask(unix.RTM_GETNSID, 0, req, func(typ uint16, body []byte) error {
		if typ != unix.RTM_NEWNSID || len(body) < 4 {
			return fmt.Errorf("%w: unexpected answer %d to RTM_GETNSID", errNotFromOutside, typ)
		}
		if v, ok := attr(body[4:], unix.NETNSA_NSID); ok && len(v) == 4 {
			nsid = int32(nlmsg.NativeUint32(v))
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
	req := make([]byte, unix.NLMSG_HDRLEN+unix.SizeofIfInfomsg)
	req = nlmsg.AppendAttr(req, unix.IFLA_TARGET_NETNSID, binary.NativeEndian.AppendUint32(nil, uint32(nsid)))
	req = nlmsg.AppendStringAttr(req, unix.IFLA_IFNAME, ifName)
	var index int32
	err := c.ask(unix.RTM_GETLINK, 0, req, func(typ uint16, body []byte) error {
		if typ != unix.RTM_NEWLINK || len(body) < unix.SizeofIfInfomsg {
			return fmt.Errorf("%w: unexpected answer %d to RTM_GETLINK", errNotFromOutside, typ)
		}
		if !answersFor(body[unix.SizeofIfInfomsg:], unix.IFLA_TARGET_NETNSID, nsid) {
			return fmt.Errorf("%w: the link's answer is not about namespace %d", errNotFromOutside, nsid)
		}
		index = int32(nlmsg.NativeUint32(body[4:8]))
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
	req := make([]byte, unix.NLMSG_HDRLEN+unix.SizeofIfAddrmsg) // AF_UNSPEC: both families
	binary.NativeEndian.PutUint32(req[unix.NLMSG_HDRLEN+4:], uint32(index))
	req = nlmsg.AppendAttr(req, unix.IFA_TARGET_NETNSID, binary.NativeEndian.AppendUint32(nil, uint32(nsid)))
	var ips []net.IP
	err := c.ask(unix.RTM_GETADDR, unix.NLM_F_DUMP, req, func(typ uint16, body []byte) error {
		if typ != unix.RTM_NEWADDR || len(body) < unix.SizeofIfAddrmsg {
			return fmt.Errorf("%w: unexpected answer %d to RTM_GETADDR", errNotFromOutside, typ)
		}
		attrs := body[unix.SizeofIfAddrmsg:]
		if !answersFor(attrs, unix.IFA_TARGET_NETNSID, nsid) {
			return fmt.Errorf("%w: the address's answer is not about namespace %d", errNotFromOutside, nsid)
		}
		if int32(nlmsg.NativeUint32(body[4:8])) != index {
			return nil // a kernel that did not filter by link
		}
		ip, ok := attr(attrs, unix.IFA_LOCAL)
		if !ok {
			ip, ok = attr(attrs, unix.IFA_ADDRESS)
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

// ask sends req (its header left zero, to be filled in) as a request of
// type typ and hands each message of its answer to fn: one message, or a
// dump to its NLMSG_DONE. An NLMSG_ERROR is its errno.
func (c *routeConn) ask(typ, flags uint16, req []byte, fn func(typ uint16, body []byte) error) error {
	c.Seq++
	seq := c.Seq
	nlmsg.PutHeader(req, typ, unix.NLM_F_REQUEST|flags, seq)
	if err := c.Send(req); err != nil {
		return err
	}
	dump := flags&unix.NLM_F_DUMP != 0
	var ferr error
	return c.Receive(func(h *unix.NlMsghdr, body []byte) (bool, error) {
		if h.Seq != seq {
			return false, nil
		}
		switch h.Type {
		case unix.NLMSG_DONE:
			return true, ferr
		case unix.NLMSG_ERROR:
			errno, err := nlmsg.Errno(body)
			switch {
			case err != nil:
				return true, err
			case errno != 0:
				return true, errno
			}
			return true, ferr
		}
		if ferr == nil {
			ferr = fn(h.Type, body)
		}
		return !dump, ferr
	})
}

// attr is the payload of the first attribute of type typ in attrs.
func attr(attrs []byte, typ uint16) (v []byte, ok bool) {
	nlmsg.EachAttr(attrs, func(t uint16, data []byte) {
		if t == typ && !ok {
			v, ok = data, true
		}
	})
	return v, ok
}

// answersFor reports whether attrs carry the target netnsid nsid.
func answersFor(attrs []byte, typ uint16, nsid int32) bool {
	v, ok := attr(attrs, typ)
	return ok && len(v) == 4 && int32(nlmsg.NativeUint32(v)) == nsid
}
