package reclaim

import (
	"fmt"
	"time"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
)

// CheckSweep is what a CHECK runs on its network once the delegate has
// answered, and what `gc` runs on each network: legacy leases are migrated
// (once per boot: Migrator.Migrate); then, unless a sweep of the network
// ended less than interval ago (0: sweep regardless), the network is swept
// and the end of the sweep remembered, even a failed one: a sweep that
// times out on a held lock is not tried again by every CHECK of a
// restore. A dry run migrates and remembers nothing. The report is nil
// when no sweep was due; a failed migration (a *MigrationError) sweeps
// nothing.
func (s *Sweeper) CheckSweep(req Request, interval time.Duration) (*Report, error) {
	if !req.DryRun {
		if _, err := (&Migrator{Env: s.Env}).Migrate(req.Dir, req.LegacyDataDir); err != nil {
			return nil, &MigrationError{From: ipamdir.New(req.LegacyDataDir, req.Dir.Network).Leases(), Err: err}
		}
	}
	if !s.sweepDue(req.Dir, interval) {
		return nil, nil
	}
	rep, err := s.Sweep(req)
	if !req.DryRun {
		s.sweepEnded(req.Dir)
	}
	return rep, err
}

// MigrationError is a failed migration of legacy leases.
type MigrationError struct {
	From string
	Err  error
}

func (e *MigrationError) Error() string {
	return fmt.Sprintf("failed to migrate leases from %s: %v", e.From, e.Err)
}
func (e *MigrationError) Unwrap() error { return e.Err }
