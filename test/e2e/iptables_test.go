package e2e

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/utils"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/internal/iptstate"
)

// ipFamilies are the iptables front ends.
var ipFamilies = iptstate.Families

// Chains that portmap and firewall share between every network and
// container. Tests never delete them while running; TestMain removes the ones
// this package created, once they are empty of per-container rules.
const (
	hostportDNATChain = iptstate.HostportDNATChain
	hostportMarkChain = iptstate.HostportMarkChain
	hostportMasqChain = iptstate.HostportMasqChain
	firewallChain     = iptstate.FirewallChain
)

// The rule and table readers are shared with the benchmark harness.
type (
	ipRule  = iptstate.Rule
	ipTable = iptstate.Table
)

var (
	readTable  = iptstate.Read
	deleteRule = iptstate.DeleteRule
	dropChain  = iptstate.DropChain
)

func mustReadTable(t *testing.T, fam, table string) ipTable {
	t.Helper()
	tb, err := readTable(fam, table)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return tb
}

// ---------------------------------------------------------------------------
// What a test owns

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

// ownedChains are the per-container chains the plugins name after the
// test's network and containers, plus the test's firewall admin chain.
func (e *testEnv) ownedChains() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	chains := []string{e.adminChain}
	for _, cid := range e.cids {
		chains = append(chains,
			e.masqChain(cid),
			e.dnatChain(cid),
			// portmap still tears down the chain older versions made.
			utils.MustFormatChainNameWithPrefix(e.netName, cid, "SN-"))
	}
	return chains
}

// ownsRule reports whether a rule belongs to this test: its comment names
// the test's network (bridge's and portmap's per-container jumps), it jumps
// to a chain the test owns, or it is a firewall rule for one of the test's
// addresses.
func (e *testEnv) ownsRule(r ipRule) bool {
	if strings.Contains(r.Comment(), fmt.Sprintf("name: %q", e.netName)) {
		return true
	}
	if slices.Contains(e.ownedChains(), r.Target()) {
		return true
	}
	if r.Chain == firewallChain {
		for _, p := range r.Addrs() {
			if e.subnet4.Overlaps(p) || e.subnet6.Overlaps(p) {
				return true
			}
		}
	}
	return false
}

// cleanupIPTables deletes the test's rules, then its chains. Shared chains
// (POSTROUTING, CNI-HOSTPORT-*, CNI-FORWARD) lose only the test's rules.
func (e *testEnv) cleanupIPTables() []error {
	owned := e.ownedChains()
	return iptstate.EachTable(func(fam, table string, tb ipTable) []error {
		var errs []error
		// Rules inside owned chains go with the chain; delete the
		// jumps into them (and the test's rules in shared chains).
		for _, r := range tb.Rules {
			if slices.Contains(owned, r.Chain) || !e.ownsRule(r) {
				continue
			}
			if err := deleteRule(fam, table, r); err != nil {
				errs = append(errs, err)
			}
		}
		for _, c := range owned {
			if tb.Chains[c] {
				if err := dropChain(fam, table, c); err != nil {
					errs = append(errs, err)
				}
			}
		}
		return errs
	})
}

// ---------------------------------------------------------------------------
// Assertions

