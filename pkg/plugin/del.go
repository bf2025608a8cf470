package plugin

import (
	"errors"
	"net"
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
		if delegateConf, err = conf.DelegateConfigWithDataDir(conf.Dir().ScratchIPAM()); err != nil {
			return types.NewError(types.ErrInternal, "failed to render the delegate configuration", err.Error())
		}
		p.warnf("DEL %s: host-local not run on %s (%v); its leases are released by the plugin", attachmentKey(args), conf.Dir().Leases(), planted)
	} else if err != nil {
		return plantedError(err)
	}
	attacher := &reclaim.Attacher{Env: p.Reclaim, LegacyDataDir: conf.LegacyDataDir}
	if other, err := attacher.AttachedThere(conf.Dir(), attachmentKey(args), args.Netns); err != nil {
		p.warnf("warning: DEL %s: cannot tell who else is attached in %s: %v", attachmentKey(args), args.Netns, err)
	} else if other != nil {
		return p.delElsewhere(conf, args, attacher, other.Key())
	}
	usable := args.Netns != "" && attacher.NamespaceUsable(args.Netns)
	exec := p.Exec
	if args.Netns != "" && !usable {
		// bridge handles a missing path, but fails on a path that is no
		// longer a namespace (an unmounted netns file); with no netns it
		// just releases the lease, which is all that is left to do there.
		exec = withEnv(exec, "CNI_NETNS", "")
	}
	// What bridge will find on the interface, and tear the rules of down
	// (see Attacher.TornDown). An error proves nothing: EndDel then lists
	// the NAT tables as before.
	var onLink []net.IP
	if usable {
		onLink, _ = p.Reclaim.Host.LinkAddrs(args.Netns, args.IfName)
	}
	if err := p.delegateDel(conf, delegateConf, exec); err == nil {
		attacher.TornDown = onLink
	} else {
		// bridge's teardown fails on what an earlier attachment of the
		// same container ID left: a second jump to the chain it deletes
		// (iptables -X: Device or resource busy). DEL must succeed once
		// the container's state is gone: release it all, then ask again
		// (bridge's DEL is idempotent).
		removed, rerr := attacher.ReleaseNAT(conf.Dir(), attachmentKey(args))
		switch {
		case rerr == nil && len(removed) > 0 && p.delegateDel(conf, delegateConf, exec) == nil:
			p.warnf("DEL %s: %s failed on NAT rules an earlier attachment left (%s); removed them, then it succeeded", attachmentKey(args), conf.Delegate, strings.Join(removed, ", "))
		case errors.Is(err, syscall.EROFS) || strings.Contains(err.Error(), syscall.EROFS.Error()):
			// A read-only data dir: host-local's DEL fails creating its
			// directory even when there is nothing to delete.
			if !attacher.HoldsNothing(conf.Dir(), attachmentKey(args)) {
				return err
			}
			p.warnf("DEL %s: %s failed on a read-only data dir (%v), which holds nothing of it: nothing to delete", attachmentKey(args), conf.Delegate, err)
		default:
			return err
		}
	}
	if planted != nil {
		// Before the record, which names them (crash safety).
		if err := attacher.ReleaseLeasesOf(conf.Dir(), attachmentKey(args)); err != nil {
			return types.NewError(types.ErrIOFailure, "failed to release the attachment's leases", err.Error())
		}
	}
	if err := attacher.EndDel(conf.Dir(), attachmentKey(args)); err != nil {
		return types.NewError(types.ErrInternal, "failed to release what the delegate left behind", err.Error())
	}
	return nil
}

// delElsewhere is the DEL of an attachment the plugin has no record of,
// sent with the namespace and ifname of another attachment it has (a
// runtime's stale cache, a careless script): bridge would delete that
// one's interface. What names key (a lease, NAT rules) is released here,
// as host-local and bridge would release it, and bridge is not run.
func (p *Plugin) delElsewhere(conf *netconf.Config, args *skel.CmdArgs, attacher *reclaim.Attacher, other records.Key) error {
	key := attachmentKey(args)
	p.warnf("DEL %s: %s in %s is %s's (attached through this plugin): %s is not run, so that it keeps its interface; only what names %s is released", key, args.IfName, args.Netns, other, conf.Delegate, key)
	if err := attacher.ReleaseLeasesOf(conf.Dir(), key); err != nil {
		return types.NewError(types.ErrIOFailure, "failed to release the attachment's leases", err.Error())
	}
	if err := attacher.EndDel(conf.Dir(), key); err != nil {
		return types.NewError(types.ErrInternal, "failed to release what the delegate left behind", err.Error())
	}
	return nil
}

// delegateDel runs the delegate's DEL within a delegateTimeout of its own
// (a rollback never inherits the expired bound of the ADD it undoes).
func (p *Plugin) delegateDel(conf *netconf.Config, delegateConf []byte, exec invoke.Exec) error {
	ctx, cancel := delegateCtx(conf)
	defer cancel()
	if err := invoke.DelegateDel(ctx, conf.Delegate, delegateConf, exec); err != nil {
		return delegateError(ctx, conf.Delegate, "del", err)
	}
	return nil
}
