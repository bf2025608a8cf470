// Package iptstate reads and edits iptables tables as `iptables -S` prints
// them. The e2e tests and the benchmark harness use it to check what the
// plugins wrote and to remove exactly what they created.
package iptstate

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/hostcmd"
)

// timeout bounds one iptables command (-w waits for the xtables lock).
const timeout = 2 * time.Minute

// Families are the iptables front ends; bridge, portmap and firewall write
// IPv6 rules with ip6tables when a container has an IPv6 address.
var Families = []string{"iptables", "ip6tables"}

// Chains that portmap and firewall share between every network and
// container.
const (
	HostportDNATChain = "CNI-HOSTPORT-DNAT"
	HostportMarkChain = "CNI-HOSTPORT-SETMARK"
	HostportMasqChain = "CNI-HOSTPORT-MASQ"
	FirewallChain     = "CNI-FORWARD"
)

var SharedChains = []string{HostportDNATChain, HostportMarkChain, HostportMasqChain, FirewallChain}

// Rule is one "-A CHAIN spec..." line of `iptables -S`.
type Rule struct {
	Chain string
	Spec  []string
}

func (r Rule) String() string {
	return "-A " + r.Chain + " " + strings.Join(r.Spec, " ")
}

// Value returns the argument following flag (e.g. "-j", "--comment").
func (r Rule) Value(flag string) string {
	for i := 0; i+1 < len(r.Spec); i++ {
		if r.Spec[i] == flag {
			return r.Spec[i+1]
		}
	}
	return ""
}

func (r Rule) Target() string  { return r.Value("-j") }
func (r Rule) Comment() string { return r.Value("--comment") }

// Addrs returns the -s and -d arguments of the rule that parse as
// addresses or prefixes.
func (r Rule) Addrs() []netip.Prefix {
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

// Table is one table as `iptables -S` prints it.
type Table struct {
	Chains map[string]bool
	Rules  []Rule
}

// RulesIn returns the rules of chain, in order.
func (tb Table) RulesIn(chain string) []Rule {
	var out []Rule
	for _, r := range tb.Rules {
		if r.Chain == chain {
			out = append(out, r)
		}
	}
	return out
}

// Read lists a table with `<fam> -w -t <table> -S`. (-S prints rules in a
// form that is valid input again, which is what DeleteRule relies on.)
func Read(fam, table string) (Table, error) {
	out, err := hostcmd.Output(timeout, fam, "-w", "-t", table, "-S")
	if err != nil {
		return Table{}, err
	}
	tb := Table{Chains: map[string]bool{}}
	for line := range strings.SplitSeq(out, "\n") {
		words, err := SplitRule(line)
		if err != nil {
			return Table{}, fmt.Errorf("%s -t %s -S: %w", fam, table, err)
		}
		if len(words) < 2 {
			continue
		}
		switch words[0] {
		case "-P", "-N":
			tb.Chains[words[1]] = true
		case "-A":
			tb.Rules = append(tb.Rules, Rule{Chain: words[1], Spec: words[2:]})
		}
	}
	return tb, nil
}

// SplitRule splits an `iptables -S` line into words. iptables quotes words
// that contain blanks or quotes with double quotes and escapes `"` and `\`
// inside them with a backslash (e.g. --comment "name: \"net\" id: \"x\"").
func SplitRule(line string) ([]string, error) {
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

// DeleteRule deletes r from table.
func DeleteRule(fam, table string, r Rule) error {
	return hostcmd.Run(timeout, fam, append([]string{"-w", "-t", table, "-D", r.Chain}, r.Spec...)...)
}

// DropChain flushes and deletes chain.
func DropChain(fam, table, chain string) error {
	if err := hostcmd.Run(timeout, fam, "-w", "-t", table, "-F", chain); err != nil {
		return err
	}
	return hostcmd.Run(timeout, fam, "-w", "-t", table, "-X", chain)
}

// RemoveIdleSharedChains deletes, in family fam, the shared portmap and
// firewall chains for which existedBefore is false, provided nothing
// per-container is left in them (then nothing can depend on them), removing
// the jumps into them first. A chain created meanwhile by something else
// could be taken for one of ours; that is why an idle chain is the
// condition: removing it loses nothing, the plugins re-create it on use.
// A chain still in use is left, and reported to inUse when it is not nil.
func RemoveIdleSharedChains(fam string, existedBefore func(table, chain string) bool, inUse func(table, chain string, rules []Rule)) []error {
	// The chains and, for each, what a rule inside it may be for the chain
	// to count as unused: portmap's mark/masquerade boilerplate is fine, a
	// jump to a per-container chain or a per-address rule is not.
	type shared struct {
		table, chain string
		idle         func(r Rule) bool
	}
	list := []shared{
		{"nat", HostportDNATChain, func(Rule) bool { return false }},
		{"nat", HostportMasqChain, func(r Rule) bool { return r.Target() == "MASQUERADE" && r.Value("--mark") != "" }},
		{"nat", HostportMarkChain, func(r Rule) bool { return r.Target() == "MARK" }},
		{"filter", FirewallChain, func(Rule) bool { return false }},
	}
	var errs []error
	for _, sc := range list {
		if existedBefore(sc.table, sc.chain) {
			continue
		}
		tb, err := Read(fam, sc.table)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !tb.Chains[sc.chain] {
			continue
		}
		if slices.ContainsFunc(tb.RulesIn(sc.chain), func(r Rule) bool { return !sc.idle(r) }) {
			if inUse != nil {
				inUse(sc.table, sc.chain, tb.RulesIn(sc.chain))
			}
			continue
		}
		var jumpErr error
		for _, r := range tb.Rules {
			if r.Target() == sc.chain && r.Chain != sc.chain {
				jumpErr = errors.Join(jumpErr, DeleteRule(fam, sc.table, r))
			}
		}
		if jumpErr == nil {
			jumpErr = DropChain(fam, sc.table, sc.chain)
		}
		if jumpErr != nil {
			errs = append(errs, fmt.Errorf("%s: remove shared chain %s: %w", fam, sc.chain, jumpErr))
		}
	}
	return errs
}

// Tables are the tables the plugins write to: nat (bridge's ipMasq,
// portmap) and filter (firewall).
var Tables = []string{"nat", "filter"}

// EachTable reads every table of every family and calls fn with it,
// returning fn's errors and those of tables that could not be read (which
// are skipped).
func EachTable(fn func(fam, table string, tb Table) []error) []error {
	var errs []error
	for _, fam := range Families {
		for _, table := range Tables {
			tb, err := Read(fam, table)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			errs = append(errs, fn(fam, table, tb)...)
		}
	}
	return errs
}
