package e2e

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/utils"
)

// ipFamilies are the iptables front ends; bridge, portmap and firewall write
// IPv6 rules with ip6tables when a container has an IPv6 address.
var ipFamilies = []string{"iptables", "ip6tables"}

// Chains that portmap and firewall share between every network and
// container. Tests never delete them while running; TestMain removes the ones
// this package created, once they are empty of per-container rules.
const (
	hostportDNATChain = "CNI-HOSTPORT-DNAT"
	hostportMarkChain = "CNI-HOSTPORT-SETMARK"
	hostportMasqChain = "CNI-HOSTPORT-MASQ"
	firewallChain     = "CNI-FORWARD"
)

var sharedChains = []string{hostportDNATChain, hostportMarkChain, hostportMasqChain, firewallChain}

// ipRule is one "-A CHAIN spec..." line of `iptables -S`.
type ipRule struct {
	Chain string
	Spec  []string
}

func (r ipRule) String() string {
	return "-A " + r.Chain + " " + strings.Join(r.Spec, " ")
}

// value returns the argument following flag (e.g. "-j", "--comment").
func (r ipRule) value(flag string) string {
	for i := 0; i+1 < len(r.Spec); i++ {
		if r.Spec[i] == flag {
			return r.Spec[i+1]
		}
	}
	return ""
}

func (r ipRule) target() string  { return r.value("-j") }
func (r ipRule) comment() string { return r.value("--comment") }

// addrs returns the -s and -d arguments of the rule that parse as
// addresses or prefixes.
func (r ipRule) addrs() []netip.Prefix {
	var out []netip.Prefix
	for i := 0; i+1 < len(r.Spec); i++ {
		if r.Spec[i] != "-s" && r.Spec[i] != "-d" {
			continue
		}
		if p, err := netip.ParsePrefix(r.Spec[i+1]); err == nil {
			out = append(out, p)
		} else if a, err := netip.ParseAddr(r.Spec[i+1]); err == nil {
			out = append(out, netip.PrefixFrom(a, a.BitLen()))
		}
	}
	return out
}

// ipTable is one table as `iptables -S` prints it.
type ipTable struct {
	Chains map[string]bool
	Rules  []ipRule
}

func (tb ipTable) rulesIn(chain string) []ipRule {
	var out []ipRule
	for _, r := range tb.Rules {
		if r.Chain == chain {
			out = append(out, r)
		}
	}
	return out
}

// readTable lists a table with `iptables -S`. (-S prints rules in a form
// that is valid input again, which is what rule deletion relies on.)
func readTable(fam, table string) (ipTable, error) {
	out, err := output(fam, "-w", "-t", table, "-S")
	if err != nil {
		return ipTable{}, err
	}
	tb := ipTable{Chains: map[string]bool{}}
	for line := range strings.SplitSeq(out, "\n") {
		words, err := splitRule(line)
		if err != nil {
			return ipTable{}, fmt.Errorf("%s -t %s -S: %w", fam, table, err)
		}
		if len(words) < 2 {
			continue
		}
		switch words[0] {
		case "-P", "-N":
			tb.Chains[words[1]] = true
		case "-A":
			tb.Rules = append(tb.Rules, ipRule{Chain: words[1], Spec: words[2:]})
		}
	}
	return tb, nil
}

func mustReadTable(t *testing.T, fam, table string) ipTable {
	t.Helper()
	tb, err := readTable(fam, table)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return tb
}

