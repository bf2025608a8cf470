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

// addrRules are the rules that name an attachment only by its addresses:
// the firewall plugin's, and portmap's nftables rules commented with its
// container ID, both listed once, at the first release. own is the
// released attachments' network, roots where leases that keep their
// firewall rules may be (leaseRoots); busy, when set, tells whether a CNI
// command of a container runs (DEL and re-ADD are that command: they
// never ask).
type addrRules struct {
	nf      *netfilter.Cleaner
	own     ipamdir.Dir
	roots   []string
	dryRun  bool
	busy    func(cid string) *netfilter.BusyError
	listed  bool
	forward *netfilter.ForwardRules
	portmap *netfilter.PortmapNFTRules
}

// release releases p's rules that name it by its addresses, adding what
// went to p.rel: the firewall rules of its free addresses, then portmap's
// nftables rules of its container ID that name one of them. It reports
// whether they all went, so that its files may: never after a failed
// listing (its error is given once), nor while a CNI command of its
// container runs (p.busy).
func (r *addrRules) release(p *pendingRelease) (bool, error) {
	if r.nf == nil {
		return true, nil
	}
	if !r.listed {
		r.listed = true
		forward, err := r.nf.ListForward()
		if err != nil {
			return false, fmt.Errorf("read firewall rules: %w", err)
		}
		portmap, err := r.nf.ListPortmapNFT()
		if err != nil {
			return false, fmt.Errorf("read portmap's nftables rules: %w", err)
		}
		r.forward, r.portmap = forward, portmap
	}
	if r.portmap == nil {
		return false, nil
	}
	addrs := attachmentAddrs(p.a)
	var free []netip.Addr
	for _, addr := range addrs {
		if !r.forward.Has(addr) {
			continue
		}
		if holder, err := leasedElsewhere(r.roots, r.own, p.a, addr); err != nil || holder != "" {
			why := holder
			if err != nil {
				why = "cannot tell whether another network leases it: " + err.Error()
			}
			p.rel.Kept = append(p.rel.Kept, fmt.Sprintf("firewall rules of %s kept: %s", addr, why))
			continue
		}
		free = append(free, addr)
	}
	what, err := r.forward.Release(free, r.dryRun)
	p.rel.What = append(p.rel.What, what...)
	if err != nil {
		return false, fmt.Errorf("release firewall rules of %s: %w", p.a.Key, err)
	}
	// portmap's nftables teardown lists its rules, then deletes them by
	// handle, and fails the DEL if one went in between: its rules are
	// left to a CNI command of the container that runs, with the rest;
	// asked right before they would go.
	if r.busy != nil && r.portmap.Has(p.a.Key.ContainerID, addrs) {
		if p.busy = r.busy(p.a.Key.ContainerID); p.busy != nil {
			return false, nil
		}
	}
	what, err = r.portmap.Release(p.a.Key.ContainerID, addrs, r.dryRun)
	p.rel.What = append(p.rel.What, what...)
	if err != nil {
		return false, fmt.Errorf("release portmap's nftables rules of %s: %w", p.a.Key, err)
	}
	return true, nil
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
// roots other than a's own lease (its file in own, naming a), or "". Its
// own is known by the file, not by its path: a root may be own's data dir
// by another name (/var/run/cni is /run/cni on systemd hosts).
func leasedElsewhere(roots []string, own ipamdir.Dir, a *Attachment, addr netip.Addr) (string, error) {
	ownLease := own.Lease(addr.AsSlice())
	ownFile, _ := os.Lstat(ownLease) // nil: it has none there
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
			file, err := os.Lstat(path)
			if errors.Is(err, fs.ErrNotExist) {
				continue
			} else if err != nil {
				return "", err
			}
			if path == ownLease || ownFile != nil && os.SameFile(file, ownFile) {
				if l, err := readLease(path); err == nil && l.names(a.Key) {
					continue
				}
			}
			return fmt.Sprintf("%s is leased in network %s (%s)", addr, n.Name(), path), nil
		}
	}
	return "", nil
}
