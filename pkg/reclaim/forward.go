package reclaim

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/netfilter"
)

// The firewall plugin's CNI-FORWARD rules name only an address
// (netfilter.ForwardRules): a released attachment's go with it once its
// address is provably free on this host, that is no lease holds it in any
// network of any data dir the host is known to use besides the
// attachment's own. An address another network holds (two networks on
// one subnet: a misconfiguration, but one that works) keeps its rules,
// which are that container's too; the release says so and the network
// counts it (ForwardKeptCount).

// ForwardKeptCount is the key, among a network's release counts
// (Sweeper.Releases), of the addresses whose firewall rules a release
// kept because another network leases them.
const ForwardKeptCount = "firewall-rules-kept"

// RefusedLiveCount is the key, among a network's release counts, of the
// ADDs refused because the container's earlier attachment is in a live
// namespace (metrics' add_refusals_total): kept with the releases so that
// one file, written under one lock, holds every count.
const RefusedLiveCount = "refused-live-namespace"

// leaseRoots are the data dirs whose networks' leases may hold an address
// on this host: the swept one, the legacy one, host-local's and the
// plugin's defaults, and the others the caller knows (the conflists').
func leaseRoots(own ipamdir.Dir, legacy string, others []string) []string {
	roots := []string{own.DataDir}
	for _, r := range append([]string{legacy, ipamdir.DefaultLegacyDataDir, ipamdir.DefaultDataDir}, others...) {
		if r != "" && !slices.Contains(roots, filepath.Clean(r)) {
			roots = append(roots, filepath.Clean(r))
		}
	}
	return roots
}

// forwardRelease is the firewall side of one stale attachment's release.
type forwardRelease struct {
	// what went (or would); kept: addresses whose rules stay, with why.
	what, kept []string
	err        error
}

// releaseForwardOf releases the firewall rules of a's addresses that no
// lease outside a's own holds under roots, from the listing rules.
func releaseForwardOf(rules *netfilter.ForwardRules, roots []string, own ipamdir.Dir, a *Attachment, dryRun bool) forwardRelease {
	var out forwardRelease
	if rules.Empty() {
		return out
	}
	var free []netip.Addr
	for _, addr := range attachmentAddrs(a) {
		if !rules.Has(addr) {
			continue
		}
		if holder, err := leasedElsewhere(roots, own, a, addr); err != nil || holder != "" {
			why := holder
			if err != nil {
				why = "cannot tell whether another network leases it: " + err.Error()
			}
			out.kept = append(out.kept, fmt.Sprintf("firewall rules of %s kept: %s", addr, why))
			continue
		}
		free = append(free, addr)
	}
	if len(free) > 0 {
		out.what, out.err = rules.Release(free, dryRun)
	}
	return out
}

// attachmentAddrs are the addresses of a's record and leases, each once.
func attachmentAddrs(a *Attachment) []netip.Addr {
	var out []netip.Addr
	add := func(addr netip.Addr) {
		if addr.IsValid() && !slices.Contains(out, addr.Unmap()) {
			out = append(out, addr.Unmap())
		}
	}
	if a.Record != nil {
		for _, c := range a.Record.IPs {
			if p, err := netip.ParsePrefix(c); err == nil {
				add(p.Addr())
			}
		}
	}
	for _, l := range a.Leases {
		if addr, ok := netip.AddrFromSlice(l.IP); ok {
			add(addr)
		}
	}
	return out
}

// leasedElsewhere names the lease that holds addr in a network under
// roots other than a's own lease (its file in own, naming a), or "".
func leasedElsewhere(roots []string, own ipamdir.Dir, a *Attachment, addr netip.Addr) (string, error) {
	ownLease := own.Lease(addr.AsSlice())
	for _, root := range roots {
		nets, err := os.ReadDir(root)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return "", err
		}
		for _, n := range nets {
			if !n.IsDir() {
				continue // a link is never followed out of a data dir
			}
			path := ipamdir.New(root, n.Name()).Lease(addr.AsSlice())
			if _, err := os.Lstat(path); errors.Is(err, fs.ErrNotExist) {
				continue
			} else if err != nil {
				return "", err
			}
			if path == ownLease && leaseNames(path, a) {
				continue
			}
			return fmt.Sprintf("%s is leased in network %s (%s)", addr, n.Name(), path), nil
		}
	}
	return "", nil
}

// leaseNames reports whether the lease file at path names a (host-local's
// "<containerID>\r\n<ifname>", or the container ID alone).
func leaseNames(path string, a *Attachment) bool {
	l, err := readLease(path)
	return err == nil && l.Key.ContainerID == a.Key.ContainerID && (l.Key.IfName == "" || l.Key.IfName == a.Key.IfName)
}
