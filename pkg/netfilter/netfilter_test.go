package netfilter

import (
	"fmt"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/utils"
)

// fakeTable models one iptables family's nat table as `iptables -S` lines.
type fakeTable struct {
	chains map[string][]string // chain -> "-A chain ..." lines
	calls  []string
}

func newFakeTable() *fakeTable {
	return &fakeTable{chains: map[string][]string{"POSTROUTING": nil, "PREROUTING": nil}}
}

func (f *fakeTable) add(chain, spec string) {
	if _, ok := f.chains[chain]; !ok {
		f.chains[chain] = nil
	}
	f.chains[chain] = append(f.chains[chain], "-A "+chain+" "+spec)
}

func (f *fakeTable) List(_, chain string) ([]string, error) {
	f.calls = append(f.calls, "list "+chain)
	rules, ok := f.chains[chain]
	if !ok {
		return nil, fmt.Errorf("no chain %s", chain)
	}
	return append([]string{"-N " + chain}, rules...), nil
}

func (f *fakeTable) ListChains(string) ([]string, error) {
	f.calls = append(f.calls, "listchains")
	var out []string
	for ch := range f.chains {
		out = append(out, ch)
	}
	sort.Strings(out)
	return out, nil
}

func (f *fakeTable) Delete(_, chain string, spec ...string) error {
	f.calls = append(f.calls, "delete "+chain)
	for i, line := range f.chains[chain] {
		words, _ := parseWords(line)
		if reflect.DeepEqual(words[2:], spec) {
			f.chains[chain] = append(f.chains[chain][:i], f.chains[chain][i+1:]...)
			return nil
		}
	}
	return fmt.Errorf("no such rule in %s: %v", chain, spec)
}

func (f *fakeTable) ClearAndDeleteChain(_, chain string) error {
	f.calls = append(f.calls, "clear+delete "+chain)
	for ch, rules := range f.chains {
		for _, r := range rules {
			if strings.HasSuffix(r, "-j "+chain) && ch != chain {
				return fmt.Errorf("chain %s still referenced from %s", chain, ch)
			}
		}
	}
	delete(f.chains, chain)
	return nil
}

func parseWords(line string) ([]string, error) {
	spec, _, ok := parseRule(line, strings.Fields(line)[1])
	if !ok {
		return strings.Fields(line), nil
	}
	return append(strings.Fields(line)[:2], spec...), nil
}

// bridgeRules installs what bridge's ipMasq and portmap create for one
// container, exactly as `iptables -S` prints them.
func bridgeRules(f *fakeTable, network, cid, ip string, portmap bool) {
	chain := utils.FormatChainName(network, cid)
	comment := fmt.Sprintf("%q", utils.FormatComment(network, cid))
	f.add("POSTROUTING", fmt.Sprintf("-s %s/32 -m comment --comment %s -j %s", ip, comment, chain))
	f.add(chain, fmt.Sprintf("-d 10.0.0.0/24 -m comment --comment %s -j ACCEPT", comment))
	f.add(chain, fmt.Sprintf("! -d 224.0.0.0/4 -m comment --comment %s -j MASQUERADE", comment))
	if portmap {
		dn := utils.MustFormatChainNameWithPrefix(network, cid, "DN-")
		dcomment := fmt.Sprintf("%q", fmt.Sprintf(`dnat name: %q id: %q`, network, cid))
		f.add("CNI-HOSTPORT-DNAT", fmt.Sprintf("-p tcp -m comment --comment %s -m multiport --dports 8080 -j %s", dcomment, dn))
		f.add(dn, fmt.Sprintf("-p tcp -m tcp --dport 8080 -j DNAT --to-destination %s:80", ip))
	}
}

func TestSnapshotFindsOnlyTheNetworksContainers(t *testing.T) {
	f := newFakeTable()
	bridgeRules(f, "nomad", "dead", "10.0.0.2", true)
	bridgeRules(f, "nomad", "live", "10.0.0.3", false)
	bridgeRules(f, "other", "dead", "10.0.1.2", true)
	f.add("POSTROUTING", `-s 10.9.0.0/16 -m comment --comment "unrelated rule" -j MASQUERADE`)
	c := &Cleaner{Tables: []Table{f}}
	s, err := c.Snapshot("nomad")
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Containers(); !reflect.DeepEqual(got, []string{"dead", "live"}) {
		t.Errorf("Containers = %v", got)
	}
	owned := s.Owned("dead")
	if len(owned) != 4 {
		t.Errorf("Owned(dead) = %v, want 2 jumps and 2 chains", owned)
	}
}

