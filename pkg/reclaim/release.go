package reclaim

import (
	"errors"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/records"
)

// finishRelease ends a stale attachment's release, with the caller holding
// host-local's lock and its NAT rules already gone: the rules that name it
// by its addresses (addrRules), then its leases, each by its own path and
// only while it still holds what was read, then its record, only if no new
// ADD replaced it meanwhile. The record goes last: it is what lets a later
// run find whatever a kill left. It reports false, and leaves the files,
// if some of those rules could not go. It adds "record" to p.rel.What if
// the record went (in a dry run, would go); the leases that go are all of
// p.a.Leases.
func finishRelease(addr *addrRules, leases *leaseDir, recs *records.Store, p *pendingRelease) (bool, error) {
	if ok, err := addr.release(p); !ok {
		return false, err
	}
	if addr.dryRun {
		if p.a.Record != nil {
			p.rel.What = append(p.rel.What, "record")
		}
		return true, nil
	}
	err := leases.remove(p.a.Leases)
	if p.a.Record == nil {
		return true, err
	}
	// A new ADD of the attachment may have written its pending record
	// since the stale one was read: that one stays.
	seen := p.a.Record
	now, rerr := recs.Read(seen.Key())
	if rerr == nil && now != nil && now.State == seen.State && now.PID == seen.PID && now.Created.Equal(seen.Created) && now.NetnsID == seen.NetnsID {
		p.rel.What = append(p.rel.What, "record")
		rerr = recs.Remove(seen.Key())
	}
	return true, errors.Join(err, rerr)
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
