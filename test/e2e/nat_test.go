package e2e

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/utils"
)

// A container's NAT state: what bridge (ipMasq) and portmap wrote for it in
// the nat table of both families, read in one go and checked against what
// the test expects with one assertion.

// masqComment is the comment bridge puts on its ipMasq jump.
func (e *testEnv) masqComment(cid string) string { return utils.FormatComment(e.netName, cid) }

// masqChain is bridge's per-container ipMasq chain.
func (e *testEnv) masqChain(cid string) string { return utils.FormatChainName(e.netName, cid) }

// dnatComment is the comment portmap puts on its per-container jump.
func (e *testEnv) dnatComment(cid string) string {
	return fmt.Sprintf(`dnat name: %q id: %q`, e.netName, cid)
}

// dnatChain is portmap's per-container DNAT chain.
func (e *testEnv) dnatChain(cid string) string {
	return utils.MustFormatChainNameWithPrefix(e.netName, cid, "DN-")
}

// natRules is one family's share of a container's NAT state.
type natRules struct {
	// masqJumps and dnatJumps are the rules, in any chain, that carry
	// bridge's or portmap's comment for the container or jump to its chain.
	masqJumps, dnatJumps []ipRule
	// masq and dnat are the rules inside the container's two chains;
	// hasMasq and hasDNAT say whether the chains exist.
	masq, dnat       []ipRule
	hasMasq, hasDNAT bool
}

// natState is a container's NAT state by family.
type natState map[string]natRules

func (s natState) String() string {
	var b strings.Builder
	for _, fam := range ipFamilies {
		r := s[fam]
		fmt.Fprintf(&b, "%s: masq chain %v, dnat chain %v\n", fam, r.hasMasq, r.hasDNAT)
		for _, rules := range [][]ipRule{r.masqJumps, r.masq, r.dnatJumps, r.dnat} {
			for _, rule := range rules {
				b.WriteString("  " + rule.String() + "\n")
			}
		}
	}
	return b.String()
}

// readNAT reads cid's NAT state, one nat table read per family.
func (e *testEnv) readNAT(t *testing.T, cid string) natState {
	t.Helper()
	masqChain, dnatChain := e.masqChain(cid), e.dnatChain(cid)
	s := natState{}
	for _, fam := range ipFamilies {
		nat := mustReadTable(t, fam, "nat")
		var r natRules
		for _, rule := range nat.Rules {
			switch {
			case rule.Chain == masqChain:
				r.masq = append(r.masq, rule)
			case rule.Chain == dnatChain:
				r.dnat = append(r.dnat, rule)
			case rule.Comment() == e.masqComment(cid) || rule.Target() == masqChain:
				r.masqJumps = append(r.masqJumps, rule)
			case rule.Comment() == e.dnatComment(cid) || rule.Target() == dnatChain:
				r.dnatJumps = append(r.dnatJumps, rule)
			}
		}
		r.hasMasq, r.hasDNAT = nat.Chains[masqChain], nat.Chains[dnatChain]
		s[fam] = r
	}
	return s
}

// mappedPort is the container port every port mapping of the tests
// forwards to (see portMappings).
const mappedPort = 80

// portMap is one host port portmap forwards to the container's Addr, port
// mappedPort, over tcp.
type portMap struct {
	Host int
	Addr netip.Addr
}

// natWant is the NAT state a container must have; the zero value means
// none at all, in either family.
type natWant struct {
	Masq []netip.Addr // the addresses bridge masquerades
	DNAT []portMap
}

// assertNAT reads cid's NAT state and checks it is exactly want, in both
// families:
//   - bridge: one POSTROUTING jump per address, from the address (-s), with
//     bridge's comment, into the per-container chain named the way bridge
//     names it, which exists and masquerades;
//   - portmap: one CNI-HOSTPORT-DNAT jump (the tests map tcp only; portmap
//     writes one per protocol) with portmap's comment, matching every host
//     port, into the per-container chain named the way portmap names it,
//     which exists and, per mapping, marks hairpin traffic from the
//     container's subnet for masquerade and DNATs to addr:mappedPort;
//   - for a family with no address in want: no rule with either comment,
//     no jump to either chain, no chain.
func (e *testEnv) assertNAT(t *testing.T, cid string, want natWant) {
	t.Helper()
	st := e.readNAT(t, cid)
	var problems []string
	for _, fam := range ipFamilies {
		r := st[fam]
		is6 := fam == "ip6tables"
		masq := slices.DeleteFunc(slices.Clone(want.Masq), func(a netip.Addr) bool { return a.Is6() != is6 })
		dnat := slices.DeleteFunc(slices.Clone(want.DNAT), func(p portMap) bool { return p.Addr.Is6() != is6 })
		for _, p := range e.masqProblems(cid, r, masq) {
			problems = append(problems, fam+": "+p)
		}
		for _, p := range e.dnatProblems(cid, r, dnat) {
			problems = append(problems, fam+": "+p)
		}
	}
	if len(problems) > 0 {
		t.Fatalf("NAT state of %s is not %+v:\n%s\nhave:\n%s", cid, want, strings.Join(problems, "\n"), st)
	}
}

