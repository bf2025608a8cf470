package plugin

import "github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"

// warnIfPersistent tells the operator, once per ADD, that the dataDir will
// survive a reboot, which is the failure this plugin exists to prevent. It
// is a warning, not an error: /run is not tmpfs on every host, and the
// boot-aware GC still reclaims such leases.
func (p *Plugin) warnIfPersistent(conf *ipamdir.Config) {
	onTmpfs, fsType, err := conf.OnTmpfs()
	switch {
	case err != nil:
		p.warnf("warning: cannot tell whether dataDir %s is on tmpfs: %v", conf.DataDir, err)
	case !onTmpfs:
		p.warnf("warning: dataDir %s is not on tmpfs (filesystem magic 0x%x): its leases survive a reboot; mount a tmpfs there or point \"dataDir\" at one (e.g. /run/cni)", conf.DataDir, fsType)
	}
}
