package plugin

import (
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/skel"
)

// Del delegates DEL. It is idempotent because bridge's is: a missing netns
// (or an empty CNI_NETNS) still releases the lease, and host-local treats
// an unknown container as already released.
func (p *Plugin) Del(args *skel.CmdArgs) error {
	conf, delegateConf, err := p.load(args)
	if err != nil {
		return err
	}
	if err := invoke.DelegateDel(ctx(), conf.Delegate, delegateConf, p.Exec); err != nil {
		return delegateError(conf.Delegate, "del", err)
	}
	return nil
}
