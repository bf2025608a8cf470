package testhost

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"sync"
)

// Subnets hands out random subnets that overlap nothing routed on the host
// and nothing it handed out before: a network's bridge, and so its route,
// only exists once a container runs. Each suite draws from its own range
// (Second10), so that suites running side by side rarely pick the same one
// before either has a route.
type Subnets struct {
	// Second10 is the range of the second octet of the IPv4 /24s, in
	// 10.<lo..hi-1>.x.0/24.
	Second10 [2]int
	mu       sync.Mutex
	taken    []netip.Prefix
}

// IPv4 returns a free /24 of the range.
func (s *Subnets) IPv4() (netip.Prefix, error) {
	lo, hi := s.Second10[0], s.Second10[1]
	if lo < 0 || hi > 256 || lo >= hi {
		return netip.Prefix{}, fmt.Errorf("bad second-octet range %d-%d", lo, hi)
	}
	return s.pick(func() netip.Prefix {
		return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(lo + rand.IntN(hi-lo)), byte(rand.IntN(256)), 0}), 24)
	})
}

// IPv6 returns a free random /64 in fd00::/8.
func (s *Subnets) IPv6() (netip.Prefix, error) {
	return s.pick(func() netip.Prefix {
		var a [16]byte
		a[0] = 0xfd
		for i := 2; i < 8; i++ {
			a[i] = byte(rand.IntN(256))
		}
		return netip.PrefixFrom(netip.AddrFrom16(a), 64)
	})
}

func (s *Subnets) pick(random func() netip.Prefix) (netip.Prefix, error) {
	used, err := RoutedPrefixes()
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("list host routes: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	used = append(used, s.taken...)
	for range 2000 {
		if p := random(); !slices.ContainsFunc(used, p.Overlaps) {
			s.taken = append(s.taken, p)
			return p, nil
		}
	}
	return netip.Prefix{}, errors.New("no free subnet found")
}
