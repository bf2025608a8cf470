package reclaim

import (
	"errors"
	"fmt"
	"time"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/internal/statefile"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
)

// CheckSweep is what a CHECK runs on its network once the delegate has
// answered, and what `gc` runs on each network: legacy leases are migrated
// (once per boot: Migrator.Migrate); then, unless a sweep of the network
// ended less than interval ago (0: sweep regardless), the network is swept
// and the end of the sweep remembered, even a failed one: a sweep that
// times out on a held lock is not tried again by every CHECK of a
// restore. A dry run migrates and remembers nothing. The report is nil
// when no sweep was due. A failed migration does not stop the sweep: what
// it leaves is unknown to a sweep, which never releases that, and a broken
// legacy directory must not keep the data dir's dead attachments.
func (s *Sweeper) CheckSweep(req Request, interval time.Duration) (*Report, error) {
	var migrationErr error
	if !req.DryRun {
		if err := (&Migrator{Env: s.Env}).Migrate(req.Dir, req.LegacyDataDir); err != nil {
			migrationErr = fmt.Errorf("failed to migrate leases from %s: %w", ipamdir.New(req.LegacyDataDir, req.Dir.Network).Leases(), err)
		}
	}
	// A network the plugin never served has nothing to sweep, and no
	// marker of a sweep to leave.
	if !req.Dir.Served() || !s.sweepDue(req.Dir, interval) {
		return nil, migrationErr
	}
	rep, err := s.Sweep(req)
	// The end of a sweep is noted beside the network's records, never in
	// a record directory made for it: a gc of a data dir the plugin never
	// served (a bare bridge's leases) that releases nothing creates
	// nothing. A CHECK there sweeps each time, which is only slower.
	if !req.DryRun && statefile.Exists(req.Dir.Records()) {
		s.sweepEnded(req.Dir)
	}
	return rep, errors.Join(migrationErr, err)
}
