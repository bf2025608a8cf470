package netfilter

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/containernetworking/plugins/pkg/ip"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/google/nftables/xt"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/testhost"
)

// TestProbeFindsWhatTheListingFinds: in a throw-away namespace, rules made
// by bridge's own ipMasq code (both families), portmap-shaped DNAT jumps,
// and rules that only look like theirs; the in-process probe names exactly
// the containers `iptables -S` does, before and after a release.
func TestProbeFindsWhatTheListingFinds(t *testing.T) {
	if !inOwnNetns(t) {
		return
	}
	const network = "probe-net"
	backend := "iptables"
	ipt := func(bin string, args ...string) {
		t.Helper()
		if out, err := exec.Command(bin, append([]string{"-w", "-t", "nat"}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("%s %v: %v: %s", bin, args, err, out)
		}
	}
	// bridge's own code: a jump and a chain per container and family.
	for i, cid := range []string{"c0", fmt.Sprintf("%064x", 1), `quo"te\back`, "c3"} {
		ipn := &net.IPNet{IP: net.IPv4(10, 9, 0, byte(i+2)), Mask: net.CIDRMask(24, 32)}
		ip6 := &net.IPNet{IP: net.ParseIP(fmt.Sprintf("fd00::%d", i+2)), Mask: net.CIDRMask(64, 128)}
		if err := ip.SetupIPMasqForNetworks(&backend, []*net.IPNet{ipn, ip6}, network, "eth0", cid); err != nil {
			t.Fatalf("bridge's ipMasq setup: %v", err)
		}
	}
	// Another network's container, on the same table.
	other := &net.IPNet{IP: net.IPv4(10, 8, 0, 2), Mask: net.CIDRMask(24, 32)}
	if err := ip.SetupIPMasqForNetworks(&backend, []*net.IPNet{other}, "other-net", "eth0", "c0"); err != nil {
		t.Fatal(err)
	}
	// portmap's jump of a container with only port mappings (IPv6 only).
	dn := chainNameWithPrefix(network, "pm-only", portmapDNPrefix)
	ipt("ip6tables", "-N", hostportDNAT)
	ipt("ip6tables", "-N", dn)
	ipt("ip6tables", "-A", hostportDNAT, "-p", "tcp", "-m", "comment", "--comment", "dnat "+formatComment(network, "pm-only"),
		"-m", "multiport", "--dports", "8080", "-j", dn)
	// Look-alikes: a comment that does not round-trip, one in a chain the
	// sweep does not read, a rule without a comment.
	ipt("iptables", "-A", postrouting, "-s", "10.9.0.99/32", "-m", "comment", "--comment", `name: "probe-net" id: "x"y"`, "-j", "ACCEPT")
	ipt("iptables", "-A", "OUTPUT", "-m", "comment", "--comment", formatComment(network, "in-output"), "-j", "ACCEPT")
	ipt("iptables", "-A", postrouting, "-s", "10.9.0.98/32", "-j", "ACCEPT")

	c := New()
	compare := func(want []string) {
		t.Helper()
		probed, err := probeOwners(c, network)
		if err != nil {
			t.Fatalf("probe: %v", err)
		}
		snap, err := c.Snapshot(network)
		if err != nil {
			t.Fatal(err)
		}
		if listed := snap.Containers(); !slices.Equal(probed, listed) {
			t.Fatalf("probe found %q, iptables -S %q", probed, listed)
		}
		if !slices.Equal(probed, want) {
			t.Fatalf("probe found %q, want %q", probed, want)
		}
	}
	all := []string{fmt.Sprintf("%064x", 1), "c0", "c3", "pm-only", `quo"te\back`}
	compare(all)

	snap, err := c.Snapshot(network)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Release(snap, "c3"); err != nil {
		t.Fatal(err)
	}
	compare(slices.DeleteFunc(all, func(s string) bool { return s == "c3" }))
}

// TestProbeReadsUserdataComments: a rule whose comment is kept in the
// rule's userdata (as nft writes it, and as iptables-nft may) is found too.
func TestProbeReadsUserdataComments(t *testing.T) {
	if !inOwnNetns(t) {
		return
	}
	// iptables-nft makes the nat table and its POSTROUTING chain.
	if out, err := exec.Command("iptables", "-w", "-t", "nat", "-A", postrouting, "-s", "10.9.0.1/32", "-j", "ACCEPT").CombinedOutput(); err != nil {
		t.Fatalf("iptables: %v: %s", err, out)
	}
	conn, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	table := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: natTableName}
	conn.AddRule(&nftables.Rule{
		Table: table, Chain: &nftables.Chain{Table: table, Name: postrouting},
		Exprs:    []expr.Any{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictAccept}},
		UserData: userdata.AppendString(nil, userdata.TypeComment, formatComment("ud-net", "ud-cid")),
	})
	if err := conn.Flush(); err != nil {
		t.Fatal(err)
	}
	got, err := probeOwners(New(), "ud-net")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, []string{"ud-cid"}) {
		t.Fatalf("probe found %q, want [ud-cid]", got)
	}
}

