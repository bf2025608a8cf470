package netfilter

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/utils"
)

// FuzzParseComment: only well-formed bridge/portmap comments parse, and a
// parsed comment is exactly what those plugins would have written.
func FuzzParseComment(f *testing.F) {
	for _, seed := range []string{`name: "nomad" id: "abc"`, `dnat name: "n" id: "c"`, `name: "a\"b" id: "c"`, `name: "" id: ""`, `name: "n" id: "c" `, `snat name: "n" id: "c"`} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, comment string) {
		network, cid, ok := ParseComment(comment)
		if !ok {
			return
		}
		if network == "" || cid == "" {
			t.Fatalf("empty field from %q", comment)
		}
		bridge := utils.FormatComment(network, cid)
		if comment != bridge && comment != "dnat "+bridge {
			t.Fatalf("%q parsed to %q/%q, which formats as %q", comment, network, cid, fmt.Sprint(bridge))
		}
	})
}

// FuzzParseCommentRoundTrip: whatever bridge or portmap writes for a
// network and a container ID parses back to them.
func FuzzParseCommentRoundTrip(f *testing.F) {
	for _, seed := range [][2]string{{"nomad", "abc"}, {"a\"b", "c d"}, {"n", "id: \"x\""}, {"\x00", "\u2028"}, {"`", "'"}} {
		f.Add(seed[0], seed[1])
	}
	f.Fuzz(func(t *testing.T, network, cid string) {
		if network == "" || cid == "" {
			return
		}
		for _, comment := range []string{utils.FormatComment(network, cid), "dnat " + utils.FormatComment(network, cid)} {
			if n, c, ok := ParseComment(comment); !ok || n != network || c != cid {
				t.Fatalf("%q parsed to %q %q %v, want %q %q", comment, n, c, ok, network, cid)
			}
		}
	})
}

// FuzzParseRule: any `iptables -S` line either yields a chain, a
// rulespec and, when it has one, a comment, or is skipped; never a panic.
func FuzzParseRule(f *testing.F) {
	f.Add(`-A POSTROUTING -s 10.0.0.2/32 -m comment --comment "name: \"n\" id: \"c\"" -j CNI-abc`)
	f.Add(`-A POSTROUTING -j MASQUERADE`)
	f.Add(`-N CNI-abc`)
	f.Add(`-A POSTROUTING --comment`)
	f.Fuzz(func(t *testing.T, line string) {
		chain, spec, ok := parseRule(line)
		if !ok {
			return
		}
		comment, commented := ruleComment(spec)
		if i := slices.Index(spec, "--comment"); commented != (i >= 0 && i+1 < len(spec)) || commented && spec[i+1] != comment {
			t.Fatalf("comment %q (%v) is not the --comment of the rulespec %q (from %q)", comment, commented, spec, line)
		}
		// The rulespec is what a Delete gets: the same rule printed with
		// every word quoted parses back to it.
		quoted := "-A"
		for _, w := range append([]string{chain}, spec...) {
			quoted += " '" + strings.ReplaceAll(w, "'", `'\''`) + "'"
		}
		againChain, again, ok := parseRule(quoted)
		againComment, _ := ruleComment(again)
		if !ok || againChain != chain || !slices.Equal(again, spec) || againComment != comment {
			t.Fatalf("%q parsed to %q, %q, %q; quoted again (%q) to %q, %q, %q", line, chain, spec, comment, quoted, againChain, again, againComment)
		}
	})
}
