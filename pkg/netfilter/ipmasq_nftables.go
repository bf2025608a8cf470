package netfilter

import (
	"fmt"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/google/nftables"
	"github.com/google/nftables/userdata"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/internal/crashpoint"
)

// bridge's nftables ipMasq backend (plugins/pkg/ip/ipmasq_nftables_linux.go)
// puts one rule per attachment and address into one chain of one table, and
// recognises a rule by its comment: a hash of the network, a hash of
// "<ifname>:<containerID>", then a readable tail.
//
// The rules are listed and deleted here over netlink, as `nft` itself does,
// instead of through bridge's own functions: those run nft through
// sigs.k8s.io/knftables, whose package init (a dozen regular expressions)
// was a third of the plugin's start-up work on every verb, including the
// ones that never reach this code.
const (
	ipMasqTable = "cni_plugins_masquerade"
	ipMasqChain = "masq_checks"
	// nftCommentMax is nftables' limit on a comment, to which bridge cuts
	// its comments (knftables.CommentLengthMax).
	nftCommentMax = 128
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

// nftTeardownMatch selects one attachment's rules, as bridge's nftables
// teardown does (by the comment's hash prefix).
func nftTeardownMatch(network, ifname, containerID string) func(comment string) bool {
	prefix := nftInstanceHash(network, ifname, containerID)
	return func(comment string) bool { return strings.HasPrefix(comment, prefix) }
}

// nftReleaseMatch selects the rules of the attachments in atts, each by
// its comment's hash prefix, as bridge's teardown selects one attachment's.
func nftReleaseMatch(network string, atts []types.GCAttachment) func(comment string) bool {
	doomed := make(map[string]bool, len(atts))
	for _, a := range atts {
		doomed[nftInstanceHash(network, a.IfName, a.ContainerID)] = true
	}
	return func(comment string) bool {
		instance, _, _ := strings.Cut(comment, ",")
		return doomed[instance]
	}
}

// NFTInstance is what the comments of an attachment's nftables ipMasq
// rules begin with: how a sweep tells the attachments it knows from the
// orphans (see NFTablesOrphans).
func NFTInstance(network, ifname, containerID string) string {
	return nftInstanceHash(network, ifname, containerID)
}

// NFTOrphan is an attachment whose nftables ipMasq rules were released as
// orphans, as its rules' comment names it. bridge cuts comments at 128
// bytes, so the container ID may be only its beginning (Cut).
type NFTOrphan struct {
	Instance, IfName, ContainerID string
	Cut                           bool
}

// parseNFTComment reads one of network's rule comments, bridge's
// "<network hash>-<attachment hash>, net: N, if: I, id: C". ok is false for
// another network's rule. The readable tail only names the attachment for
// a report: what is released is chosen by the hash.
func parseNFTComment(network, comment string) (o NFTOrphan, ok bool) {
	rest, ok := strings.CutPrefix(comment, nftNetworkHash(network)+"-")
	if !ok {
		return o, false
	}
	hash, tail, _ := strings.Cut(rest, ",")
	o.Instance = comment[:len(comment)-len(rest)] + hash
	_, tail, _ = strings.Cut(tail, " if: ")
	o.IfName, o.ContainerID, _ = strings.Cut(tail, ", id: ")
	o.Cut = nftInstanceHash(network, o.IfName, o.ContainerID) != o.Instance
	return o, true
}

// nftablesOrphans releases, in one listing and one batch, network's
// nftables ipMasq rules whose attachment (by its instance hash) keep
// refuses, and returns those attachments, one each. keep is asked after
// the rules are listed. A dry run deletes nothing.
func nftablesOrphans(network string, keep func(instance string) bool, dryRun bool) ([]NFTOrphan, error) {
	var orphans []NFTOrphan
	verdicts := map[string]bool{}
	err := deleteIPMasqRules(func(comment string) bool {
		o, ok := parseNFTComment(network, comment)
		if !ok {
			return false
		}
		orphan, known := verdicts[o.Instance]
		if !known {
			orphan = !keep(o.Instance)
			verdicts[o.Instance] = orphan
			if orphan {
				orphans = append(orphans, o)
			}
		}
		return orphan && !dryRun
	})
	if err != nil {
		return nil, err
	}
	return orphans, nil
}

// nftablesRelease releases the nftables ipMasq rules of the attachments
// in atts (a sweep's stale ones), in one listing and one batch.
func nftablesRelease(network string, atts []types.GCAttachment) error {
	return deleteIPMasqRules(nftReleaseMatch(network, atts))
}

// nftablesTeardown releases the nftables ipMasq rules of one attachment.
func nftablesTeardown(network, ifname, containerID string) error {
	return deleteIPMasqRules(nftTeardownMatch(network, ifname, containerID))
}

// deleteIPMasqRules deletes, in one netlink batch, the rules of bridge's
// ipMasq chain whose comment match selects. Without bridge's table or
// chain (or without netlink access to find them) there are no such rules:
// nothing to do, as bridge's GC finds when its chain does not exist.
func deleteIPMasqRules(match func(comment string) bool) error {
	conn, err := nftables.New()
	if err != nil {
		return nil
	}
	defer conn.CloseLasting()
	chain := ipMasqChainOf(conn)
	if chain == nil {
		return nil
	}
	rules, err := conn.GetRules(chain.Table, chain)
	if err != nil {
		return fmt.Errorf("list rules of inet %s %s: %w", ipMasqTable, ipMasqChain, err)
	}
	n := 0
	for _, r := range rules {
		comment, ok := userdata.GetString(r.UserData, userdata.TypeComment)
		if !ok || !match(comment) {
			continue
		}
		if err := conn.DelRule(&nftables.Rule{Table: chain.Table, Chain: chain, Handle: r.Handle}); err != nil {
			return fmt.Errorf("delete rule %d of inet %s %s: %w", r.Handle, ipMasqTable, ipMasqChain, err)
		}
		n++
	}
	if n == 0 {
		return nil
	}
	crashpoint.Step("nftables delete rules")
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("delete %d rules of inet %s %s: %w", n, ipMasqTable, ipMasqChain, err)
	}
	return nil
}

// ipMasqChainOf finds bridge's ipMasq chain, or nil.
func ipMasqChainOf(conn *nftables.Conn) *nftables.Chain {
	chains, err := conn.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil
	}
	for _, c := range chains {
		if c.Name == ipMasqChain && c.Table != nil && c.Table.Name == ipMasqTable {
			return c
		}
	}
	return nil
}
