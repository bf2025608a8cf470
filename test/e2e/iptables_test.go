package e2e

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/utils"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/iptstate"
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
// The firewall plugin's rules

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

// assertNoFirewall checks that the firewall plugin left no rule for addr.
func assertNoFirewall(t *testing.T, addr netip.Addr) {
	t.Helper()
	if rules := firewallRules(t, addr); len(rules) != 0 {
		t.Errorf("firewall rules for %s left after DEL:\n%s", addr, rulesString(rules))
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