// inOwnNetns runs the calling test again in a process of its own in a new
// network namespace (unshare --net), whose nat tables die with it: the
// probe and the iptables listing it is checked against both see that
// namespace, whichever thread runs them. It reports whether this is that
// process.
// TestProbeSinceAnswersFromTheLastProbeWhileNothingCommitted: in a
// throw-away namespace, a probe given the last probe of an unchanged
// ruleset answers with its owners, however wrong they are (so the dump
// was not read); any commit since, even in another table, makes it dump
// again; and a last probe of another namespace never matches.
func TestProbeSinceAnswersFromTheLastProbeWhileNothingCommitted(t *testing.T) {
	if !inOwnNetns(t) {
		return
	}
	const network = "since-net"
	backend := "iptables"
	ipn := &net.IPNet{IP: net.IPv4(10, 9, 0, 2), Mask: net.CIDRMask(24, 32)}
	if err := ip.SetupIPMasqForNetworks(&backend, []*net.IPNet{ipn}, network, "eth0", "c1"); err != nil {
		t.Fatal(err)
	}
	c := New()
	first, err := c.ProbeSince(network, nil)
	if err != nil || !slices.Equal(first.Owners, []string{"c1"}) || first.ID.Cookie == 0 {
		t.Fatalf("first probe %+v, %v", first, err)
	}
	kept := func(p Probed) func(RulesetID) ([]string, bool) {
		return func(id RulesetID) ([]string, bool) { return p.Owners, id == p.ID }
	}
	planted := Probed{ID: first.ID, Owners: []string{"from-the-last-probe"}}
	if again, err := c.ProbeSince(network, kept(planted)); err != nil || !slices.Equal(again.Owners, planted.Owners) || again.ID != first.ID || !again.Kept {
		t.Fatalf("probe of an unchanged ruleset %+v, %v: want the last probe's owners", again, err)
	}
	// A commit anywhere: a chain in the filter table.
	if out, err := exec.Command("iptables", "-w", "-t", "filter", "-N", "NBC-SINCE-TEST").CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	after, err := c.ProbeSince(network, kept(planted))
	if err != nil || !slices.Equal(after.Owners, []string{"c1"}) || after.Kept || after.ID == first.ID || after.ID.Cookie != first.ID.Cookie {
		t.Fatalf("probe after a commit %+v, %v: want a new dump under a new generation", after, err)
	}
	other := Probed{ID: RulesetID{Cookie: after.ID.Cookie + 1, Gen: after.ID.Gen, Families: after.ID.Families}, Owners: planted.Owners}
	if p, err := c.ProbeSince(network, kept(other)); err != nil || !slices.Equal(p.Owners, []string{"c1"}) || p.Kept {
		t.Fatalf("probe given another namespace's %+v: %+v, %v", other, p, err)
	}
}

// probeOwners is a probe with nothing kept: the owners it reads.
func probeOwners(c *Cleaner, network string) ([]string, error) {
	p, err := c.ProbeSince(network, nil)
	return p.Owners, err
}