// masqProblems compares one family's ipMasq state with the addresses of
// that family bridge must masquerade.
func (e *testEnv) masqProblems(cid string, r natRules, addrs []netip.Addr) []string {
	if len(addrs) == 0 {
		if len(r.masqJumps) > 0 || r.hasMasq {
			return []string{"masquerade rules or chain left"}
		}
		return nil
	}
	var out []string
	if len(r.masqJumps) != len(addrs) {
		out = append(out, fmt.Sprintf("%d masquerade jumps, want one per address %v", len(r.masqJumps), addrs))
	}
	for _, j := range r.masqJumps {
		if j.Chain != "POSTROUTING" || j.Target() != e.masqChain(cid) || j.Comment() != e.masqComment(cid) {
			out = append(out, fmt.Sprintf("masquerade jump is not POSTROUTING -> %s with comment %q: %s", e.masqChain(cid), e.masqComment(cid), j))
		}
	}
	for _, a := range addrs {
		if !slices.ContainsFunc(r.masqJumps, func(j ipRule) bool { return source(j) == netip.PrefixFrom(a, a.BitLen()) }) {
			out = append(out, fmt.Sprintf("no masquerade jump from %s", a))
		}
	}
	if !r.hasMasq {
		out = append(out, fmt.Sprintf("masquerade chain %s does not exist", e.masqChain(cid)))
	} else if !slices.ContainsFunc(r.masq, func(x ipRule) bool { return x.Target() == "MASQUERADE" }) {
		out = append(out, fmt.Sprintf("chain %s does not masquerade", e.masqChain(cid)))
	}
	return out
}

// dnatProblems compares one family's portmap state with the mappings of
// that family.
func (e *testEnv) dnatProblems(cid string, r natRules, maps []portMap) []string {
	if len(maps) == 0 {
		if len(r.dnatJumps) > 0 || r.hasDNAT {
			return []string{"portmap rules or chain left"}
		}
		return nil
	}
	var out []string
	if len(r.dnatJumps) != 1 {
		return []string{fmt.Sprintf("%d portmap jumps, want one", len(r.dnatJumps))}
	}
	j := r.dnatJumps[0]
	if j.Chain != hostportDNATChain || j.Target() != e.dnatChain(cid) || j.Comment() != e.dnatComment(cid) {
		out = append(out, fmt.Sprintf("portmap jump is not %s -> %s with comment %q: %s", hostportDNATChain, e.dnatChain(cid), e.dnatComment(cid), j))
	}
	if !r.hasDNAT {
		out = append(out, fmt.Sprintf("portmap chain %s does not exist", e.dnatChain(cid)))
	}
	// portmap writes --destination-ports; iptables -S prints it as --dports.
	ports := strings.Split(j.Value("--dports")+j.Value("--destination-ports"), ",")
	for _, m := range maps {
		hostPort := fmt.Sprint(m.Host)
		if !slices.Contains(ports, hostPort) {
			out = append(out, fmt.Sprintf("portmap jump does not match host port %d", m.Host))
		}
		dest := netip.AddrPortFrom(m.Addr, mappedPort).String()
		if !slices.ContainsFunc(r.dnat, func(x ipRule) bool {
			return x.Target() == "DNAT" && x.Value("--dport") == hostPort && x.Value("--to-destination") == dest
		}) {
			out = append(out, fmt.Sprintf("no DNAT of port %d to %s", m.Host, dest))
		}
		if !slices.ContainsFunc(r.dnat, func(x ipRule) bool {
			return x.Target() == hostportMarkChain && x.Value("--dport") == hostPort && source(x).Contains(m.Addr)
		}) {
			out = append(out, fmt.Sprintf("no hairpin mark of port %d from %s's subnet", m.Host, m.Addr))
		}
	}
	return out
}

// source is the rule's -s prefix, the zero prefix if it has none.
func source(r ipRule) netip.Prefix {
	p, _ := netip.ParsePrefix(r.Value("-s"))
	return p
}

// networkNAT is the test network's part of the nat tables of both
// families, as text: every rule commented with the network's name or in or
// into a per-container chain of a container the test ever created, and
// those chains. Other tests running on the host cannot change it.
func (e *testEnv) networkNAT(t *testing.T) string {
	t.Helper()
	owned := e.ownedChains()
	var b strings.Builder
	for _, fam := range ipFamilies {
		nat := mustReadTable(t, fam, "nat")
		for _, c := range owned {
			if nat.Chains[c] {
				fmt.Fprintf(&b, "%s -N %s\n", fam, c)
			}
		}
		for _, r := range nat.Rules {
			if strings.Contains(r.Comment(), fmt.Sprintf("name: %q", e.netName)) || slices.Contains(owned, r.Target()) || slices.Contains(owned, r.Chain) {
				fmt.Fprintf(&b, "%s %s\n", fam, r)
			}
		}
	}
	return b.String()
}

// assertNetworkNATEmpty checks that nothing of the test network is left in
// the nat tables.
func (e *testEnv) assertNetworkNATEmpty(t *testing.T) {
	t.Helper()
	if left := e.networkNAT(t); left != "" {
		t.Errorf("NAT rules or chains of the network left:\n%s", left)
	}
}

// dropMasq deletes bridge's ipMasq jumps and chain of cid, both families,
// as something outside the plugins would, from an attachment without port
// mappings: no NAT state is left.
func (e *testEnv) dropMasq(t *testing.T, cid string) {
	t.Helper()
	for fam, r := range e.readNAT(t, cid) {
		for _, j := range r.masqJumps {
			if err := deleteRule(fam, "nat", j); err != nil {
				t.Fatalf("%v", err)
			}
		}
		if r.hasMasq {
			if err := dropChain(fam, "nat", e.masqChain(cid)); err != nil {
				t.Fatalf("%v", err)
			}
		}
	}
	e.assertNAT(t, cid, natWant{})
}
