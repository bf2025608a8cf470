package netfilter

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ip"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"sigs.k8s.io/knftables"

	kitns "github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/netns"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/testhost"
)

// TestNFTablesIPMasqAgainstBridge: rules made by bridge's own nftables
// ipMasq code (plugins/pkg/ip) in a throw-away namespace are released
// exactly as bridge's teardown, and pkg/ip's GCIPMasqForNetwork (which
// bridge never calls), release them; what is left is listed
// through knftables, as bridge reads it.
func TestNFTablesIPMasqAgainstBridge(t *testing.T) {
	if _, err := exec.LookPath("nft"); err != nil {
		testhost.SkipOrFail(t, "bridge's nftables ipMasq needs the nft binary (.ci/run installs nftables)")
	}
	netns := nftNamespace(t)
	var err error

	backend := "nftables"
	// 64-hex container IDs and a long network name make bridge cut the
	// comment at nftables' 128 bytes.
	network := "nomad-network-with-a-rather-long-name"
	cid := func(i int) string { return fmt.Sprintf("%064x", i) }
	setup := func(i int, network string) {
		t.Helper()
		ipn := &net.IPNet{IP: net.IPv4(10, 9, 0, byte(i)), Mask: net.CIDRMask(24, 32)}
		ip6 := &net.IPNet{IP: net.ParseIP(fmt.Sprintf("fd00::%d", i)), Mask: net.CIDRMask(64, 128)}
		if err := ip.SetupIPMasqForNetworks(&backend, []*net.IPNet{ipn, ip6}, network, "eth0", cid(i)); err != nil {
			t.Fatalf("bridge's ipMasq setup: %v", err)
		}
	}
	left := func() []string {
		t.Helper()
		nft, err := knftables.New(knftables.InetFamily, ipMasqTable)
		if err != nil {
			t.Fatal(err)
		}
		rules, err := nft.ListRules(context.Background(), ipMasqChain)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, r := range rules {
			if r.Comment != nil {
				out = append(out, *r.Comment)
			}
		}
		slices.Sort(out)
		return out
	}
	want := func(attachments ...[2]any) []string {
		var out []string
		for _, a := range attachments {
			c := nftComment(a[0].(string), "eth0", cid(a[1].(int)))
			out = append(out, c, c) // one rule per address family
		}
		slices.Sort(out)
		return out
	}

	var nft nftBackend
	owner := func(network string, i int) string {
		o, ok := nft.OwnerOf(network, cid(i), "eth0")
		if !ok {
			t.Fatalf("no owner for %s", cid(i))
		}
		return o
	}
	release := func(network string, owners ...string) map[string][]string {
		t.Helper()
		rules, err := nft.List(network)
		if err != nil {
			t.Fatalf("list: %v", err)
		}
		removed, failed := rules.Release(owners)
		if len(failed) > 0 {
			t.Fatalf("release %v: %v", owners, failed)
		}
		return removed
	}
	err = netns.Do(func(ns.NetNS) error {
		// Nothing made yet: no table, nothing to do, no error.
		if _, err := nft.Teardown(network, owner(network, 1)); err != nil {
			t.Errorf("teardown without bridge's table: %v", err)
		}
		if removed := release(network, owner(network, 1)); len(removed) != 0 {
			t.Errorf("release without bridge's table removed %v", removed)
		}
		if _, ok := nft.OwnerOf(network, cid(1), ""); ok {
			t.Errorf("an attachment without ifname has an owner")
		}
		for i := 1; i <= 4; i++ {
			setup(i, network)
		}
		setup(5, "other")
		for _, c := range left() {
			if len(c) > knftables.CommentLengthMax || !strings.HasPrefix(c, nftNetworkHash(network)) && !strings.HasPrefix(c, nftNetworkHash("other")) {
				t.Fatalf("unexpected comment from bridge: %q", c)
			}
		}
		if got, all := left(), want([2]any{network, 1}, [2]any{network, 2}, [2]any{network, 3}, [2]any{network, 4}, [2]any{"other", 5}); !slices.Equal(got, all) {
			t.Fatalf("bridge's comments are not the ones computed here:\n got %q\nwant %q", got, all)
		}

		// A teardown of an attachment without rules removes nothing,
		// and the same container ID on another network keeps its own.
		for _, o := range []string{owner(network, 9), owner("other", 1)} {
			if removed, err := nft.Teardown(network, o); err != nil || len(removed) != 0 {
				t.Fatalf("teardown of %s, which has no rules: %v %v", o, removed, err)
			}
		}
		if removed, err := nft.Teardown(network, owner(network, 1)); err != nil || len(removed) != 1 || !strings.HasSuffix(removed[0], "(2)") {
			t.Fatalf("teardown: %v %v, want both families' rules named", removed, err)
		}
		if got, w := left(), want([2]any{network, 2}, [2]any{network, 3}, [2]any{network, 4}, [2]any{"other", 5}); !slices.Equal(got, w) {
			t.Fatalf("after teardown of 1:\n got %q\nwant %q", got, w)
		}
		if removed, err := nft.Teardown(network, owner(network, 1)); err != nil || len(removed) != 0 {
			t.Errorf("second teardown: %v %v", removed, err)
		}

		// A sweep's batch: 2 and 4 are stale; 5 has the same ID on
		// another network and stays.
		if removed := release(network, owner(network, 2), owner(network, 4), owner(network, 5)); len(removed) != 2 {
			t.Errorf("release named %v, want 2 and 4", removed)
		}
		if got, w := left(), want([2]any{network, 3}, [2]any{"other", 5}); !slices.Equal(got, w) {
			t.Fatalf("after releasing 2 and 4:\n got %q\nwant %q", got, w)
		}

		// Orphans: a listing names every owner once, with the attachment
		// its comment names (6's ID cut); another network's rule (5) is
		// not among them. Releasing one leaves the others, and takes it
		// out of the listing.
		setup(6, network)
		setup(7, network)
		rules, err := nft.List(network)
		if err != nil {
			t.Fatal(err)
		}
		owners := rules.Owners()
		if len(owners) != 3 {
			t.Fatalf("owners = %+v, want 3, 6 and 7", owners)
		}
		for _, o := range owners {
			if o.IfName != "eth0" || !o.Cut || len(o.ContainerID) < 16 || len(rules.Owned(o.Owner)) != 1 {
				t.Errorf("owner %+v (owns %v): want eth0, a cut ID, its rules", o, rules.Owned(o.Owner))
			}
		}
		if o := owners[1]; o.Owner != owner(network, 6) || !strings.HasPrefix(cid(6), o.ContainerID) {
			t.Errorf("second owner %+v, want 6's", o)
		}
		removed, failed := rules.Release([]string{owner(network, 6)})
		if len(failed) != 0 || len(removed[owner(network, 6)]) != 1 || len(rules.Owners()) != 2 || rules.Owned(owner(network, 6)) != nil {
			t.Errorf("release of 6: removed %v, failed %v, owners after %+v", removed, failed, rules.Owners())
		}
		if got, w := left(), want([2]any{network, 3}, [2]any{network, 7}, [2]any{"other", 5}); !slices.Equal(got, w) {
			t.Fatalf("after the orphan's release:\n got %q\nwant %q", got, w)
		}

		// A DEL of one attachment of a container whose other attachment
		// lives keeps the rules they share (iptables'), not bridge's
		// nftables rules: those are the attachment's own, and go.
		if _, err := (&Cleaner{NFTables: nft}).ReleaseAttachment(network, "eth0", cid(3), false); err != nil {
			t.Fatalf("release of 3's attachment: %v", err)
		}
		if got, w := left(), want([2]any{network, 7}, [2]any{"other", 5}); !slices.Equal(got, w) {
			t.Fatalf("after the release of 3's attachment, another of its attachments alive:\n got %q\nwant %q", got, w)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// nftComment is the whole comment bridge gives one attachment's rules
// (commentForInstance upstream).
func nftComment(network, ifname, containerID string) string {
	comment := fmt.Sprintf("%s, net: %s, if: %s, id: %s",
		nftInstanceHash(network, ifname, containerID),
		strings.ReplaceAll(network, `"`, ``),
		strings.ReplaceAll(ifname, `"`, ``),
		strings.ReplaceAll(containerID, `"`, ``),
	)
	if len(comment) > knftables.CommentLengthMax {
		comment = comment[:knftables.CommentLengthMax]
	}
	return comment
}

// A comment whole names its attachment exactly; one bridge cut names the
// beginning of its container ID, and says so; another network's is not
// read.
func TestParseNFTComment(t *testing.T) {
	cid := "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	o, ok := parseNFTComment("nomad", nftComment("nomad", "eth0", cid))
	if !ok || o.Cut || o.ContainerID != cid || o.IfName != "eth0" || o.Owner != nftInstanceHash("nomad", "eth0", cid) {
		t.Errorf("whole comment: %+v, %v", o, ok)
	}
	long := "a-network-name-long-enough-for-bridge-to-cut-the-comment"
	o, ok = parseNFTComment(long, nftComment(long, "eth1", cid))
	if !ok || !o.Cut || o.IfName != "eth1" || !strings.HasPrefix(cid, o.ContainerID) || o.Owner != nftInstanceHash(long, "eth1", cid) {
		t.Errorf("cut comment: %+v, %v", o, ok)
	}
	if _, ok := parseNFTComment("other", nftComment("nomad", "eth0", cid)); ok {
		t.Error("another network's comment was read as this one's")
	}
}

// A rule in bridge's ipMasq chain whose userdata is malformed (anyone with
// CAP_NET_ADMIN writes it) is no one's: the release of an attachment's
// rules passes it by instead of panicking (userdata.Get slices past the
// end of such a TLV).
func TestNFTablesReleaseSurvivesMalformedUserdata(t *testing.T) {
	if _, err := exec.LookPath("nft"); err != nil {
		testhost.SkipOrFail(t, "bridge's nftables ipMasq needs the nft binary (.ci/run installs nftables)")
	}
	netns := nftNamespace(t)
	var err error
	backend := "nftables"
	err = netns.Do(func(ns.NetNS) error {
		ipn := &net.IPNet{IP: net.IPv4(10, 9, 0, 2), Mask: net.CIDRMask(24, 32)}
		if err := ip.SetupIPMasqForNetworks(&backend, []*net.IPNet{ipn}, "net", "eth0", "c1"); err != nil {
			t.Fatalf("bridge's ipMasq setup: %v", err)
		}
		conn, err := nftables.New()
		if err != nil {
			t.Fatal(err)
		}
		chain := googleChain(t, conn, nftables.TableFamilyINet, ipMasqTable, ipMasqChain)
		conn.AddRule(&nftables.Rule{Table: chain.Table, Chain: chain,
			Exprs:    []expr.Any{&expr.Counter{}},
			UserData: []byte{0, 200, 'x'}, // a comment TLV longer than itself
		})
		if err := conn.Flush(); err != nil {
			t.Fatal(err)
		}
		var nft nftBackend
		owner, _ := nft.OwnerOf("net", "c1", "eth0")
		removed, err := nft.Teardown("net", owner)
		if err != nil || len(removed) != 1 {
			t.Fatalf("teardown: %v %v, want c1's rule", removed, err)
		}
		rules, err := conn.GetRules(chain.Table, chain)
		if err != nil || len(rules) != 1 {
			t.Fatalf("left in the chain: %d rules (%v), want the malformed one", len(rules), err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// portmap's nftables rules of an attachment go only when they carry its
// container ID and name one of its addresses: the same container ID on
// another network (another address) and other containers keep theirs.
func TestPortmapNFTReleaseTakesOnlyTheAttachmentsRules(t *testing.T) {
	netns := nftNamespace(t)
	var err error
	err = netns.Do(func(ns.NetNS) error {
		conn, err := nftables.New()
		if err != nil {
			t.Fatal(err)
		}
		table := conn.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: portmapNFTTable})
		hostports := conn.AddChain(&nftables.Chain{Table: table, Name: "hostports"})
		hostIP := conn.AddChain(&nftables.Chain{Table: table, Name: "hostip_hostports"}) // older portmaps'
		masq := conn.AddChain(&nftables.Chain{Table: table, Name: "masquerading"})
		dnat := func(chain *nftables.Chain, cid string, ip net.IP) {
			conn.AddRule(&nftables.Rule{Table: table, Chain: chain,
				Exprs:    []expr.Any{&expr.Immediate{Register: 1, Data: ip.To4()}, &expr.Counter{}},
				UserData: userdata.AppendString(nil, userdata.TypeComment, cid)})
		}
		saddr := func(cid string, ip net.IP) {
			conn.AddRule(&nftables.Rule{Table: table, Chain: masq,
				Exprs: []expr.Any{
					&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
					&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ip.To4()},
					&expr.Counter{},
				},
				UserData: userdata.AppendString(nil, userdata.TypeComment, cid)})
		}
		dnat(hostports, "c1", net.IPv4(10, 0, 0, 5))
		saddr("c1", net.IPv4(10, 0, 0, 5))
		dnat(hostIP, "c1", net.IPv4(10, 0, 0, 5))
		dnat(hostports, "c1", net.IPv4(10, 1, 0, 9)) // c1 on another network
		dnat(hostports, "c2", net.IPv4(10, 0, 0, 6))
		if err := conn.Flush(); err != nil {
			t.Fatal(err)
		}
		c := &Cleaner{PortmapNFT: true}
		rules, err := c.ListPortmapNFT()
		if err != nil {
			t.Fatal(err)
		}
		addr := []netip.Addr{netip.MustParseAddr("10.0.0.5")}
		if what, err := rules.Release("c1", addr, true); err != nil || len(what) != 1 || what[0] != "portmap nftables rules of c1 (3)" {
			t.Fatalf("dry run: %q %v", what, err)
		}
		if what, err := rules.Release("c1", addr, false); err != nil || len(what) != 1 {
			t.Fatalf("release: %q %v", what, err)
		}
		left, err := c.ListPortmapNFT()
		if err != nil {
			t.Fatal(err)
		}
		if n := len(left.byComment["c1"]) + len(left.byComment["c2"]); n != 2 {
			t.Fatalf("%d rules left, want c1's on the other network and c2's", n)
		}
		for _, r := range left.byComment["c1"] {
			if slices.Contains(r.addrs, addr[0]) {
				t.Errorf("rule %d of c1 at 10.0.0.5 left", r.ref.Handle)
			}
		}
		if what, err := (&Cleaner{}).ListPortmapNFT(); err != nil || what.byComment != nil {
			t.Errorf("a cleaner without PortmapNFT listed: %v", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// nftNamespace is a throw-away network namespace for tests of nftables
// state, removed when the test ends.
func nftNamespace(t *testing.T) ns.NetNS {
	t.Helper()
	netns, err := ns.GetNS(kitns.New(t, "nbc-nft").Path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netns.Close() })
	return netns
}

// googleChain finds a chain through google/nftables, a client other than
// the one under test.
func googleChain(t *testing.T, conn *nftables.Conn, family nftables.TableFamily, table, chain string) *nftables.Chain {
	t.Helper()
	chains, err := conn.ListChainsOfTableFamily(family)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range chains {
		if c.Name == chain && c.Table != nil && c.Table.Name == table {
			return c
		}
	}
	t.Fatalf("no chain %s in table %s", chain, table)
	return nil
}
