package reclaim

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"maps"
	"net/netip"
	"time"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/records"
)

// A container restored in place (same ID and ifname, its namespace lost)
// asks host-local for the addresses it had (Attacher.BeginAdd's Previous).
// A CHECK of another allocation Nomad restores may sweep the lost one
// before its ADD, taking the record that names them; so a sweep remembers
// (ipamdir.RememberedMarker) the addresses of each attachment it releases
// because its namespace or its boot died. Only a hint: an entry lost to a
// kill costs the container its old address. Entries are keyed by a hash,
// so that nothing in the data dir names a container the plugin released;
// its DEL, or its ADD completing, forgets it.

// maxRemembered bounds the marker, and maxRememberedBytes its size (under
// what a marker is read up to): the oldest entries go first. A range's
// addresses come back to their holder only while they stay free, and
// host-local hands them out round-robin.
const (
	maxRemembered      = 256
	maxRememberedBytes = 48 << 10
)

type remembered struct {
	IPs []string `json:"ips"`
	// At orders the entries, for the bound (Unix seconds).
	At int64 `json:"at"`
}

// remembersCause says which releases are remembered: those of a
// container that may be restored in place.
func remembersCause(cause string) bool {
	return cause == CauseNamespaceGone || cause == CauseEarlierBoot
}

// rememberIn adds key's ips (as records keep them) to entries, keeping
// at most maxRemembered, and returns entries.
func rememberIn(entries map[string]remembered, key records.Key, ips []string, now time.Time) map[string]remembered {
	if entries == nil {
		entries = map[string]remembered{}
	}
	entries[rememberedKey(key)] = remembered{IPs: ips, At: now.Unix()}
	if len(entries) > maxRemembered {
		dropOldest(entries)
	}
	return entries
}

// remember adds entries to what d remembers, with the caller holding
// host-local's lock. A sweep writes a batch's entries once, before the
// batch's files go (sweep.rememberReleases): a rewrite of the marker per
// release made a gc of 3000 stale leases take 4 s, and one at the sweep's
// end came after an ADD that found the record gone had looked.
func (s *Env) remember(d ipamdir.Dir, entries map[string]remembered) error {
	all := readRemembered(d)
	maps.Copy(all, entries)
	// The count first: a batch of a sweep adds up to maxRemembered entries
	// to as many, and a marshal per entry dropped made a gc of 3000 stale
	// leases 130 ms slower and its peak RSS 1 MiB higher.
	for len(all) > maxRemembered {
		dropOldest(all)
	}
	for {
		b, err := json.Marshal(all)
		if err != nil {
			return err
		}
		if len(b) <= maxRememberedBytes {
			return writeMarker(d, ipamdir.RememberedMarker, b)
		}
		dropOldest(all)
	}
}

func dropOldest(all map[string]remembered) {
	oldest := ""
	for k, r := range all {
		if oldest == "" || r.At < all[oldest].At || (r.At == all[oldest].At && k < oldest) {
			oldest = k
		}
	}
	delete(all, oldest)
}

// Remembered are the addresses a sweep released of key, if it remembers
// them (see remember).
func Remembered(d ipamdir.Dir, key records.Key) []string {
	return readRemembered(d)[rememberedKey(key)].IPs
}

// forget drops key's entry, if there is one, under host-local's lock as
// remember writes: its ADD completed, or its DEL came. Failing to only
// leaves a hint the bound drops in time.
func (s *Env) forget(d ipamdir.Dir, key records.Key) {
	if _, ok := readRemembered(d)[rememberedKey(key)]; !ok {
		return
	}
	unlock, err := d.LockExisting()
	if err == nil {
		defer unlock()
		all := readRemembered(d)
		delete(all, rememberedKey(key))
		err = writeJSONMarker(d, ipamdir.RememberedMarker, all)
	}
	if err != nil {
		s.Logf("%s: forgetting %s's remembered addresses: %v", d.Network, key, err)
	}
}

// addressesOf are the addresses a released attachment had, as records keep
// them: its record's or, where its ADD never completed the record (killed
// after bridge returned, or a full data dir), its leases'.
func addressesOf(a *Attachment) []string {
	if a.Record != nil && len(a.Record.IPs) > 0 {
		return a.Record.IPs
	}
	var ips []string
	for _, l := range a.Leases {
		if addr, ok := netip.AddrFromSlice(l.IP); ok {
			ips = append(ips, netip.PrefixFrom(addr.Unmap(), addr.Unmap().BitLen()).String())
		}
	}
	return ips
}

// rememberedKey names key's entry without naming its container.
func rememberedKey(key records.Key) string {
	sum := sha256.Sum256([]byte(ipamdir.RecordName(key.ContainerID, key.IfName)))
	return hex.EncodeToString(sum[:16])
}

func readRemembered(d ipamdir.Dir) map[string]remembered {
	all := map[string]remembered{}
	readJSONMarker(d, ipamdir.RememberedMarker, &all)
	return all
}