// splitRule splits an `iptables -S` line into words. iptables quotes words
// that contain blanks or quotes with double quotes and escapes `"` and `\`
// inside them with a backslash (e.g. --comment "name: \"net\" id: \"x\"").
func splitRule(line string) ([]string, error) {
	var words []string
	var cur strings.Builder
	inWord, inQuote := false, false
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case inQuote && c == '\\' && i+1 < len(line):
			i++
			cur.WriteByte(line[i])
		case inQuote && c == '"':
			inQuote = false
		case c == '"':
			inQuote, inWord = true, true
		case !inQuote && (c == ' ' || c == '\t'):
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	if inQuote {
		return nil, fmt.Errorf("unterminated quote in %q", line)
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words, nil
}

func deleteRule(fam, table string, r ipRule) error {
	return run(fam, append([]string{"-w", "-t", table, "-D", r.Chain}, r.Spec...)...)
}

func dropChain(fam, table, chain string) error {
	if err := run(fam, "-w", "-t", table, "-F", chain); err != nil {
		return err
	}
	return run(fam, "-w", "-t", table, "-X", chain)
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
	if strings.Contains(r.comment(), fmt.Sprintf("name: %q", e.netName)) {
		return true
	}
	if slices.Contains(e.ownedChains(), r.target()) {
		return true
	}
	if r.Chain == firewallChain {
		for _, p := range r.addrs() {
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
	var errs []error
	owned := e.ownedChains()
	for _, fam := range ipFamilies {
		for _, table := range []string{"nat", "filter"} {
			tb, err := readTable(fam, table)
			if err != nil {
				errs = append(errs, err)
				continue
			}
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
		}
	}
	return errs
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
	for _, r := range nat.rulesIn("POSTROUTING") {
		if r.comment() == e.masqComment(ns.cid) {
			jumps = append(jumps, r)
		}
	}
	if len(jumps) == 0 {
		t.Fatalf("%s -t nat POSTROUTING has no jump with comment %q:\n%s", fam, e.masqComment(ns.cid), rulesString(nat.rulesIn("POSTROUTING")))
	}
	var fromAddr *ipRule
	for i, r := range jumps {
		for _, p := range r.addrs() {
			if p.Addr() == addr && r.value("-s") != "" {
				fromAddr = &jumps[i]
			}
		}
	}
	if fromAddr == nil {
		t.Fatalf("no masquerade jump from %s among %s", addr, rulesString(jumps))
	}
	chain := fromAddr.target()
	if chain != e.masqChain(ns.cid) {
		t.Errorf("masquerade jump goes to %s, want bridge's chain %s", chain, e.masqChain(ns.cid))
	}
	if !nat.Chains[chain] {
		t.Fatalf("masquerade chain %s does not exist", chain)
	}
	if !slices.ContainsFunc(nat.rulesIn(chain), func(r ipRule) bool { return r.target() == "MASQUERADE" }) {
		t.Fatalf("chain %s does not masquerade:\n%s", chain, rulesString(nat.rulesIn(chain)))
	}
}

// assertNoMasq checks that no ipMasq state of the container is left, in
// either family.
func (e *testEnv) assertNoMasq(t *testing.T, ns netns) {
	t.Helper()
	for _, fam := range ipFamilies {
		nat := mustReadTable(t, fam, "nat")
		for _, r := range nat.Rules {
			if r.comment() == e.masqComment(ns.cid) || r.target() == e.masqChain(ns.cid) {
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
	for _, r := range nat.rulesIn(hostportDNATChain) {
		if r.comment() == e.dnatComment(ns.cid) {
			jump = &r
		}
	}
	if jump == nil {
		t.Fatalf("%s has no jump with comment %q:\n%s", hostportDNATChain, e.dnatComment(ns.cid), rulesString(nat.rulesIn(hostportDNATChain)))
	}
	if got, want := jump.target(), e.dnatChain(ns.cid); got != want {
		t.Errorf("portmap jump goes to %s, want %s", got, want)
	}
	// portmap writes --destination-ports; iptables -S prints it as --dports.
	ports := jump.value("--dports") + jump.value("--destination-ports")
	if !slices.Contains(strings.Split(ports, ","), fmt.Sprint(hostPort)) {
		t.Errorf("portmap jump does not match host port %d: %s", hostPort, jump)
	}
	chain := jump.target()
	if !nat.Chains[chain] {
		t.Fatalf("portmap chain %s does not exist", chain)
	}
	dest := netip.AddrPortFrom(addr, uint16(containerPort)).String()
	if !slices.ContainsFunc(nat.rulesIn(chain), func(r ipRule) bool {
		return r.target() == "DNAT" && r.value("--dport") == fmt.Sprint(hostPort) && r.value("--to-destination") == dest
	}) {
		t.Fatalf("chain %s has no DNAT of port %d to %s:\n%s", chain, hostPort, dest, rulesString(nat.rulesIn(chain)))
	}
}

// assertNoDNAT checks that portmap left nothing of the container.
func (e *testEnv) assertNoDNAT(t *testing.T, ns netns) {
	t.Helper()
	for _, fam := range ipFamilies {
		nat := mustReadTable(t, fam, "nat")
		for _, r := range nat.Rules {
			if r.comment() == e.dnatComment(ns.cid) || r.target() == e.dnatChain(ns.cid) {
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
	for _, r := range filter.rulesIn(firewallChain) {
		for _, p := range r.addrs() {
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
	if !slices.ContainsFunc(filter.rulesIn(firewallChain), func(r ipRule) bool { return r.target() == e.adminChain }) {
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
