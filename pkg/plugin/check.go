package plugin

import (
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/skel"
)

// Check delegates CHECK: bridge verifies the interface and addresses in the
// netns against prevResult and host-local verifies the lease in our dataDir.
func (p *Plugin) Check(args *skel.CmdArgs) error {
	conf, delegateConf, err := p.load(args)
	if err != nil {
		return err
	}
	if err := invoke.DelegateCheck(ctx(), conf.Delegate, delegateConf, p.Exec); err != nil {
		return delegateError(conf.Delegate, "check", err)
	}
	return nil
}
