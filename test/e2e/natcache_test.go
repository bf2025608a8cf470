package e2e

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/testhost"
)

// TestSweepTakesProbedOwnersFromTheNATCacheUntilTheRulesetChanges: on an
// iptables-nft host a sweep of an owned network keeps the owners its probe
// read in .nat-cache, under the ruleset's generation, and the next sweep
// takes them from there while nothing was committed. Shown with a cache
// edited to leave out a container whose record and lease were removed by
// hand (its rules are then orphans): while the ruleset is unchanged, the
// sweep goes by the cache and leaves the rules; after any commit it probes
// again and releases them.
func TestSweepTakesProbedOwnersFromTheNATCacheUntilTheRulesetChanges(t *testing.T) {
	e := newEnv(t)
	e.requirePlugin(t)
	if path, err := exec.LookPath("iptables"); err != nil {
		testhost.SkipOrFail(t, "iptables not in PATH")
	} else if real, err := filepath.EvalSymlinks(path); err != nil || filepath.Base(real) != "xtables-nft-multi" {
		testhost.SkipOrFail(t, fmt.Sprintf("iptables here is %s, not iptables-nft: the sweep lists instead of probing", real))
	}
	e.writeConflist(t, e.confFor(t, "nomad.conflist"))
	a, b := e.addNetns(t, "a"), e.addNetns(t, "b")
	pa, _ := parseResult(t, e.mustCNI(t, "add", a, "")).addrIn(t, e.subnet4)
	pb, _ := parseResult(t, e.mustCNI(t, "add", b, "")).addrIn(t, e.subnet4)

	if lines := e.releaseLines(e.operatorSweep(t)); len(lines) != 0 {
		t.Fatalf("a sweep of two live containers released: %q", lines)
	}
	cache := filepath.Join(e.recordDir(), ".nat-cache")
	kept, err := os.ReadFile(cache)
	if err != nil {
		t.Fatalf("no NAT cache after a sweep of an owned network: %v", err)
	}
	for _, cid := range []string{a.cid, b.cid} {
		if !bytes.Contains(kept, []byte(strconv.Quote(cid)+"\n")) {
			t.Fatalf("the NAT cache does not name %s:\n%s", cid, kept)
		}
	}
	// The same key, without A; A's record and lease removed by hand.
	edited := bytes.ReplaceAll(kept, []byte(strconv.Quote(a.cid)+"\n"), nil)
	if err := os.WriteFile(cache, edited, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{e.recordPath(a.cid), filepath.Join(e.leaseDir(), pa.Addr().String())} {
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
	}

	if out := e.operatorSweep(t); strings.Contains(out, a.cid) {
		t.Fatalf("the sweep did not go by the NAT cache of the unchanged ruleset:\n%s", out)
	}
	e.assertNAT(t, a.cid, natWant{Masq: []netip.Addr{pa.Addr()}})

	// Any commit changes the generation: a chain made and deleted.
	chain := fmt.Sprintf("NBC-GEN-%08x", rand.Uint32())
	for _, args := range [][]string{{"-N", chain}, {"-X", chain}} {
		if err := run("iptables", append([]string{"-w", "-t", "filter"}, args...)...); err != nil {
			t.Fatal(err)
		}
	}
	out := e.operatorSweep(t)
	if want := fmt.Sprintf("released %s %s/- (no lease): NAT rules without a lease or record", e.netName, a.cid); !strings.Contains(out, want) {
		t.Fatalf("after a commit the sweep must probe again and release A's orphan rules (%q):\n%s", want, out)
	}
	e.assertNAT(t, a.cid, natWant{})
	e.assertNAT(t, b.cid, natWant{Masq: []netip.Addr{pb.Addr()}})

	e.mustCNI(t, "del", a, "")
	e.mustCNI(t, "del", b, "")
	e.assertNetworkEmpty(t, e.leaseDir())
}
