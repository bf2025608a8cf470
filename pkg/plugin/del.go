package plugin

import (
	"errors"
	"net"
	"slices"
	"strings"
	"syscall"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/netconf"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/reclaim"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/records"
)

// del delegates DEL, then finishes what bridge leaves undone. It is
// idempotent: a second DEL, a missing namespace, an empty CNI_NETNS or a
// missing lease all succeed.
func (p *Plugin) del(args *skel.CmdArgs, conf *netconf.Config) error {
	delegateConf, err := p.load(conf)
	if err != nil {
		return err
	}
	key := attachmentKey(args)
	attacher := &reclaim.Attacher{Env: p.Reclaim, LegacyDataDir: conf.LegacyDataDir, NoPrevResult: conf.LostPrevResult()}
	// A runtime that gave up on the ADD (killing the plugin, not its
	// delegate) and DELs at once: what the delegate still makes is this
	// DEL's to tear down, so it waits for it first.
	if err := attacher.WaitForAdd(conf.Dir(), key, 2*conf.DelegateTimeout+addSlack); errors.Is(err, reclaim.ErrAddInProgress) {
		return types.NewError(types.ErrTryAgainLater, "nomad-bridge-cni deferred the DEL: "+err.Error(), "")
	} else if err != nil {
		p.Reclaim.Logf("warning: DEL %s: cannot tell whether its ADD still runs: %v", key, err)
	}
	var planted *ipamdir.PlantedError
	if err := conf.Dir().CheckPlanted(); errors.As(err, &planted) {
		if planted.Lock {
			// Nothing may be done under a lock that is not host-local's.
			return plantedError(err)
		}
		// host-local's DEL would block on what is planted among the
		// leases: bridge tears down with a host-local that looks at an
		// empty directory, and the attachment's leases are released here,
		// as host-local would, reading regular files only.
		var cleanup func()
		if delegateConf, cleanup, err = scratchConfig(conf, "del"); err != nil {
			return err
		}
		defer cleanup()
		p.Reclaim.Logf("DEL %s: host-local not run on %s (%v); its leases are released by the plugin", key, conf.Dir().Leases(), planted)
	} else if err != nil {
		return plantedError(err)
	}
	// A container the bare bridge chain added keeps its lease in the
	// legacy directory until the migration, which records it: then this
	// DEL releases that lease too (EndDel), where it would be left, and
	// migrated as live by the next ADD. Its failure fails no DEL.
	if err := p.migrate(conf); err != nil {
		p.Reclaim.Logf("warning: DEL %s: %v", key, err)
	}
	if other, err := attacher.AttachedThere(conf.Dir(), key, args.Netns); err != nil {
		p.Reclaim.Logf("warning: DEL %s: cannot tell who else is attached in %s: %v", key, args.Netns, err)
	} else if other != nil {
		// An attachment the plugin has no record of, sent with the
		// namespace and ifname of one it has (a runtime's stale cache, a
		// careless script): bridge would delete that one's interface.
		// What names key (a lease, NAT rules) is released here, as
		// host-local and bridge would release it, and bridge is not run.
		p.Reclaim.Logf("DEL %s: %s in %s is %s's (attached through this plugin): %s is not run, so that it keeps its interface; only what names %s is released", key, args.IfName, args.Netns, other.Key(), conf.Delegate, key)
		return endDel(attacher, conf.Dir(), key, true)
	}
	usable := args.Netns != "" && attacher.NamespaceUsable(args.Netns)
	var exec invoke.Exec = p.Exec
	if args.Netns != "" && !usable {
		// bridge handles a missing path, but fails on a path that is no
		// longer a namespace (an unmounted netns file); with no netns it
		// just releases the lease, which is all that is left to do there.
		exec = &envExec{exec, "CNI_NETNS", ""}
	}
	// What bridge will find on the interface, and tear the rules of down
	// (see Attacher.TornDown): its global unicast addresses, the only ones
	// ip.DelLinkByNameAddr returns. An error proves nothing: EndDel then
	// lists the NAT tables as before.
	var onLink []net.IP
	if usable {
		onLink, _ = p.Reclaim.Host.LinkAddrs(args.Netns, args.IfName)
		onLink = slices.DeleteFunc(onLink, func(ip net.IP) bool { return !ip.IsGlobalUnicast() })
	}
	if err := p.delegate(conf, "del", conf.Delegate, delegateConf, exec); err == nil {
		attacher.TornDown = onLink
	} else {
		// bridge's teardown fails on what an earlier attachment of the
		// same container ID left: a second jump to the chain it deletes
		// (iptables -X: Device or resource busy). DEL must succeed once
		// the container's state is gone: release it all, then ask again
		// (bridge's DEL is idempotent).
		removed, rerr := attacher.ReleaseNAT(conf.Dir(), key)
		switch {
		case rerr == nil && len(removed) > 0 && p.delegate(conf, "del", conf.Delegate, delegateConf, exec) == nil:
			p.Reclaim.Logf("DEL %s: %s failed on NAT rules an earlier attachment left (%s); removed them, then it succeeded", key, conf.Delegate, strings.Join(removed, ", "))
		case strings.Contains(err.Error(), syscall.EROFS.Error()):
			// A read-only data dir: host-local's DEL fails creating its
			// directory even when there is nothing to delete.
			if !attacher.HoldsNothing(conf.Dir(), key) {
				return err
			}
			p.Reclaim.Logf("DEL %s: %s failed on a read-only data dir (%v), which holds nothing of it: nothing to delete", key, conf.Delegate, err)
		default:
			return err
		}
	}
	return endDel(attacher, conf.Dir(), key, planted != nil)
}

// endDel releases what names key once its delegate ran, or was not to
// run: its leases first when host-local did not release them (before the
// record, which names them: crash safety), then its NAT rules and record.
func endDel(attacher *reclaim.Attacher, dir ipamdir.Dir, key records.Key, releaseLeases bool) error {
	if releaseLeases {
		if err := attacher.ReleaseLeasesOf(dir, key); err != nil {
			return types.NewError(types.ErrIOFailure, "failed to release the attachment's leases", err.Error())
		}
	}
	if err := attacher.EndDel(dir, key); err != nil {
		return types.NewError(types.ErrInternal, "failed to release what the delegate left behind", err.Error())
	}
	return nil
}