func inOwnNetns(t *testing.T) bool {
	t.Helper()
	if os.Getenv("NBC_PROBE_NETNS") == t.Name() {
		return true
	}
	if os.Geteuid() != 0 {
		testhost.SkipOrFail(t, "a network namespace of its own needs root")
	}
	for _, bin := range []string{"unshare", "iptables", "ip6tables"} {
		if _, err := exec.LookPath(bin); err != nil {
			testhost.SkipOrFail(t, bin+" not in PATH (.ci/run installs util-linux and iptables)")
		}
	}
	for _, bin := range []string{"iptables", "ip6tables"} {
		if path, _ := exec.LookPath(bin); !nftBacked(path) {
			testhost.SkipOrFail(t, bin+" is not iptables-nft here: the probe does not apply")
		}
	}
	cmd := exec.Command("unshare", "--net", os.Args[0], "-test.run=^"+t.Name()+"$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), "NBC_PROBE_NETNS="+t.Name())
	out, err := cmd.CombinedOutput()
	t.Logf("in a new network namespace:\n%s", out)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return false
}

// Only an iptables that resolves to iptables-nft's binary is probed: a
// legacy one, a wrapper, a dangling link or a directory is listed.
func TestNFTBacked(t *testing.T) {
	dir := t.TempDir()
	file := func(name string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, nil, 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	link := func(name, to string) string {
		p := filepath.Join(dir, name)
		if err := os.Symlink(to, p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	nft := file("xtables-nft-multi")
	legacy := file("xtables-legacy-multi")
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "sub", "iptables-nft"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path string
		want bool
	}{
		{link("iptables", link("alt-iptables", link("iptables-nft", nft))), true},
		{nft, true},
		{link("iptables-legacy", legacy), false},
		{file("iptables-wrapper"), false},
		{link("dangling", filepath.Join(dir, "nowhere", "xtables-nft-multi")), false},
		{filepath.Join(dir, "sub", "iptables-nft"), false},
	} {
		if got := nftBacked(c.path); got != c.want {
			t.Errorf("nftBacked(%s) = %v, want %v", c.path, got, c.want)
		}
	}
}

// Tables the cleaner did not find on the host (tests' fakes) are never
// probed: their owners are only what they list.
func TestProbeNeedsTheHostsTables(t *testing.T) {
	c := &Cleaner{Tables: []Table{stubTable{}}}
	if _, err := probeOwners(c, "n"); !errors.Is(err, ErrNoProbe) {
		t.Fatalf("probe of a fake table: %v, want ErrNoProbe", err)
	}
	if _, err := probeOwners(&Cleaner{}, "n"); !errors.Is(err, ErrNoProbe) {
		t.Fatalf("probe without iptables: %v, want ErrNoProbe", err)
	}
}

type stubTable struct{}

func (stubTable) ListNAT() ([]string, error)                    { return nil, nil }
func (stubTable) Delete(string, string, ...string) error        { return nil }
func (stubTable) ClearAndDeleteChain(table, chain string) error { return nil }
func (stubTable) FlushChain(string, string) error               { return nil }
func (stubTable) DeleteChain(string, string) error              { return nil }

// A rule's userdata is anyone's: a TLV whose length runs past the end is
// no comment (userdata.Get, which the nftables release used, panics on it).
func TestUdataCommentOfMalformedUserdata(t *testing.T) {
	good := userdata.AppendString(userdata.AppendUint32(nil, 7, 42), userdata.TypeComment, "hi")
	if c, ok := udataComment(good); !ok || string(c) != "hi" {
		t.Fatalf("udataComment(%x) = %q, %v", good, c, ok)
	}
	for _, b := range [][]byte{nil, {0}, {0, 5, 'a'}, {7, 200, 1, 2}, append([]byte{7, 1, 0}, 0, 9, 'x')} {
		if c, ok := udataComment(b); ok {
			t.Errorf("udataComment(%x) = %q, want none", b, c)
		}
	}
}

// An xt comment match's info is NUL-terminated in 256 bytes: what
// follows the NUL is no part of the comment, whether google/nftables
// decoded it (xt.Comment) or not (xt.Unknown).
func TestMatchComment(t *testing.T) {
	info := make([]byte, xt.CommentSize)
	copy(info, "name: \"n\" id: \"c\"\x00junk")
	comment := xt.Comment(bytes.TrimRight(info, "\x00"))
	unknown := xt.Unknown(info)
	for _, i := range []xt.InfoAny{&comment, &unknown} {
		if c, ok := matchComment(i); !ok || c != `name: "n" id: "c"` {
			t.Errorf("matchComment(%T) = %q, %v", i, c, ok)
		}
	}
	if c, ok := matchComment(&xt.Tcp{}); ok {
		t.Errorf("matchComment of a tcp match = %q", c)
	}
}

func FuzzRuleComments(f *testing.F) {
	f.Add([]byte{8, 0, 7, 0, 0, 3, 'h', 'i'})
	f.Add([]byte("nat\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = udataComment(b)
		comment, unknown := xt.Comment(b), xt.Unknown(b)
		_, _ = matchComment(&comment)
		_, _ = matchComment(&unknown)
		ruleComments(&nftables.Rule{UserData: b, Exprs: []expr.Any{&expr.Match{Name: "comment", Info: &unknown}}}, func(c string) { _ = c })
		_ = appendExprValue(nil, &expr.Cmp{Data: b})
	})
}
