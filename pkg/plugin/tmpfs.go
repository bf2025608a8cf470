package plugin

import (
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/netconf"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/reclaim"
)

// warnIfPersistent tells the operator that the dataDir will survive a
// reboot, which is the failure this plugin exists to prevent. It is a
// warning, not an error: /run is not tmpfs on every host, and the
// boot-aware GC still reclaims such leases. It is given once per boot and
// network (a marker next to the records), not on every ADD: a runtime
// such as Nomad logs the plugins' stderr, and the log would fill with it.
func (p *Plugin) warnIfPersistent(conf *netconf.Config) {
	onTmpfs := p.onTmpfs
	if onTmpfs == nil {
		onTmpfs = ipamdir.Dir.OnTmpfs
	}
	inMemory, fsType, err := onTmpfs(conf.Dir())
	switch {
	case err != nil:
		p.warnf("warning: cannot tell whether dataDir %s is on tmpfs: %v", conf.DataDir, err)
	case !inMemory:
		due, merr := (&reclaim.Attacher{Env: p.Reclaim}).ClaimNotTmpfsWarning(conf.Dir())
		if merr != nil {
			p.warnf("warning: %v", merr)
		}
		if due {
			p.warnf("warning: dataDir %s is not on tmpfs (filesystem magic 0x%x): its leases survive a reboot; mount a tmpfs there or point \"dataDir\" at one (e.g. /run/cni) (said once per boot for network %s)", conf.DataDir, fsType, conf.Name)
		}
	}
}
