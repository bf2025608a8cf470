package plugin

import (
	"github.com/containernetworking/cni/pkg/skel"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/netconf"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/reclaim"
)

// check migrates legacy leases (once per boot), delegates CHECK (bridge
// verifies the interface and addresses in the netns, host-local the lease
// in our dataDir), then sweeps the network.
// Nomad never sends GC but sends CHECK for every allocation it restores
// when a client restarts: that is the moment to reclaim. Those CHECKs come
// back to back, so a CHECK within checkSweepInterval of the network's last
// sweep does not sweep again: restoring N allocations costs N CHECKs and
// about one sweep, not N. The sweep's problems are logged; the runtime gets
// CHECK's own verdict.
func (p *Plugin) check(args *skel.CmdArgs, conf *netconf.Config) error {
	delegateConf, err := p.loadForHostLocal(conf)
	if err != nil {
		return err
	}
	// A container the bare bridge chain added keeps its lease in the
	// legacy directory until the migration, and the first CHECK after the
	// one-word edit (Nomad's restore) may come before any ADD: host-local
	// must find the lease in the data dir. A failure is the sweep's to
	// report: it migrates again below.
	_ = p.migrate(conf)
	if !conf.Dir().Existing().Leases {
		// No lease can be there, so the CHECK fails as host-local fails
		// it; but host-local would create the network's directory and
		// lock to find that out: it is shown an empty one of its own.
		var cleanup func()
		if delegateConf, cleanup, err = scratchConfig(conf, "check"); err != nil {
			return err
		}
		defer cleanup()
	}
	checkErr := p.delegate(conf, "check", conf.Delegate, delegateConf, p.Exec)

	req := reclaim.Request{Dir: conf.Dir(), LegacyDataDir: conf.LegacyDataDir, SkipUnchangedNAT: true}
	if _, err := (&reclaim.Sweeper{Env: p.Reclaim}).CheckSweep(req, conf.CheckSweepInterval); err != nil {
		p.Reclaim.Logf("warning: sweep of %s: %v", conf.Name, err)
	}
	return checkErr
}
