package e2e

import (
	"os"
	"path/filepath"
	"testing"
)

// A CHECK's sweep of a network the plugin owns skips the listing of its
// NAT rules for orphans while the ruleset is the one in which an earlier
// listing found none (.nat-checked: the boot, the namespace's cookie and
// nftables' generation, on an iptables-nft host). Any rule made since
// changes it: orphan rules planted by hand are still released by the next
// CHECK.
func TestCheckFindsOrphansMadeAfterAnUnchangedRuleset(t *testing.T) {
	e := newEnv(t)
	e.requirePlugin(t)
	conf := e.reclaimConf(t, "nomad.conflist")
	entryOfType(t, conf, pluginType)["checkSweepInterval"] = "0s"
	e.writeConflist(t, conf)
	a := e.addNetns(t, "a")
	e.mustCNI(t, "add", a, "")
	marker := filepath.Join(e.recordDir(), ".nat-checked")
	e.mustCNI(t, "check", a, "")
	first, err := os.ReadFile(marker)
	if err != nil {
		t.Fatalf("a CHECK's sweep that found no orphan noted nothing: %v", err)
	}
	e.mustCNI(t, "check", a, "")
	if again, _ := os.ReadFile(marker); string(again) != string(first) {
		t.Errorf("the ruleset changed between two CHECKs that made no rule: %s, then %s", first, again)
	}

	orphan := "orphan-" + e.id
	e.orphanMasq(t, orphan)
	e.mustCNI(t, "check", a, "")
	if run("iptables", "-w", "-t", "nat", "-S", e.masqChain(orphan)) == nil {
		t.Fatalf("the CHECK after rules were planted kept the orphan chain %s", e.masqChain(orphan))
	}
	if run("iptables", "-w", "-t", "nat", "-S", e.masqChain(a.cid)) != nil {
		t.Fatalf("the CHECK released the live container's chain")
	}
}
