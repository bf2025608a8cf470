package plugin

import (
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/netconf"
)

// status answers "can the plugin work now?" (spec 1.1.0): the delegate
// must be installed and say so, and the dataDir must be safe and a
// directory it may write (code 50 otherwise, which tells the runtime to
// hold new ADDs). A full or read-only dataDir is said on stderr, not
// failed: Nomad asks STATUS before every teardown of a 1.1.0 network and
// drops the teardown when it fails, and the DEL it would send works through
// a full data dir (and frees space); an ADD refuses with its own error.
func (p *Plugin) status(_ *skel.CmdArgs, conf *netconf.Config) error {
	if err := p.find(conf.Delegate); err != nil {
		return types.NewError(types.ErrPluginNotAvailable, err.Error(), "")
	}
	problem, err := conf.Dir().CheckUsable()
	if err != nil {
		return types.NewError(types.ErrPluginNotAvailable, "dataDir is not usable", err.Error())
	}
	if problem != "" {
		p.Reclaim.Logf("warning: STATUS of %s: dataDir %s: %s: an ADD will fail until that is fixed; a DEL still works, so STATUS passes", conf.Name, conf.DataDir, problem)
	}
	delegateConf, err := conf.DelegateConfig()
	if err != nil {
		return err
	}
	return p.delegate(conf, "status", conf.Delegate, delegateConf, p.Exec)
}
