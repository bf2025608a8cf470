package netfilter

import (
	"errors"
	"fmt"
)

// Backend is one of the two ways the reference plugins keep a network's NAT
// rules on the host: iptables (with ip6tables: bridge's ipMasq chains and
// portmap's DNAT chains) or nftables (bridge's ipMasq rules). A sweep, a
// DEL and the operator's commands see both the same way: a backend lists a
// network's rules, and a listing names and removes the rules of an owner.
type Backend interface {
	// Name is "iptables" or "nftables".
	Name() string
	// OwnerOf is whose rules attachment (containerID, ifName) has in the
	// backend: iptables rules are named by network and container ID, so
	// every attachment of a container shares them; nftables rules by
	// attachment. ok is false when it cannot be told (nftables, and an
	// attachment whose ifname is unknown).
	OwnerOf(network, containerID, ifName string) (owner string, ok bool)
	// Shared reports whether several attachments may share an owner: its
	// rules then go only once none of them is left.
	Shared() bool
	// List lists network's rules. A backend absent from the host has none.
	List(network string) (Rules, error)
	// Teardown releases owner's rules on network, as cheaply as the
	// backend can: the DEL and re-ADD paths.
	Teardown(network, owner string) ([]string, error)
}

// Rules are one backend's NAT rules of one network, as listed.
type Rules interface {
	// Owned describes the rules owner has (none: it has none).
	Owned(owner string) []string
	// Owners are every owner of a rule, each once.
	Owners() []RuleOwner
	// Release removes owners' rules and says, of each, what went; failed
	// says why, of each owner some of whose rules could not go. Rules
	// already gone are no failure: a concurrent DEL may have won.
	Release(owners []string) (removed map[string][]string, failed map[string]error)
}

// RuleOwner is an owner of rules and the attachment its rules name (for a
// report). bridge cuts nftables comments at 128 bytes, so a container ID
// read from one may be only its beginning (Cut).
type RuleOwner struct {
	Owner, ContainerID, IfName string
	Cut                        bool
}

// Backends are the cleaner's backends: iptables (its Tables), then
// NFTables if set.
func (c *Cleaner) Backends() []Backend {
	if c.NFTables == nil {
		return []Backend{iptablesBackend{c}}
	}
	return []Backend{iptablesBackend{c}, c.NFTables}
}

// ReleaseAttachment releases one attachment's NAT rules without a prior
// listing: the DEL and re-ADD paths. shared says whether the rules its
// container's attachments share (iptables) go too, or only its own
// (nftables). It returns what it removed.
func (c *Cleaner) ReleaseAttachment(network, ifname, containerID string, shared bool) ([]string, error) {
	var removed []string
	var errs []error
	for _, b := range c.Backends() {
		owner, ok := b.OwnerOf(network, containerID, ifname)
		if !ok || b.Shared() && !shared {
			continue
		}
		gone, err := b.Teardown(network, owner)
		removed = append(removed, gone...)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", b.Name(), err))
		}
	}
	return removed, errors.Join(errs...)
}

// iptablesBackend is the Cleaner's iptables families.
type iptablesBackend struct{ c *Cleaner }

func (iptablesBackend) Name() string { return "iptables" }
func (iptablesBackend) Shared() bool { return true }
func (iptablesBackend) OwnerOf(_, containerID, _ string) (string, bool) {
	return containerID, true
}

func (b iptablesBackend) List(network string) (Rules, error) { return b.c.listNAT(network) }

// Teardown lists and releases one container's rules, asking nobody: this
// is the container's CNI command.
func (b iptablesBackend) Teardown(network, containerID string) ([]string, error) {
	r, err := b.c.listNAT(network)
	if err != nil {
		return nil, err
	}
	r.running = nil
	removed, failed := r.Release([]string{containerID})
	return removed[containerID], failed[containerID]
}
