package reclaim

import (
	"hash/maphash"
	"slices"
)

// idSet is a set of container IDs held as 64-bit hashes, 8 bytes each,
// so that a sweep of a /16 remembers every container it judged in half a
// MiB. Two IDs with the same hash (odds about n²/2⁶⁵ for n IDs, with a
// seed drawn per sweep) make has report an ID it was not given: the sweep
// asks it only where that answer keeps NAT rules, never where it would
// release them.
type idSet struct {
	seed   maphash.Seed
	hashes []uint64
	sorted bool
}

func (s *idSet) add(id string) {
	if s.hashes == nil {
		s.seed = maphash.MakeSeed()
	}
	s.hashes = append(s.hashes, maphash.String(s.seed, id))
	s.sorted = false
}

func (s *idSet) has(id string) bool {
	if len(s.hashes) == 0 {
		return false
	}
	if !s.sorted {
		slices.Sort(s.hashes)
		s.hashes = slices.Compact(s.hashes)
		s.sorted = true
	}
	_, ok := slices.BinarySearch(s.hashes, maphash.String(s.seed, id))
	return ok
}
