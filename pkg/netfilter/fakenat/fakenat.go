// Package fakenat is an in-memory nat table speaking `iptables -S`, for
// tests of what the cleaner deletes.
package fakenat

import (
	"fmt"
	"reflect"
	"sort"
	"strings"

	"github.com/containernetworking/plugins/pkg/utils"
	"github.com/mattn/go-shellwords"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/netfilter"
)

// Table models one iptables family's nat table.
type Table struct {
	Chains map[string][]string // chain -> "-A chain ..." lines
	Calls  []string
	// OnList, when set, runs after each listing, with its output made.
	OnList func()
}

var _ netfilter.Table = (*Table)(nil)

// New returns a nat table with the built-in chains.
func New() *Table {
	return &Table{Chains: map[string][]string{"POSTROUTING": nil, "PREROUTING": nil, "OUTPUT": nil}}
}

// Add appends "-A chain spec", creating the chain.
func (f *Table) Add(chain, spec string) {
	f.Chains[chain] = append(f.Chains[chain], "-A "+chain+" "+spec)
}

// builtin chains are listed with -P by iptables -S, others with -N.
var builtin = map[string]bool{"PREROUTING": true, "INPUT": true, "OUTPUT": true, "POSTROUTING": true}

func (f *Table) ListNAT() ([]string, error) {
	f.Calls = append(f.Calls, "list nat")
	names := make([]string, 0, len(f.Chains))
	for ch := range f.Chains {
		names = append(names, ch)
	}
	sort.Strings(names)
	var out []string
	for _, ch := range names {
		if builtin[ch] {
			out = append(out, "-P "+ch+" ACCEPT")
		} else {
			out = append(out, "-N "+ch)
		}
	}
	// Like iptables: the built-in chains' rules first, in kernel order.
	for _, ch := range []string{"PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"} {
		out = append(out, f.Chains[ch]...)
	}
	for _, ch := range names {
		if !builtin[ch] {
			out = append(out, f.Chains[ch]...)
		}
	}
	if f.OnList != nil {
		f.OnList()
	}
	return out, nil
}

func (f *Table) Delete(_, chain string, spec ...string) error {
	f.Calls = append(f.Calls, "delete "+chain)
	for i, line := range f.Chains[chain] {
		words, err := shellwords.Parse(line)
		if err == nil && reflect.DeepEqual(words[2:], spec) {
			f.Chains[chain] = append(f.Chains[chain][:i:i], f.Chains[chain][i+1:]...)
			return nil
		}
	}
	return fmt.Errorf("no such rule in %s: %v", chain, spec)
}

func (f *Table) ClearAndDeleteChain(_, chain string) error {
	f.Calls = append(f.Calls, "clear+delete "+chain)
	for ch, rules := range f.Chains {
		for _, r := range rules {
			if ch != chain && strings.HasSuffix(r, "-j "+chain) {
				return fmt.Errorf("chain %s still referenced from %s", chain, ch)
			}
		}
	}
	delete(f.Chains, chain)
	return nil
}

// Has reports whether chain exists.
func (f *Table) Has(chain string) bool {
	_, ok := f.Chains[chain]
	return ok
}

// AddContainer installs what bridge's ipMasq (and with hostPort > 0,
// portmap) create for one container, exactly as `iptables -S` prints them.
func (f *Table) AddContainer(network, cid, ip string, hostPort int) {
	chain := utils.FormatChainName(network, cid)
	comment := fmt.Sprintf("%q", utils.FormatComment(network, cid))
	f.Add("POSTROUTING", fmt.Sprintf("-s %s/32 -m comment --comment %s -j %s", ip, comment, chain))
	f.Add(chain, fmt.Sprintf("-d 10.0.0.0/24 -m comment --comment %s -j ACCEPT", comment))
	f.Add(chain, fmt.Sprintf("! -d 224.0.0.0/4 -m comment --comment %s -j MASQUERADE", comment))
	if hostPort > 0 {
		dn := utils.MustFormatChainNameWithPrefix(network, cid, "DN-")
		dcomment := fmt.Sprintf("%q", fmt.Sprintf(`dnat name: %q id: %q`, network, cid))
		f.Add("CNI-HOSTPORT-DNAT", fmt.Sprintf("-p tcp -m comment --comment %s -m multiport --dports %d -j %s", dcomment, hostPort, dn))
		f.Add(dn, fmt.Sprintf("-p tcp -m tcp --dport %d -j DNAT --to-destination %s:80", hostPort, ip))
	}
}

// Owns reports whether cid still has any chain or jump on network.
func (f *Table) Owns(network, cid string) bool {
	if f.Has(utils.FormatChainName(network, cid)) || f.Has(utils.MustFormatChainNameWithPrefix(network, cid, "DN-")) {
		return true
	}
	needle := fmt.Sprintf("id: %q", cid)
	for _, ch := range []string{"POSTROUTING", "CNI-HOSTPORT-DNAT"} {
		for _, r := range f.Chains[ch] {
			if strings.Contains(r, fmt.Sprintf("name: %q", network)) && strings.Contains(r, needle) {
				return true
			}
		}
	}
	return false
}
