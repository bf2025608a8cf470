package netfilter_test

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/utils"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/netfilter"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/fakenat"
)

func TestListFindsOnlyTheNetworksContainers(t *testing.T) {
	f := fakenat.New()
	f.AddContainer("nomad", "dead", "10.0.0.2", 8080)
	f.AddContainer("nomad", "live", "10.0.0.3", 0)
	f.AddContainer("other", "dead", "10.0.1.2", 8080)
	f.Add("POSTROUTING", `-s 10.9.0.0/16 -m comment --comment "unrelated rule" -j MASQUERADE`)
	c := &netfilter.Cleaner{Tables: []netfilter.Table{f}}
	s, err := c.Backends()[0].List("nomad")
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Owners(); !reflect.DeepEqual(got, []netfilter.RuleOwner{{Owner: "dead", ContainerID: "dead"}, {Owner: "live", ContainerID: "live"}}) {
		t.Errorf("Owners = %v", got)
	}
	owned := s.Owned("dead")
	if len(owned) != 4 {
		t.Errorf("Owned(dead) = %v, want 2 jumps and 2 chains", owned)
	}
}

func TestReleaseRemovesJumpsThenChainsOfOneContainer(t *testing.T) {
	f := fakenat.New()
	f.AddContainer("nomad", "dead", "10.0.0.2", 8080)
	f.AddContainer("nomad", "live", "10.0.0.3", 8080)
	f.AddContainer("other", "dead", "10.0.1.2", 8080)
	c := &netfilter.Cleaner{Tables: []netfilter.Table{f}}
	s, err := c.Backends()[0].List("nomad")
	if err != nil {
		t.Fatal(err)
	}
	removed, err := release(s, "dead")
	if err != nil {
		t.Fatalf("Release: %v", err)
	}
	if len(removed) != 4 {
		t.Errorf("removed = %v", removed)
	}
	for _, gone := range []string{utils.FormatChainName("nomad", "dead"), utils.MustFormatChainNameWithPrefix("nomad", "dead", "DN-")} {
		if _, ok := f.Chains[gone]; ok {
			t.Errorf("chain %s still there", gone)
		}
	}
	for _, kept := range []string{utils.FormatChainName("nomad", "live"), utils.FormatChainName("other", "dead"), utils.MustFormatChainNameWithPrefix("other", "dead", "DN-")} {
		if _, ok := f.Chains[kept]; !ok {
			t.Errorf("chain %s of another container was removed", kept)
		}
	}
	if n := len(f.Chains["POSTROUTING"]); n != 2 {
		t.Errorf("POSTROUTING has %d rules, want the 2 of live and other/dead", n)
	}
	if n := len(f.Chains["CNI-HOSTPORT-DNAT"]); n != 2 {
		t.Errorf("CNI-HOSTPORT-DNAT has %d rules, want 2", n)
	}
	// A second release of the same container finds nothing to do.
	if removed, err := release(s, "dead"); err != nil || len(removed) != 0 {
		t.Errorf("second Release = %v, %v", removed, err)
	}
}

func TestReleaseFindsChainWithoutJump(t *testing.T) {
	// A teardown that died between deleting the jump and the chain leaves
	// the chain alone; it is still found by its name.
	f := fakenat.New()
	f.AddContainer("nomad", "dead", "10.0.0.2", 0)
	f.Chains["POSTROUTING"] = nil
	c := &netfilter.Cleaner{Tables: []netfilter.Table{f}}
	s, _ := c.Backends()[0].List("nomad")
	if _, err := release(s, "dead"); err != nil {
		t.Fatal(err)
	}
	if _, ok := f.Chains[utils.FormatChainName("nomad", "dead")]; ok {
		t.Error("orphan chain without a jump survived")
	}
}

// A release of an orphan (no record, no lease: only its rules name it)
// killed between bridge's jump and its chain leaves the chain: the rules
// in it, commented as the jump was, still name the container to the next
// listing (regression: the chain was found only through its jump, and
// stayed for ever).
func TestListFindsABridgeChainWhoseJumpIsGone(t *testing.T) {
	f := fakenat.New()
	f.AddContainer("nomad", "dead", "10.0.0.2", 0)
	f.AddContainer("other", "dead2", "10.0.1.2", 0)
	f.Chains["POSTROUTING"] = nil
	// A rule commented for the network in a chain that is not the
	// container's own names nobody.
	f.Add("CNI-FORWARD", fmt.Sprintf("-s 10.0.0.9/32 -m comment --comment %q -j ACCEPT", utils.FormatComment("nomad", "stranger")))
	c := &netfilter.Cleaner{Tables: []netfilter.Table{f}}
	s, err := c.Backends()[0].List("nomad")
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Owners(); !reflect.DeepEqual(got, []netfilter.RuleOwner{{Owner: "dead", ContainerID: "dead"}}) {
		t.Fatalf("Owners = %v, want dead alone", got)
	}
	if _, err := release(s, "dead"); err != nil {
		t.Fatal(err)
	}
	if _, ok := f.Chains[utils.FormatChainName("nomad", "dead")]; ok {
		t.Error("the chain survived")
	}
	if _, ok := f.Chains[utils.FormatChainName("other", "dead2")]; !ok {
		t.Error("another network's chain went")
	}
}

func TestListListsEachChainOncePerFamily(t *testing.T) {
	v4, v6 := fakenat.New(), fakenat.New()
	for i := 0; i < 50; i++ {
		v4.AddContainer("nomad", fmt.Sprintf("c%d", i), fmt.Sprintf("10.0.0.%d", i+2), 8080)
	}
	c := &netfilter.Cleaner{Tables: []netfilter.Table{v4, v6}}
	if _, err := c.Backends()[0].List("nomad"); err != nil {
		t.Fatal(err)
	}
	if want := []string{"list nat"}; !reflect.DeepEqual(v4.Calls, want) || !reflect.DeepEqual(v6.Calls, want) {
		t.Errorf("calls v4 %v, v6 %v; want one listing each", v4.Calls, v6.Calls)
	}
}

