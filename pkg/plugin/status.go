package plugin

import (
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/netconf"
)

// status answers "can an ADD succeed now?" (spec 1.1.0): the delegate must
// be installed and say so, and the dataDir must accept a lease. Either
// failing is code 50, which tells the runtime to hold new ADDs.
func (p *Plugin) status(_ *skel.CmdArgs, conf *netconf.Config) error {
	if err := p.find(conf.Delegate); err != nil {
		return types.NewError(types.ErrPluginNotAvailable, err.Error(), "")
	}
	if err := conf.Dir().CheckUsable(); err != nil {
		return types.NewError(types.ErrPluginNotAvailable, "dataDir is not usable", err.Error())
	}
	delegateConf, err := conf.DelegateConfig()
	if err != nil {
		return types.NewError(types.ErrInternal, "failed to render the delegate configuration", err.Error())
	}
	ctx, cancel := delegateCtx(conf)
	defer cancel()
	if err := invoke.DelegateStatus(ctx, conf.Delegate, delegateConf, p.Exec); err != nil {
		return delegateError(ctx, conf.Delegate, "status", err)
	}
	return nil
}
