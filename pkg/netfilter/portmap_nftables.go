package netfilter

import (
	"bytes"
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/internal/crashpoint"
)

// portmap's nftables backend (plugins/meta/portmap portmap_nftables.go)
// keeps a container's port mappings as rules in the tables ip and ip6
// cni_hostport: `dnat to <containerIP>:<port>` rules in hostports (and
// the older hostip_hostports), masquerade rules naming the container's
// address in masquerading, each commented with the bare container ID. The
// comment names no network, so a rule is the attachment's only when it
// names one of its addresses too: a container ID attached to another
// network keeps its own. portmap's DEL and GC remove them; a release
// without a DEL did not.

const portmapNFTTable = "cni_hostport"

// PortmapNFTRules are portmap's nftables rules, listed once (a sweep's
// releases share one listing).
type PortmapNFTRules struct {
	conn *nftables.Conn
	// byComment are the rules by their comment (a container ID): a
	// release looks at its container's only.
	byComment map[string][]*nftables.Rule
}

// ListPortmapNFT lists the rules of both cni_hostport tables. A host
// without them (portmap on iptables, or none) has none; so does one
// without netlink access to nftables.
func (c *Cleaner) ListPortmapNFT() (*PortmapNFTRules, error) {
	if !c.PortmapNFT {
		return &PortmapNFTRules{}, nil
	}
	conn, err := nftables.New()
	if err != nil {
		return &PortmapNFTRules{}, nil
	}
	p := &PortmapNFTRules{conn: conn, byComment: map[string][]*nftables.Rule{}}
	for _, family := range []nftables.TableFamily{nftables.TableFamilyIPv4, nftables.TableFamilyIPv6} {
		chains, err := conn.ListChainsOfTableFamily(family)
		if err != nil {
			continue // no table of that family
		}
		for _, ch := range chains {
			if ch.Table == nil || ch.Table.Name != portmapNFTTable {
				continue
			}
			rules, err := conn.GetRules(ch.Table, ch)
			if err != nil {
				return nil, fmt.Errorf("list rules of %s %s: %w", portmapNFTTable, ch.Name, err)
			}
			for _, r := range rules {
				if c, ok := udataComment(r.UserData); ok {
					p.byComment[string(c)] = append(p.byComment[string(c)], r)
				}
			}
		}
	}
	return p, nil
}

// Has reports whether some rule commented containerID names one of addrs:
// what Release would delete.
func (p *PortmapNFTRules) Has(containerID string, addrs []netip.Addr) bool {
	if p == nil || p.conn == nil {
		return false
	}
	for _, r := range p.byComment[containerID] {
		if namesAny(r, addrs) {
			return true
		}
	}
	return false
}

// Release deletes, in one batch, the rules commented containerID that
// name one of addrs, and describes what went (dryRun: what would go).
func (p *PortmapNFTRules) Release(containerID string, addrs []netip.Addr, dryRun bool) ([]string, error) {
	if p == nil || p.conn == nil || len(p.byComment[containerID]) == 0 {
		return nil, nil
	}
	n := 0
	for _, r := range p.byComment[containerID] {
		if !namesAny(r, addrs) {
			continue
		}
		if !dryRun {
			if err := p.conn.DelRule(&nftables.Rule{Table: r.Table, Chain: r.Chain, Handle: r.Handle}); err != nil {
				return nil, fmt.Errorf("delete portmap rule %d of %s: %w", r.Handle, portmapNFTTable, err)
			}
		}
		n++
	}
	if n == 0 {
		return nil, nil
	}
	what := []string{fmt.Sprintf("portmap nftables rules of %s (%d)", containerID, n)}
	if dryRun {
		return what, nil
	}
	crashpoint.Step("nftables delete portmap rules")
	if err := p.conn.Flush(); err != nil {
		// A rule gone since the listing (portmap's DEL won) aborts the
		// whole batch: the files stay, and the next sweep lists again.
		return nil, fmt.Errorf("delete %d portmap rules of %s: %w", n, containerID, err)
	}
	return what, nil
}

// namesAny reports whether one of r's compared or loaded values is one of
// addrs: the daddr/saddr of a masquerade rule, the address a dnat loads.
func namesAny(r *nftables.Rule, addrs []netip.Addr) bool {
	for _, e := range r.Exprs {
		var data []byte
		switch v := e.(type) {
		case *expr.Cmp:
			data = v.Data
		case *expr.Immediate:
			data = v.Data
		default:
			continue
		}
		for _, a := range addrs {
			if b := a.AsSlice(); len(data) == len(b) && bytes.Equal(data, b) {
				return true
			}
		}
	}
	return false
}
