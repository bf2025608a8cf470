package reclaim

import (
	"errors"
	"path/filepath"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/records"
)

// releaseFiles releases a stale attachment's own files, with the caller
// holding host-local's lock and its NAT rules already gone: its leases,
// each by its own path and only while it still holds what was read, then
// its record, only if no new ADD replaced it meanwhile. The record goes
// last: it is what lets a later sweep find whatever a kill left. It reports whether the record went (in a dry run,
// would go); the leases that go are all of a.Leases.
func releaseFiles(leases *leaseDir, recs *records.Store, a *Attachment, dryRun bool) (recordGone bool, err error) {
	if dryRun {
		return a.Record != nil, nil
	}
	err = leases.remove(a.Leases)
	if a.Record == nil {
		return false, err
	}
	recordGone, rerr := removeRecordIfUnchanged(recs, a.Record)
	return recordGone, errors.Join(err, rerr)
}

// releaseOf starts the report of a stale attachment's release: its
// addresses and leases; the NAT rules and the record that go are added
// to What as they go, in that order.
func releaseOf(a *Attachment) Release {
	rel := Release{Key: a.Key, Reason: a.Verdict.Reason}
	if h := a.Verdict.Holder; a.Verdict.State == Stale && h != nil && h.Mount != "" {
		rel.HeldBy = h
	}
	for _, l := range a.Leases {
		rel.IPs = append(rel.IPs, l.IP.String())
		rel.What = append(rel.What, "lease "+l.IP.String())
	}
	return rel
}

// removeRecordIfUnchanged removes a stale record unless it was replaced
// since it was read: a new ADD for the same attachment may have written
// its pending record meanwhile.
func removeRecordIfUnchanged(store *records.Store, seen *records.Record) (bool, error) {
	now, err := store.Read(seen.Key())
	if err != nil || now == nil {
		return false, err
	}
	if now.State != seen.State || now.PID != seen.PID || !now.Created.Equal(seen.Created) || now.NetnsID != seen.NetnsID {
		return false, nil
	}
	return true, store.Remove(seen.Key())
}

// removeLeaseFile removes one lease file if it still holds what was read.
func removeLeaseFile(l Lease) error {
	d, err := openLeaseDir(filepath.Dir(l.Path))
	if err != nil {
		return err
	}
	defer d.close()
	return d.remove([]Lease{l})
}
