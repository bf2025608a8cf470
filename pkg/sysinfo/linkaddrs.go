package sysinfo

import (
	"fmt"
	"net"
	"slices"
)

// LinkAddrs lists the link's addresses inside the namespace, entered as
// NetnsCookie enters it (inNetns). Asking rtnetlink from outside saved
// about 0.1 ms a DEL, which a 30–140 ms verb cannot show. It asks with
// the standard library's netlink dump (net.Interfaces), made on the
// thread that entered the namespace: a netlink library linked for this
// one question cost every verb's start-up its package init.
func (r *Real) LinkAddrs(path, ifName string) ([]net.IP, error) {
	var ips []net.IP
	err := inNetns(path, func() error {
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
	if err != nil {
		return nil, fmt.Errorf("addresses of %s in %s: %w", ifName, path, err)
	}
	return ips, nil
}
