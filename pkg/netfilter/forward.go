package netfilter

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// The firewall plugin (plugins/meta/firewall, iptables backend) lets a
// container's traffic through the filter table's CNI-FORWARD chain with
// two rules per address, appended on ADD and deleted on DEL from the
// prevResult: `-d <addr>/32 -m conntrack --ctstate RELATED,ESTABLISHED -j
// ACCEPT` and `-s <addr>/32 -j ACCEPT` (/128 for IPv6). They carry no
// comment, only the address: an attachment released without a DEL leaves
// them, and only its address finds them.

const (
	filterTableName = "filter"
	// forwardChain is the firewall plugin's chain.
	forwardChain = "CNI-FORWARD"
)

// forwardSpecs are the rulespecs the firewall plugin appends for addr.
func forwardSpecs(addr netip.Addr) [][]string {
	host := netip.PrefixFrom(addr, addr.BitLen()).String()
	return [][]string{
		{"-d", host, "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT"},
		{"-s", host, "-j", "ACCEPT"},
	}
}

// ForwardRules are the CNI-FORWARD chains of the host's iptables
// families, listed once (a sweep's releases share one listing).
type ForwardRules struct {
	// specs are the chains' rulespecs, as Delete takes them, joined by
	// NUL, and the table of each: a release looks its address's two up
	// instead of parsing the chain again (a busy node's chain holds two
	// rules per container). An address's rules are only in its own
	// family's chain: ip6tables takes no IPv4 address, iptables no IPv6.
	specs map[string]Table
}

func specKey(spec []string) string { return strings.Join(spec, "\x00") }

// ListForward lists CNI-FORWARD in every family. A family without the
// chain (no firewall plugin) has no rules.
func (c *Cleaner) ListForward() (*ForwardRules, error) {
	f := &ForwardRules{specs: map[string]Table{}}
	var errs []error
	for _, t := range c.families() {
		lines, err := t.List(filterTableName)
		if err != nil {
			errs = append(errs, fmt.Errorf("list %s: %w", forwardChain, err))
			continue
		}
		for _, line := range lines {
			if chain, spec, ok := parseRule(line); ok && chain == forwardChain {
				f.specs[specKey(spec)] = t
			}
		}
	}
	return f, errors.Join(errs...)
}

// Has reports whether the listing holds a firewall rule of addr.
func (f *ForwardRules) Has(addr netip.Addr) bool {
	return slices.ContainsFunc(forwardSpecs(addr), func(spec []string) bool { return f.specs[specKey(spec)] != nil })
}

// Release deletes the listed firewall rules of addrs and describes what
// went (dryRun: what would go). Rules already gone are no error.
func (f *ForwardRules) Release(addrs []netip.Addr, dryRun bool) ([]string, error) {
	var removed []string
	var errs []error
	for _, a := range addrs {
		n := 0
		for _, spec := range forwardSpecs(a) {
			t := f.specs[specKey(spec)]
			if t == nil {
				continue
			}
			if !dryRun {
				if err := t.Delete(filterTableName, forwardChain, spec...); err != nil && !isNotExist(err) {
					errs = append(errs, fmt.Errorf("delete firewall rule of %s from %s: %w", a, forwardChain, err))
					continue
				}
				delete(f.specs, specKey(spec))
			}
			n++
		}
		if n > 0 {
			removed = append(removed, fmt.Sprintf("firewall rules of %s in %s (%d)", a, forwardChain, n))
		}
	}
	return removed, errors.Join(errs...)
}