func TestReleaseRemovesJumpsThenChainsOfOneContainer(t *testing.T) {
	f := newFakeTable()
	bridgeRules(f, "nomad", "dead", "10.0.0.2", true)
	bridgeRules(f, "nomad", "live", "10.0.0.3", true)
	bridgeRules(f, "other", "dead", "10.0.1.2", true)
	c := &Cleaner{Tables: []Table{f}}
	s, err := c.Snapshot("nomad")
	if err != nil {
		t.Fatal(err)
	}
	removed, err := c.Release(s, "dead")
	if err != nil {
		t.Fatalf("Release: %v", err)
	}
	if len(removed) != 4 {
		t.Errorf("removed = %v", removed)
	}
	for _, gone := range []string{utils.FormatChainName("nomad", "dead"), utils.MustFormatChainNameWithPrefix("nomad", "dead", "DN-")} {
		if _, ok := f.chains[gone]; ok {
			t.Errorf("chain %s still there", gone)
		}
	}
	for _, kept := range []string{utils.FormatChainName("nomad", "live"), utils.FormatChainName("other", "dead"), utils.MustFormatChainNameWithPrefix("other", "dead", "DN-")} {
		if _, ok := f.chains[kept]; !ok {
			t.Errorf("chain %s of another container was removed", kept)
		}
	}
	if n := len(f.chains["POSTROUTING"]); n != 2 {
		t.Errorf("POSTROUTING has %d rules, want the 2 of live and other/dead", n)
	}
	if n := len(f.chains["CNI-HOSTPORT-DNAT"]); n != 2 {
		t.Errorf("CNI-HOSTPORT-DNAT has %d rules, want 2", n)
	}
	// A second release of the same container finds nothing to do.
	if removed, err := c.Release(s, "dead"); err != nil || len(removed) != 0 {
		t.Errorf("second Release = %v, %v", removed, err)
	}
}

func TestReleaseFindsChainWithoutJump(t *testing.T) {
	// A teardown that died between deleting the jump and the chain leaves
	// the chain alone; it is still found by its name.
	f := newFakeTable()
	bridgeRules(f, "nomad", "dead", "10.0.0.2", false)
	f.chains["POSTROUTING"] = nil
	c := &Cleaner{Tables: []Table{f}}
	s, _ := c.Snapshot("nomad")
	if _, err := c.Release(s, "dead"); err != nil {
		t.Fatal(err)
	}
	if _, ok := f.chains[utils.FormatChainName("nomad", "dead")]; ok {
		t.Error("orphan chain without a jump survived")
	}
}

func TestSnapshotListsEachChainOncePerFamily(t *testing.T) {
	v4, v6 := newFakeTable(), newFakeTable()
	for i := 0; i < 50; i++ {
		bridgeRules(v4, "nomad", fmt.Sprintf("c%d", i), fmt.Sprintf("10.0.0.%d", i+2), true)
	}
	c := &Cleaner{Tables: []Table{v4, v6}}
	if _, err := c.Snapshot("nomad"); err != nil {
		t.Fatal(err)
	}
	if want := []string{"listchains", "list POSTROUTING", "list CNI-HOSTPORT-DNAT"}; !reflect.DeepEqual(v4.calls, want) {
		t.Errorf("v4 calls = %v, want %v", v4.calls, want)
	}
	if want := []string{"listchains", "list POSTROUTING"}; !reflect.DeepEqual(v6.calls, want) {
		t.Errorf("v6 calls = %v, want %v", v6.calls, want)
	}
}

func TestReleaseNFTablesPassesKeepList(t *testing.T) {
	var gotNet string
	var gotKeep []types.GCAttachment
	c := &Cleaner{NFTablesGC: func(n string, keep []types.GCAttachment) error { gotNet, gotKeep = n, keep; return nil }}
	keep := []types.GCAttachment{{ContainerID: "live", IfName: "eth0"}}
	if err := c.ReleaseNFTables("nomad", keep); err != nil {
		t.Fatal(err)
	}
	if gotNet != "nomad" || !reflect.DeepEqual(gotKeep, keep) {
		t.Errorf("nft GC got %q %v", gotNet, gotKeep)
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
		net, cid, ok := ParseComment(tc.in)
		if net != tc.net || cid != tc.cid || ok != tc.ok {
			t.Errorf("ParseComment(%q) = %q %q %v, want %q %q %v", tc.in, net, cid, ok, tc.net, tc.cid, tc.ok)
		}
	}
}
