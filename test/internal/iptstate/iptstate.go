// Package iptstate reads and edits iptables tables as `iptables -S` prints
// them. The e2e tests and the benchmark harness use it to check what the
// plugins wrote and to remove exactly what they created.
package iptstate

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"time"
)

// timeout bounds one iptables command (-w waits for the xtables lock).
const timeout = 2 * time.Minute

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
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, fam, "-w", "-t", table, "-S")
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return Table{}, fmt.Errorf("%s -t %s -S: %w: %s", fam, table, err, bytes.TrimSpace(stderr.Bytes()))
	}
	tb := Table{Chains: map[string]bool{}}
	for line := range strings.SplitSeq(string(out), "\n") {
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
	return run(fam, append([]string{"-w", "-t", table, "-D", r.Chain}, r.Spec...)...)
}

// DropChain flushes and deletes chain.
func DropChain(fam, table, chain string) error {
	if err := run(fam, "-w", "-t", table, "-F", chain); err != nil {
		return err
	}
	return run(fam, "-w", "-t", table, "-X", chain)
}

func run(name string, args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}
