package netfilter_test

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/netfilter"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/fakenat"
)

// Exactly the firewall plugin's two rules of each address go, each from
// its family's table; rules of other addresses, and rules that only look
// like them, stay.
func TestReleaseForwardRemovesOnlyTheAddressesRules(t *testing.T) {
	v4, v6 := fakenat.New(), fakenat.New()
	v4.AddForward("10.0.0.5")
	v4.AddForward("10.0.0.50")
	v4.Filter["CNI-FORWARD"] = append(v4.Filter["CNI-FORWARD"],
		"-A CNI-FORWARD -s 10.0.0.5/32 -j DROP",
		"-A CNI-FORWARD -s 10.0.0.5/32 -p tcp -j ACCEPT",
		"-A CNI-FORWARD -m comment --comment \"CNI firewall plugin admin overrides\" -j CNI-ADMIN")
	v6.AddForward("fd00::5")
	c := &netfilter.Cleaner{Tables: []netfilter.Table{v4, v6}}
	addrs := []netip.Addr{netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("fd00::5")}

	dry, err := releaseForward(t, c, addrs, true)
	if err != nil || len(dry) != 2 || len(v4.Filter["CNI-FORWARD"]) != 7 {
		t.Fatalf("dry run: %q %v; chain %q", dry, err, v4.Filter["CNI-FORWARD"])
	}
	removed, err := releaseForward(t, c, addrs, false)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"firewall rules of 10.0.0.5 in CNI-FORWARD (2)", "firewall rules of fd00::5 in CNI-FORWARD (2)"}
	if !slices.Equal(removed, want) {
		t.Errorf("removed %q, want %q", removed, want)
	}
	if got := v4.Forwards(); !slices.Equal(got, []string{"10.0.0.5", "10.0.0.5", "10.0.0.50"}) {
		t.Errorf("left %q: want 10.0.0.50's and the look-alikes", v4.Filter["CNI-FORWARD"])
	}
	if len(v4.Filter["CNI-FORWARD"]) != 5 || len(v6.Filter["CNI-FORWARD"]) != 0 {
		t.Errorf("left v4 %q, v6 %q", v4.Filter["CNI-FORWARD"], v6.Filter["CNI-FORWARD"])
	}
	if again, err := releaseForward(t, c, addrs, false); err != nil || len(again) != 0 {
		t.Errorf("second release: %q %v", again, err)
	}
	// A host without the firewall plugin's chain has nothing to release.
	if got, err := releaseForward(t, &netfilter.Cleaner{Tables: []netfilter.Table{fakenat.New()}}, addrs, false); err != nil || len(got) != 0 {
		t.Errorf("without CNI-FORWARD: %q %v", got, err)
	}
}

// Looking an address up costs the same whatever the chain holds: a busy
// node's CNI-FORWARD has two rules per container, and a gc asks once per
// released address (parsing the chain on each ask made a sweep of 2047
// releases with 2000 such rules take 8.8 s instead of 0.16 s).
func TestForwardLookupDoesNotParseTheChainAgain(t *testing.T) {
	allocs := func(rules int) float64 {
		v4 := fakenat.New()
		for i := range rules {
			v4.AddForward(fmt.Sprintf("192.0.%d.%d", 2+i/250, 1+i%250))
		}
		f, err := (&netfilter.Cleaner{Tables: []netfilter.Table{v4}}).ListForward()
		if err != nil {
			t.Fatal(err)
		}
		addr := netip.MustParseAddr("10.0.0.5")
		return testing.AllocsPerRun(50, func() { f.Has(addr) })
	}
	if few, many := allocs(2), allocs(2000); many > few {
		t.Errorf("Has allocates %.0f times with 2000 rules in the chain, %.0f with 2: it parses the chain on each call", many, few)
	}
}

// releaseForward lists CNI-FORWARD afresh and releases addrs' rules, as a
// sweep does at its first release.
func releaseForward(t *testing.T, c *netfilter.Cleaner, addrs []netip.Addr, dryRun bool) ([]string, error) {
	t.Helper()
	f, err := c.ListForward()
	if err != nil {
		return nil, err
	}
	return f.Release(addrs, dryRun)
}
