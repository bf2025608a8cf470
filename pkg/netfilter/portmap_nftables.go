package netfilter

import (
	"fmt"
	"net/netip"
	"slices"

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
// network keeps its own. Only portmap's DEL removes them (portmap has no
// GC); a release without a DEL did not.

const portmapNFTTable = "cni_hostport"

// portmapNFTChains are the chains that hold a container's rules, the ones
// portmap's own teardown lists.
var portmapNFTChains = []string{"hostports", "hostip_hostports", "masquerading"}

// PortmapNFTRules are portmap's nftables rules, listed once (a sweep's
// releases share one listing).
type PortmapNFTRules struct {
	// byComment are the rules by their comment (a container ID): a
	// release looks at its container's only. nil when nothing was listed.
	byComment map[string][]portmapNFTRule
}

// portmapNFTRule is one listed rule: where it is, and the addresses its
// expressions compare or load (a cmp's or an immediate's
// NFTA_DATA_VALUE: the daddr/saddr of a masquerade rule, the address a
// dnat loads), where portmap names the container's address.
type portmapNFTRule struct {
	ref   *nftables.Rule // table, chain and handle only
	addrs []netip.Addr
}

// ListPortmapNFT lists portmap's chains in both cni_hostport tables. A
// host without them (portmap on iptables, or none) has none; so does one
// without netlink access to nftables.
func (c *Cleaner) ListPortmapNFT() (*PortmapNFTRules, error) {
	if !c.PortmapNFT {
		return &PortmapNFTRules{}, nil
	}
	conn, err := dialNFT()
	if err != nil {
		return &PortmapNFTRules{}, nil
	}
	defer conn.CloseLasting()
	p := &PortmapNFTRules{byComment: map[string][]portmapNFTRule{}}
	for _, family := range []nftables.TableFamily{nftables.TableFamilyIPv4, nftables.TableFamilyIPv6} {
		for _, chain := range portmapNFTChains {
			rules, err := listRules(conn, family, portmapNFTTable, chain)
			if err != nil {
				return nil, fmt.Errorf("list rules of %s %s: %w", portmapNFTTable, chain, err)
			}
			for _, r := range rules {
				if c, ok := udataComment(r.UserData); ok {
					p.byComment[string(c)] = append(p.byComment[string(c)], portmapNFTRuleOf(r))
				}
			}
		}
	}
	return p, nil
}

// portmapNFTRuleOf is what a listing keeps of r.
func portmapNFTRuleOf(r *nftables.Rule) portmapNFTRule {
	rule := portmapNFTRule{ref: &nftables.Rule{Table: r.Table, Chain: r.Chain, Handle: r.Handle}}
	for _, e := range r.Exprs {
		var data []byte
		switch e := e.(type) {
		case *expr.Cmp:
			data = e.Data
		case *expr.Immediate:
			data = e.Data
		}
		if a, ok := netip.AddrFromSlice(data); ok {
			rule.addrs = append(rule.addrs, a)
		}
	}
	return rule
}

// matching are the rules commented containerID that name one of addrs.
func (p *PortmapNFTRules) matching(containerID string, addrs []netip.Addr) []*nftables.Rule {
	var refs []*nftables.Rule
	for _, r := range p.byComment[containerID] {
		if slices.ContainsFunc(r.addrs, func(a netip.Addr) bool { return slices.Contains(addrs, a) }) {
			refs = append(refs, r.ref)
		}
	}
	return refs
}

// Has reports whether Release would delete something.
func (p *PortmapNFTRules) Has(containerID string, addrs []netip.Addr) bool {
	return len(p.matching(containerID, addrs)) > 0
}

// Release deletes the rules commented containerID that name one of addrs
// (one batch: a container has far fewer than nftBatchRules), and
// describes what went (dryRun: what would go).
func (p *PortmapNFTRules) Release(containerID string, addrs []netip.Addr, dryRun bool) ([]string, error) {
	refs := p.matching(containerID, addrs)
	if len(refs) == 0 {
		return nil, nil
	}
	what := []string{fmt.Sprintf("portmap nftables rules of %s (%d)", containerID, len(refs))}
	if dryRun {
		return what, nil
	}
	conn, err := dialNFT()
	if err != nil {
		return nil, fmt.Errorf("delete %d portmap rules of %s: %w", len(refs), containerID, err)
	}
	defer conn.CloseLasting()
	crashpoint.Step("nftables delete portmap rules")
	if err := deleteRules(conn, refs); err != nil {
		// A rule gone since the listing (portmap's DEL won) aborts the
		// whole batch: the files stay, and the next sweep lists again.
		return nil, fmt.Errorf("delete %d portmap rules of %s: %w", len(refs), containerID, err)
	}
	return what, nil
}
