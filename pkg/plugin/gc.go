package plugin

import (
	"errors"
	"maps"
	"slices"
	"strings"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/netconf"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/reclaim"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/records"
)

// gc releases every attachment of the network the runtime did not list in
// cni.dev/valid-attachments: leases, bridge's ipMasq and portmap's NAT
// rules (including rules whose lease is already gone), records. Then it
// forwards GC to the delegate, as the spec asks of a plugin that delegates,
// and to host-local directly: bridge v1.10.0 has no GC and does not pass it
// to its IPAM. Their list adds what the sweep kept although the runtime
// did not list it (an ADD whose processes still run, a stale attachment
// whose NAT rules could not go): host-local removes every lease not
// listed. Every step runs even if an earlier one failed, but for
// host-local's GC after a sweep that could not judge the network: without
// its verdicts, host-local could take a running ADD's lease. One failure
// keeps its code; several fold into one internal error naming them all.
func (p *Plugin) gc(args *skel.CmdArgs, conf *netconf.Config) error {
	if _, err := p.loadForHostLocal(conf); err != nil {
		return err
	}
	valid, err := conf.ValidAttachments()
	if err != nil {
		return err
	}
	if err := p.find(netconf.HostLocal); err != nil {
		return err
	}

	var errs []error
	if err := p.migrate(conf); err != nil {
		errs = append(errs, err)
	}
	// What the sweep keeps of what the runtime did not list (listed ones
	// are live): every such attachment it judged, but those it released.
	unlisted := map[records.Key]bool{}
	report, err := (&reclaim.Sweeper{Env: p.Reclaim}).Sweep(reclaim.Request{Dir: conf.Dir(), GC: true, Valid: valid, LegacyDataDir: conf.LegacyDataDir,
		Visit: func(a *reclaim.Attachment) {
			if a.Verdict.State != reclaim.Live {
				unlisted[a.Key] = true
			}
		},
		Released: func(r reclaim.Release) { delete(unlisted, r.Key) }})
	if err != nil {
		errs = append(errs, types.NewError(types.ErrInternal, "garbage collection of "+conf.Name+" failed", err.Error()))
	}
	kept := slices.Clone(valid)
	for _, k := range slices.SortedFunc(maps.Keys(unlisted), func(a, b records.Key) int { return strings.Compare(a.String(), b.String()) }) {
		kept = append(kept, types.GCAttachment{ContainerID: k.ContainerID, IfName: k.IfName})
	}
	delegateConf, hostLocalConf, err := conf.GCConfigs(kept)
	if err != nil {
		return types.NewError(types.ErrInternal, "failed to render the GC configurations", errors.Join(append(errs, err)...).Error())
	}
	// Without leases host-local has nothing to collect there, and would
	// create the network's directory and lock to find that out.
	leases := conf.Dir().Existing().Leases
	if err := p.delegate(conf, "gc", conf.Delegate, delegateConf, p.Exec); err != nil {
		errs = append(errs, err)
	}
	if leases && report != nil {
		if err := p.delegate(conf, "gc", netconf.HostLocal, hostLocalConf, p.Exec); err != nil {
			errs = append(errs, err)
		}
	}
	switch len(errs) {
	case 0:
		return nil
	case 1:
		return errs[0]
	}
	return types.NewError(types.ErrInternal, "garbage collection failed", errors.Join(errs...).Error())
}
