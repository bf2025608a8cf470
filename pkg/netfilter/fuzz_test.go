package netfilter

import (
	"fmt"
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

// FuzzParseRule: any `iptables -S` line either yields a rulespec and a
// comment or is skipped; never a panic.
func FuzzParseRule(f *testing.F) {
	f.Add(`-A POSTROUTING -s 10.0.0.2/32 -m comment --comment "name: \"n\" id: \"c\"" -j CNI-abc`)
	f.Add(`-A POSTROUTING -j MASQUERADE`)
	f.Add(`-N CNI-abc`)
	f.Add(`-A POSTROUTING --comment`)
	f.Fuzz(func(t *testing.T, line string) {
		spec, _, ok := parseRule(line, "POSTROUTING")
		if ok && len(spec) == 0 {
			t.Fatalf("empty rulespec from %q", line)
		}
	})
}
