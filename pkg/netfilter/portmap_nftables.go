package netfilter

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/internal/nlmsg"

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
	// byComment are the rules by their comment (a container ID): a
	// release looks at its container's only. nil when nothing was listed.
	byComment map[string][]portmapNFTRule
}

// portmapNFTRule is one listed rule: where it is, and the values its
// expressions compare or load, where portmap names the container's
// address.
type portmapNFTRule struct {
	ref    nftRuleRef
	values [][]byte
}

// ListPortmapNFT lists the rules of both cni_hostport tables. A host
// without them (portmap on iptables, or none) has none; so does one
// without netlink access to nftables.
func (c *Cleaner) ListPortmapNFT() (*PortmapNFTRules, error) {
	if !c.PortmapNFT {
		return &PortmapNFTRules{}, nil
	}
	conn, err := dialProbe()
	if err != nil {
		return &PortmapNFTRules{}, nil
	}
	defer conn.Close()
	p := &PortmapNFTRules{byComment: map[string][]portmapNFTRule{}}
	for _, family := range []byte{unix.NFPROTO_IPV4, unix.NFPROTO_IPV6} {
		err := conn.eachRule(family, portmapNFTTable, "", func(r *nftRule) {
			c, ok := udataComment(r.userdata)
			if !ok {
				return
			}
			rule := portmapNFTRule{ref: nftRuleRef{family: family, table: portmapNFTTable, chain: string(r.chain), handle: r.handle}}
			eachExprValue(r.exprs, func(v []byte) { rule.values = append(rule.values, bytes.Clone(v)) })
			p.byComment[string(c)] = append(p.byComment[string(c)], rule)
		})
		if errors.Is(err, unix.EPERM) {
			return &PortmapNFTRules{}, nil
		}
		if err != nil {
			return nil, fmt.Errorf("list rules of %s: %w", portmapNFTTable, err)
		}
	}
	return p, nil
}

// eachExprValue calls fn with what each cmp expression compares with and
// each immediate loads (NFTA_DATA_VALUE): the daddr/saddr of a masquerade
// rule, the address a dnat loads.
func eachExprValue(exprs []byte, fn func([]byte)) {
	nlmsg.EachAttr(exprs, func(typ uint16, elem []byte) {
		if typ != unix.NFTA_LIST_ELEM {
			return
		}
		name, data := namedAttr(elem, unix.NFTA_EXPR_NAME, unix.NFTA_EXPR_DATA)
		var dataType uint16
		switch name {
		case "cmp":
			dataType = unix.NFTA_CMP_DATA
		case "immediate":
			dataType = unix.NFTA_IMMEDIATE_DATA
		default:
			return
		}
		nlmsg.EachAttr(data, func(typ uint16, v []byte) {
			if typ == dataType {
				nlmsg.EachAttr(v, func(typ uint16, value []byte) {
					if typ == unix.NFTA_DATA_VALUE {
						fn(value)
					}
				})
			}
		})
	})
}

// Has reports whether some rule commented containerID names one of addrs:
// what Release would delete.
func (p *PortmapNFTRules) Has(containerID string, addrs []netip.Addr) bool {
	if p == nil {
		return false
	}
	for _, r := range p.byComment[containerID] {
		if r.namesAny(addrs) {
			return true
		}
	}
	return false
}

// Release deletes, in one batch, the rules commented containerID that
// name one of addrs, and describes what went (dryRun: what would go).
func (p *PortmapNFTRules) Release(containerID string, addrs []netip.Addr, dryRun bool) ([]string, error) {
	if p == nil || len(p.byComment[containerID]) == 0 {
		return nil, nil
	}
	var refs []nftRuleRef
	for _, r := range p.byComment[containerID] {
		if r.namesAny(addrs) {
			refs = append(refs, r.ref)
		}
	}
	if len(refs) == 0 {
		return nil, nil
	}
	what := []string{fmt.Sprintf("portmap nftables rules of %s (%d)", containerID, len(refs))}
	if dryRun {
		return what, nil
	}
	conn, err := dialProbe()
	if err != nil {
		return nil, fmt.Errorf("delete %d portmap rules of %s: %w", len(refs), containerID, err)
	}
	defer conn.Close()
	crashpoint.Step("nftables delete portmap rules")
	if err := conn.deleteRules(refs); err != nil {
		// A rule gone since the listing (portmap's DEL won) aborts the
		// whole batch: the files stay, and the next sweep lists again.
		return nil, fmt.Errorf("delete %d portmap rules of %s: %w", len(refs), containerID, err)
	}
	return what, nil
}

// namesAny reports whether one of r's compared or loaded values is one of
// addrs.
func (r portmapNFTRule) namesAny(addrs []netip.Addr) bool {
	for _, data := range r.values {
		for _, a := range addrs {
			if b := a.AsSlice(); bytes.Equal(data, b) {
				return true
			}
		}
	}
	return false
}
