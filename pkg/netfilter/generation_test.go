package netfilter

import (
	"os/exec"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/testhost"
)

// The ruleset's state names the namespace and changes with every commit
// there, iptables-nft's included; another namespace has another state.
func TestStateChangesWithEveryCommit(t *testing.T) {
	if missing := testhost.MissingTools("iptables"); len(missing) > 0 {
		testhost.SkipOrFail(t, "the ruleset state needs "+missing[0])
	}
	host := New().State()
	if host == (RulesetState{}) {
		testhost.SkipOrFail(t, "iptables here is not iptables-nft: no ruleset state")
	}
	netns := nftNamespace(t)
	err := netns.Do(func(ns.NetNS) error {
		before := New().State()
		if out, err := exec.Command("iptables", "-t", "nat", "-N", "NBC-STATE-TEST").CombinedOutput(); err != nil {
			t.Fatalf("iptables -N: %v: %s", err, out)
		}
		after := New().State()
		switch {
		case before == (RulesetState{}) || after == (RulesetState{}):
			t.Errorf("no state in the namespace: %+v, %+v", before, after)
		case before.Cookie == host.Cookie:
			t.Errorf("the namespace has the host's cookie %d", host.Cookie)
		case after.Cookie != before.Cookie || after.Gen == before.Gen:
			t.Errorf("a commit left the state %+v as %+v", before, after)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
