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
	// Filter is the filter table's chains, made on first use (AddForward).
	Filter map[string][]string
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

// List lists a table as `iptables -S` does; the filter table holds only
// what AddForward made.
func (f *Table) List(table string) ([]string, error) {
	f.Calls = append(f.Calls, "list "+table)
	if table == "filter" {
		var out []string
		for chain, rules := range f.Filter {
			out = append(append(out, "-N "+chain), rules...)
		}
		return out, nil
	}
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

func (f *Table) Delete(table, chain string, spec ...string) error {
	chains := f.Chains
	if table == "filter" {
		chains = f.Filter
		f.Calls = append(f.Calls, "delete filter "+chain)
	} else {
		f.Calls = append(f.Calls, "delete "+chain)
	}
	for i, line := range chains[chain] {
		words, err := shellwords.Parse(line)
		if err == nil && reflect.DeepEqual(words[2:], spec) {
			chains[chain] = append(chains[chain][:i:i], chains[chain][i+1:]...)
			return nil
		}
	}
	return fmt.Errorf("no such rule in %s: %v", chain, spec)
}

// AddForward appends the firewall plugin's two CNI-FORWARD rules of addr
// (an address without prefix), as `iptables -S` prints them.
func (f *Table) AddForward(addr string) {
	if f.Filter == nil {
		f.Filter = map[string][]string{}
	}
	bits := "/32"
	if strings.Contains(addr, ":") {
		bits = "/128"
	}
	f.Filter["CNI-FORWARD"] = append(f.Filter["CNI-FORWARD"],
		"-A CNI-FORWARD -d "+addr+bits+" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
		"-A CNI-FORWARD -s "+addr+bits+" -j ACCEPT")
}

// Forwards lists the addresses CNI-FORWARD has an ACCEPT rule for.
func (f *Table) Forwards() []string {
	var out []string
	for _, r := range f.Filter["CNI-FORWARD"] {
		if w := strings.Fields(r); len(w) >= 4 && w[2] == "-s" {
			out = append(out, strings.Split(w[3], "/")[0])
		}
	}
	sort.Strings(out)
	return out
}

// referenced says which chain still jumps to chain, as iptables -X does.
func (f *Table) referenced(chain string) error {
	for ch, rules := range f.Chains {
		for _, r := range rules {
			if ch != chain && strings.HasSuffix(r, "-j "+chain) {
				return fmt.Errorf("chain %s still referenced from %s", chain, ch)
			}
		}
	}
	return nil
}

func (f *Table) ClearAndDeleteChain(_, chain string) error {
	f.Calls = append(f.Calls, "clear+delete "+chain)
	if err := f.referenced(chain); err != nil {
		return err
	}
	delete(f.Chains, chain)
	return nil
}

func (f *Table) FlushChain(_, chain string) error {
	f.Calls = append(f.Calls, "flush "+chain)
	if _, ok := f.Chains[chain]; !ok {
		return fmt.Errorf("flush %s: %w", chain, netfilter.ErrNoChain)
	}
	f.Chains[chain] = nil
	return nil
}

func (f *Table) DeleteChain(_, chain string) error {
	f.Calls = append(f.Calls, "delete chain "+chain)
	if _, ok := f.Chains[chain]; !ok {
		return fmt.Errorf("delete %s: %w", chain, netfilter.ErrNoChain)
	}
	if len(f.Chains[chain]) > 0 {
		return fmt.Errorf("chain %s is not empty", chain)
	}
	if err := f.referenced(chain); err != nil {
		return err
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
		f.AddPortmap(network, cid, ip, hostPort)
	}
}

// AddPortmap installs what portmap creates for one container's mapping of
// hostPort to its port 80: its chain and the jump to it.
func (f *Table) AddPortmap(network, cid, ip string, hostPort int) {
	dn := utils.MustFormatChainNameWithPrefix(network, cid, "DN-")
	dcomment := fmt.Sprintf(`dnat name: %q id: %q`, network, cid)
	if len(dcomment) > 255 {
		// portmap's trimComment (plugins/meta/portmap/utils.go) makes it
		// 256 characters, and iptables keeps 255 of them.
		dcomment = (dcomment[:253] + "...")[:255]
	}
	dcomment = fmt.Sprintf("%q", dcomment)
	f.Add("CNI-HOSTPORT-DNAT", fmt.Sprintf("-p tcp -m comment --comment %s -m multiport --dports %d -j %s", dcomment, hostPort, dn))
	f.Add(dn, fmt.Sprintf("-p tcp -m tcp --dport %d -j DNAT --to-destination %s:80", hostPort, ip))
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