// assertMasq checks bridge's ipMasq state for one container: a POSTROUTING
// jump from its address with the comment naming network and container, into
// the per-container chain, which exists and masquerades.
func (e *testEnv) assertMasq(t *testing.T, ns netns, addr netip.Addr) {
	t.Helper()
	fam := "iptables"
	if addr.Is6() {
		fam = "ip6tables"
	}
	nat := mustReadTable(t, fam, "nat")
	var jumps []ipRule
	for _, r := range nat.RulesIn("POSTROUTING") {
		if r.Comment() == e.masqComment(ns.cid) {
			jumps = append(jumps, r)
		}
	}
	if len(jumps) == 0 {
		t.Fatalf("%s -t nat POSTROUTING has no jump with comment %q:\n%s", fam, e.masqComment(ns.cid), rulesString(nat.RulesIn("POSTROUTING")))
	}
	var fromAddr *ipRule
	for i, r := range jumps {
		for _, p := range r.Addrs() {
			if p.Addr() == addr && r.Value("-s") != "" {
				fromAddr = &jumps[i]
			}
		}
	}
	if fromAddr == nil {
		t.Fatalf("no masquerade jump from %s among %s", addr, rulesString(jumps))
	}
	chain := fromAddr.Target()
	if chain != e.masqChain(ns.cid) {
		t.Errorf("masquerade jump goes to %s, want bridge's chain %s", chain, e.masqChain(ns.cid))
	}
	if !nat.Chains[chain] {
		t.Fatalf("masquerade chain %s does not exist", chain)
	}
	if !slices.ContainsFunc(nat.RulesIn(chain), func(r ipRule) bool { return r.Target() == "MASQUERADE" }) {
		t.Fatalf("chain %s does not masquerade:\n%s", chain, rulesString(nat.RulesIn(chain)))
	}
}

// assertNoMasq checks that no ipMasq state of the container is left, in
// either family.
func (e *testEnv) assertNoMasq(t *testing.T, ns netns) {
	t.Helper()
	for _, fam := range ipFamilies {
		nat := mustReadTable(t, fam, "nat")
		for _, r := range nat.Rules {
			if r.Comment() == e.masqComment(ns.cid) || r.Target() == e.masqChain(ns.cid) {
				t.Errorf("%s: masquerade rule left after DEL: %s", fam, r)
			}
		}
		if nat.Chains[e.masqChain(ns.cid)] {
			t.Errorf("%s: masquerade chain %s left after DEL", fam, e.masqChain(ns.cid))
		}
	}
}

// assertDNAT checks portmap's state for one container and host port: a jump
// from CNI-HOSTPORT-DNAT with the comment naming network and container, into
// the per-container chain, which DNATs the host port to addr:containerPort.
func (e *testEnv) assertDNAT(t *testing.T, ns netns, addr netip.Addr, hostPort, containerPort int) {
	t.Helper()
	nat := mustReadTable(t, "iptables", "nat")
	var jump *ipRule
	for _, r := range nat.RulesIn(hostportDNATChain) {
		if r.Comment() == e.dnatComment(ns.cid) {
			jump = &r
		}
	}
	if jump == nil {
		t.Fatalf("%s has no jump with comment %q:\n%s", hostportDNATChain, e.dnatComment(ns.cid), rulesString(nat.RulesIn(hostportDNATChain)))
	}
	if got, want := jump.Target(), e.dnatChain(ns.cid); got != want {
		t.Errorf("portmap jump goes to %s, want %s", got, want)
	}
	// portmap writes --destination-ports; iptables -S prints it as --dports.
	ports := jump.Value("--dports") + jump.Value("--destination-ports")
	if !slices.Contains(strings.Split(ports, ","), fmt.Sprint(hostPort)) {
		t.Errorf("portmap jump does not match host port %d: %s", hostPort, jump)
	}
	chain := jump.Target()
	if !nat.Chains[chain] {
		t.Fatalf("portmap chain %s does not exist", chain)
	}
	dest := netip.AddrPortFrom(addr, uint16(containerPort)).String()
	if !slices.ContainsFunc(nat.RulesIn(chain), func(r ipRule) bool {
		return r.Target() == "DNAT" && r.Value("--dport") == fmt.Sprint(hostPort) && r.Value("--to-destination") == dest
	}) {
		t.Fatalf("chain %s has no DNAT of port %d to %s:\n%s", chain, hostPort, dest, rulesString(nat.RulesIn(chain)))
	}
}

