package netfilter

import (
	"fmt"
	"slices"
	"strings"

	"github.com/google/nftables"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/internal/crashpoint"
)

// bridge's nftables ipMasq backend (plugins/pkg/ip/ipmasq_nftables_linux.go)
// puts one rule per attachment and address into one chain of one table, and
// recognises a rule by its comment: a hash of the network, a hash of
// "<ifname>:<containerID>", then a readable tail.
//
// The rules are listed and deleted here over netlink (nftrules.go), as
// `nft` itself does, instead of through bridge's own functions: those run
// nft through sigs.k8s.io/knftables, whose package init (a dozen regular
// expressions) was a third of the plugin's start-up work on every verb,
// including the ones that never reach this code.
const (
	ipMasqTable = "cni_plugins_masquerade"
	ipMasqChain = "masq_checks"
)

// nftNetworkHash is the comment prefix of every rule of network
// (hashForNetwork upstream).
func nftNetworkHash(network string) string {
	return formatHashWithPrefix(16, "", network)
}

// nftInstanceHash is the comment prefix of one attachment's rules
// (hashForInstance upstream).
func nftInstanceHash(network, ifname, containerID string) string {
	return nftNetworkHash(network) + "-" + formatHashWithPrefix(16, "", ifname+":"+containerID)
}

// parseNFTComment reads one of network's rule comments, bridge's
// "<network hash>-<attachment hash>, net: N, if: I, id: C". ok is false for
// another network's rule. The readable tail only names the attachment for
// a report: what is released is chosen by the hash.
func parseNFTComment(network, comment string) (o RuleOwner, ok bool) {
	rest, ok := strings.CutPrefix(comment, nftNetworkHash(network)+"-")
	if !ok {
		return o, false
	}
	hash, tail, _ := strings.Cut(rest, ",")
	o.Owner = comment[:len(comment)-len(rest)] + hash
	_, tail, _ = strings.Cut(tail, " if: ")
	o.IfName, o.ContainerID, _ = strings.Cut(tail, ", id: ")
	o.Cut = nftInstanceHash(network, o.IfName, o.ContainerID) != o.Owner
	return o, true
}

// nftBackend is bridge's nftables ipMasq backend, whose owners are
// attachments (nftInstanceHash).
type nftBackend struct{}

func (nftBackend) Name() string { return "nftables" }
func (nftBackend) Shared() bool { return false }

func (nftBackend) OwnerOf(network, containerID, ifName string) (string, bool) {
	if ifName == "" {
		return "", false
	}
	return nftInstanceHash(network, ifName, containerID), true
}

func (nftBackend) List(network string) (Rules, error) {
	r := &nftRules{count: map[string]int{}}
	err := eachIPMasqRule(func(comment string) bool {
		if o, ok := parseNFTComment(network, comment); ok {
			if r.count[o.Owner]++; r.count[o.Owner] == 1 {
				r.order = append(r.order, o)
			}
		}
		return false
	})
	return r, err
}

// Teardown releases one owner's rules without a prior listing (one
// listing and, when bridge's own teardown left some, one batch): the DEL
// path.
func (nftBackend) Teardown(_, owner string) ([]string, error) {
	removed, failed := (&nftRules{}).Release([]string{owner})
	return removed[owner], failed[owner]
}

// nftRules are a listing: the number of rules of each owner, and the
// owners in the order listed.
type nftRules struct {
	count map[string]int
	order []RuleOwner
}

func describeNFT(owner string, rules int) string {
	return fmt.Sprintf("nftables ipMasq rules %s (%d)", owner, rules)
}

func (r *nftRules) Owned(owner string) []string {
	if n, ok := r.count[owner]; ok {
		return []string{describeNFT(owner, n)}
	}
	return nil
}

func (r *nftRules) Owners() []RuleOwner {
	return slices.DeleteFunc(slices.Clone(r.order), func(o RuleOwner) bool { _, listed := r.count[o.Owner]; return !listed })
}

// Release deletes the owners' rules (deleteRules), listed again: what the
// first listing saw may have changed since (a DEL that won). The owners
// released are no longer in the listing.
func (r *nftRules) Release(owners []string) (map[string][]string, map[string]error) {
	doomed := make(map[string]int, len(owners))
	for _, o := range owners {
		doomed[o] = 0
	}
	err := eachIPMasqRule(func(comment string) bool {
		instance, _, _ := strings.Cut(comment, ",")
		_, ok := doomed[instance]
		if ok {
			doomed[instance]++
		}
		return ok
	})
	removed, failed := map[string][]string{}, map[string]error{}
	for o, n := range doomed {
		switch {
		case err != nil:
			failed[o] = err
		case n > 0:
			removed[o] = []string{describeNFT(o, n)}
			fallthrough
		default:
			delete(r.count, o) // gone, as a listing now shows
		}
	}
	return removed, failed
}

// eachIPMasqRule lists the rules of bridge's ipMasq chain and deletes, in
// as few netlink batches as the socket's buffers take (deleteRules), those
// whose comment doomed selects. Without bridge's table or chain there are
// no such rules: nothing to do, as bridge's teardown finds when its chain
// does not exist (findRules upstream). Nor are there any this process
// could have made without netlink access to nftables (not root).
func eachIPMasqRule(doomed func(comment string) bool) error {
	c, err := dialNFT()
	if err != nil {
		return nil
	}
	defer c.CloseLasting()
	rules, err := listRules(c, nftables.TableFamilyINet, ipMasqTable, ipMasqChain)
	if err != nil {
		return fmt.Errorf("list rules of inet %s %s: %w", ipMasqTable, ipMasqChain, err)
	}
	var gone []*nftables.Rule
	for _, r := range rules {
		if comment, ok := udataComment(r.UserData); ok && doomed(string(comment)) {
			gone = append(gone, r)
		}
	}
	if len(gone) == 0 {
		return nil
	}
	crashpoint.Step("nftables delete rules")
	if err := deleteRules(c, gone); err != nil {
		return fmt.Errorf("delete %d rules of inet %s %s: %w", len(gone), ipMasqTable, ipMasqChain, err)
	}
	return nil
}
