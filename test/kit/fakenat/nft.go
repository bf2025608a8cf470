package fakenat

import (
	"sort"
	"strings"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/netfilter"
)

// NFT models bridge's nftables ipMasq rules as a backend: rules owned by
// attachments, each owner named "<network>|<ifname>:<containerID>".
type NFT struct {
	// Rules counts the rules of each owner.
	Rules map[string]int
	// OnList runs at each listing, once the rules are read.
	OnList func()
	// Fail, when set, fails every release.
	Fail error
	// Lists counts listings; Released names each owner released.
	Lists    int
	Released []string
}

var _ netfilter.Backend = (*NFT)(nil)

// NewNFT returns a backend with no rules.
func NewNFT() *NFT { return &NFT{Rules: map[string]int{}} }

// Add gives an attachment one rule more.
func (f *NFT) Add(network, containerID, ifName string) {
	owner, _ := f.OwnerOf(network, containerID, ifName)
	f.Rules[owner]++
}

// Has reports whether an attachment has rules.
func (f *NFT) Has(network, containerID, ifName string) bool {
	owner, _ := f.OwnerOf(network, containerID, ifName)
	return f.Rules[owner] > 0
}

func (*NFT) Name() string { return "nftables" }
func (*NFT) Shared() bool { return false }

func (*NFT) OwnerOf(network, containerID, ifName string) (string, bool) {
	if ifName == "" {
		return "", false
	}
	return network + "|" + ifName + ":" + containerID, true
}

func (f *NFT) List(network string) (netfilter.Rules, error) {
	f.Lists++
	r := &nftRules{f: f, owners: map[string]netfilter.RuleOwner{}}
	for owner := range f.Rules {
		net, rest, _ := strings.Cut(owner, "|")
		ifName, cid, _ := strings.Cut(rest, ":")
		if net == network {
			r.owners[owner] = netfilter.RuleOwner{Owner: owner, ContainerID: cid, IfName: ifName}
		}
	}
	if f.OnList != nil {
		f.OnList()
	}
	return r, nil
}

// Teardown lists network's rules and releases owner's.
func (f *NFT) Teardown(network, owner string) ([]string, error) {
	rules, err := f.List(network)
	if err != nil {
		return nil, err
	}
	removed, failed := rules.Release([]string{owner})
	return removed[owner], failed[owner]
}

type nftRules struct {
	f      *NFT
	owners map[string]netfilter.RuleOwner
}

func (r *nftRules) Owned(owner string) []string {
	if _, ok := r.owners[owner]; ok {
		return []string{"nftables ipMasq rules " + owner}
	}
	return nil
}

func (r *nftRules) Owners() []netfilter.RuleOwner {
	out := make([]netfilter.RuleOwner, 0, len(r.owners))
	for _, o := range r.owners {
		out = append(out, o)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Owner < out[j].Owner })
	return out
}

func (r *nftRules) Release(owners []string) (map[string][]string, map[string]error) {
	removed, failed := map[string][]string{}, map[string]error{}
	for _, o := range owners {
		if r.f.Fail != nil {
			failed[o] = r.f.Fail
			continue
		}
		if r.f.Rules[o] > 0 {
			removed[o] = []string{"nftables ipMasq rules " + o}
			r.f.Released = append(r.f.Released, o)
		}
		delete(r.f.Rules, o)
		delete(r.owners, o)
	}
	return removed, failed
}