// assertNoDNAT checks that portmap left nothing of the container.
func (e *testEnv) assertNoDNAT(t *testing.T, ns netns) {
	t.Helper()
	for _, fam := range ipFamilies {
		nat := mustReadTable(t, fam, "nat")
		for _, r := range nat.Rules {
			if r.Comment() == e.dnatComment(ns.cid) || r.Target() == e.dnatChain(ns.cid) {
				t.Errorf("%s: portmap rule left after DEL: %s", fam, r)
			}
		}
		if nat.Chains[e.dnatChain(ns.cid)] {
			t.Errorf("%s: portmap chain %s left after DEL", fam, e.dnatChain(ns.cid))
		}
	}
}

// firewallRules returns the firewall plugin's per-address rules for addr.
func firewallRules(t *testing.T, addr netip.Addr) []ipRule {
	t.Helper()
	filter := mustReadTable(t, "iptables", "filter")
	var out []ipRule
	for _, r := range filter.RulesIn(firewallChain) {
		for _, p := range r.Addrs() {
			if p.Addr() == addr && p.Bits() == addr.BitLen() {
				out = append(out, r)
			}
		}
	}
	return out
}

// assertFirewall checks that the firewall plugin, which only sees the
// plugin's result as prevResult, accepted the container's address and hooked
// the test's admin chain in.
func (e *testEnv) assertFirewall(t *testing.T, addr netip.Addr) {
	t.Helper()
	rules := firewallRules(t, addr)
	if len(rules) != 2 {
		t.Fatalf("want firewall's 2 rules (-s, -d) for %s in %s, got:\n%s", addr, firewallChain, rulesString(rules))
	}
	filter := mustReadTable(t, "iptables", "filter")
	if !filter.Chains[e.adminChain] {
		t.Fatalf("firewall admin chain %s missing", e.adminChain)
	}
	if !slices.ContainsFunc(filter.RulesIn(firewallChain), func(r ipRule) bool { return r.Target() == e.adminChain }) {
		t.Fatalf("%s does not jump to %s", firewallChain, e.adminChain)
	}
}

func rulesString(rules []ipRule) string {
	var b strings.Builder
	for _, r := range rules {
		b.WriteString("  " + r.String() + "\n")
	}
	if len(rules) == 0 {
		return "  (none)\n"
	}
	return b.String()
}

// masqJumps are the POSTROUTING jumps bridge commented for cid.
func (e *testEnv) masqJumps(t *testing.T, fam, cid string) []ipRule {
	t.Helper()
	var out []ipRule
	for _, r := range mustReadTable(t, fam, "nat").RulesIn("POSTROUTING") {
		if r.Comment() == e.masqComment(cid) {
			out = append(out, r)
		}
	}
	return out
}

// dnatJumps are portmap's CNI-HOSTPORT-DNAT jumps for cid.
func (e *testEnv) dnatJumps(t *testing.T, fam, cid string) []ipRule {
	t.Helper()
	var out []ipRule
	for _, r := range mustReadTable(t, fam, "nat").RulesIn(hostportDNATChain) {
		if r.Comment() == e.dnatComment(cid) {
			out = append(out, r)
		}
	}
	return out
}

// assertNoNAT checks that none of cid's bridge or portmap NAT state is
// left, in either family.
func (e *testEnv) assertNoNAT(t *testing.T, cid string) {
	t.Helper()
	ns := netns{cid: cid}
	e.assertNoMasq(t, ns)
	e.assertNoDNAT(t, ns)
}

// assertNetworkNATEmpty checks that the nat tables hold no rule commented
// with the test's network and no per-container chain of any container the
// test ever created.
func (e *testEnv) assertNetworkNATEmpty(t *testing.T) {
	t.Helper()
	owned := e.ownedChains()
	for _, fam := range ipFamilies {
		nat := mustReadTable(t, fam, "nat")
		for _, r := range nat.Rules {
			if strings.Contains(r.Comment(), fmt.Sprintf("name: %q", e.netName)) || slices.Contains(owned, r.Target()) {
				t.Errorf("%s: rule of the network left: %s", fam, r)
			}
		}
		for _, c := range owned {
			if nat.Chains[c] {
				t.Errorf("%s: chain %s left", fam, c)
			}
		}
	}
}