// release releases one owner of a listing's rules.
func release(rules netfilter.Rules, owner string) ([]string, error) {
	removed, failed := rules.Release([]string{owner})
	return removed[owner], failed[owner]
}

// portmap cuts a comment over 255 characters: the jump to a container's
// portmap chain is still that container's, found by the chain it jumps
// to, and goes before the chain.
func TestReleaseFindsAPortmapJumpWhoseCommentWasCut(t *testing.T) {
	f := fakenat.New()
	// 20 + 237 characters: portmap cuts it; bridge's (15 + 237) fits.
	network := strings.Repeat("n", 233)
	f.AddContainer(network, "dead", "10.0.0.2", 8080)
	f.AddContainer(network, "live", "10.0.0.3", 8081)
	c := &netfilter.Cleaner{Tables: []netfilter.Table{f}}
	s, err := c.Backends()[0].List(network)
	if err != nil {
		t.Fatal(err)
	}
	dn := utils.MustFormatChainNameWithPrefix(network, "dead", "DN-")
	if owned := s.Owned("dead"); !slices.Contains(owned, "jump in CNI-HOSTPORT-DNAT") {
		t.Errorf("Owned(dead) = %v, want its portmap jump too", owned)
	}
	if _, err := release(s, "dead"); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if f.Has(dn) || f.Owns(network, "dead") {
		t.Errorf("portmap chain %s or a rule of dead is still there: %v", dn, f.Chains)
	}
	if n := len(f.Chains["CNI-HOSTPORT-DNAT"]); n != 1 {
		t.Errorf("CNI-HOSTPORT-DNAT has %d rules, want live's 1", n)
	}
}

// ReleaseAttachment releases one attachment's rules in every backend: its
// container's iptables rules, its own nftables rules, nobody else's.
func TestReleaseContainerInEveryBackend(t *testing.T) {
	f := fakenat.New()
	f.AddContainer("nomad", "gone", "10.0.0.2", 8080)
	f.AddContainer("nomad", "live", "10.0.0.3", 0)
	nft := fakenat.NewNFT()
	nft.Add("nomad", "gone", "eth0")
	nft.Add("nomad", "gone", "eth1")
	nft.Add("nomad", "live", "eth0")
	c := &netfilter.Cleaner{Tables: []netfilter.Table{f}, NFTables: nft}
	removed, err := c.ReleaseAttachment("nomad", "eth0", "gone", true)
	if err != nil {
		t.Fatal(err)
	}
	if f.Owns("nomad", "gone") || !f.Owns("nomad", "live") || nft.Has("nomad", "gone", "eth0") || !nft.Has("nomad", "gone", "eth1") || !nft.Has("nomad", "live", "eth0") {
		t.Errorf("after the release: iptables %v, nftables %v", f.Chains, nft.Rules)
	}
	if len(removed) < 2 || removed[len(removed)-1] != "nftables ipMasq rules nomad|eth0:gone" {
		t.Errorf("removed %v, want the iptables rules, then the nftables ones", removed)
	}
	nft.Fail = errors.New("netlink: no")
	if _, err := c.ReleaseAttachment("nomad", "eth1", "gone", true); err == nil || !strings.Contains(err.Error(), "nftables") {
		t.Errorf("a failed nftables release: %v", err)
	}
}

func TestParseComment(t *testing.T) {
	cases := []struct {
		in       string
		net, cid string
		ok       bool
	}{
		{`name: "nomad" id: "abc"`, "nomad", "abc", true},
		{`dnat name: "nomad" id: "abc-123_x.y"`, "nomad", "abc-123_x.y", true},
		{`name: "a\"b" id: "c"`, `a"b`, "c", true},
		{`name: "" id: "c"`, "", "", false},
		{`name: "n" id: ""`, "", "", false},
		{`name: nomad id: abc`, "", "", false},
		{`snat name: "n" id: "c"`, "", "", false},
		{`name: "n" id: "c" extra`, "", "", false},
		{``, "", "", false},
	}
	for _, tc := range cases {
		net, cid, ok := netfilter.ParseComment(tc.in)
		if net != tc.net || cid != tc.cid || ok != tc.ok {
			t.Errorf("ParseComment(%q) = %q %q %v, want %q %q %v", tc.in, net, cid, ok, tc.net, tc.cid, tc.ok)
		}
	}
}

// A release deletes only rules that carry a comment (bridge's, portmap's,
// even cut): a rule without one is nobody's the plugin knows, and stays,
// even when it jumps to a released container's portmap chain (which then
// stays too, and the release says so).
func TestReleaseLeavesAnUncommentedJump(t *testing.T) {
	f := fakenat.New()
	f.AddContainer("nomad", "dead", "10.0.0.2", 8080)
	dn := utils.MustFormatChainNameWithPrefix("nomad", "dead", "DN-")
	foreign := "-p udp -m udp --dport 9090 -j " + dn
	f.Add("CNI-HOSTPORT-DNAT", foreign)
	c := &netfilter.Cleaner{Tables: []netfilter.Table{f}}
	s, err := c.Backends()[0].List("nomad")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := release(s, "dead"); err == nil {
		t.Error("Release succeeded with a chain still referenced")
	}
	if !slices.Contains(f.Chains["CNI-HOSTPORT-DNAT"], "-A CNI-HOSTPORT-DNAT "+foreign) {
		t.Errorf("the uncommented jump was deleted: CNI-HOSTPORT-DNAT %q", f.Chains["CNI-HOSTPORT-DNAT"])
	}
}
