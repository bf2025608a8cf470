package netfilter

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/coreos/go-iptables/iptables"
	"github.com/mattn/go-shellwords"
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
	// ForwardChain is the firewall plugin's chain.
	ForwardChain = "CNI-FORWARD"
)

// IsIPv6 reports whether the table is ip6tables'.
func (t *natTable) IsIPv6() bool { return t.proto == iptables.ProtocolIPv6 }

// chainLister is a Table that lists one chain of any table (none when it
// does not exist): the host's tables, and fakes that model the filter
// table.
type chainLister interface {
	ListChain(table, chain string) ([]string, error)
}

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
	tables []forwardTable
}

type forwardTable struct {
	t  Table
	v6 bool
	// specs are the chain's rulespecs, as Delete takes them, joined by
	// NUL: a release looks its address's two up instead of parsing the
	// chain again (a busy node's chain holds two rules per container).
	specs map[string]bool
}

func specKey(spec []string) string { return strings.Join(spec, "\x00") }

// ListForward lists CNI-FORWARD in every family. A family without the
// chain (no firewall plugin) has no rules.
func (c *Cleaner) ListForward() (*ForwardRules, error) {
	f := &ForwardRules{}
	var errs []error
	for _, t := range c.Families() {
		lister, ok := t.(chainLister)
		if !ok {
			continue
		}
		lines, err := lister.ListChain(filterTableName, ForwardChain)
		if err != nil {
			errs = append(errs, fmt.Errorf("list %s: %w", ForwardChain, err))
			continue
		}
		v6 := false
		if fam, ok := t.(interface{ IsIPv6() bool }); ok {
			v6 = fam.IsIPv6()
		}
		ft := forwardTable{t: t, v6: v6, specs: map[string]bool{}}
		for _, line := range lines {
			words, err := shellwords.Parse(line)
			if err == nil && len(words) > 2 && words[0] == "-A" && words[1] == ForwardChain {
				ft.specs[specKey(words[2:])] = true
			}
		}
		f.tables = append(f.tables, ft)
	}
	return f, errors.Join(errs...)
}

// Has reports whether the listing holds a firewall rule of addr.
func (f *ForwardRules) Has(addr netip.Addr) bool {
	for _, ft := range f.tables {
		if ft.v6 != addr.Is6() || len(ft.specs) == 0 {
			continue
		}
		for _, spec := range forwardSpecs(addr) {
			if ft.specs[specKey(spec)] {
				return true
			}
		}
	}
	return false
}

// Empty reports whether the listing holds no rule at all: a host without
// the firewall plugin, where a release has nothing to look for.
func (f *ForwardRules) Empty() bool {
	for _, ft := range f.tables {
		if len(ft.specs) > 0 {
			return false
		}
	}
	return true
}

// Release deletes the listed firewall rules of addrs and describes what
// went (dryRun: what would go). Rules already gone are no error.
func (f *ForwardRules) Release(addrs []netip.Addr, dryRun bool) ([]string, error) {
	var removed []string
	var errs []error
	for _, a := range addrs {
		n := 0
		for _, ft := range f.tables {
			if ft.v6 != a.Is6() {
				continue
			}
			for _, spec := range forwardSpecs(a) {
				if !ft.specs[specKey(spec)] {
					continue
				}
				if !dryRun {
					if err := ft.t.Delete(filterTableName, ForwardChain, spec...); err != nil && !isNotExist(err) {
						errs = append(errs, fmt.Errorf("delete firewall rule of %s from %s: %w", a, ForwardChain, err))
						continue
					}
					delete(ft.specs, specKey(spec))
				}
				n++
			}
		}
		if n > 0 {
			removed = append(removed, fmt.Sprintf("firewall rules of %s in %s (%d)", a, ForwardChain, n))
		}
	}
	return removed, errors.Join(errs...)
}
