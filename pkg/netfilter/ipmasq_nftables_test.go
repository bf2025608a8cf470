package netfilter

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ip"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"sigs.k8s.io/knftables"
)

// TestNFTablesIPMasqAgainstBridge: rules made by bridge's own nftables
// ipMasq code (plugins/pkg/ip) in a throw-away namespace are released
// exactly as bridge's teardown and GC release them; what is left is listed
// through knftables, as bridge reads it.
func TestNFTablesIPMasqAgainstBridge(t *testing.T) {
	if os.Geteuid() != 0 {
		skipOrFail(t, "nftables in a namespace needs root")
	}
	if _, err := exec.LookPath("nft"); err != nil {
		skipOrFail(t, "bridge's nftables ipMasq needs the nft binary (.ci/run installs nftables)")
	}
	netns, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netns.Close(); _ = testutils.UnmountNS(netns) })

	backend := "nftables"
	// 64-hex container IDs and a long network name make bridge cut the
	// comment at nftables' 128 bytes.
	network := "nomad-network-with-a-rather-long-name"
	cid := func(i int) string { return fmt.Sprintf("%064x", i) }
	setup := func(i int, network string) {
		t.Helper()
		ipn := &net.IPNet{IP: net.IPv4(10, 9, 0, byte(i)), Mask: net.CIDRMask(24, 32)}
		ip6 := &net.IPNet{IP: net.ParseIP(fmt.Sprintf("fd00::%d", i)), Mask: net.CIDRMask(64, 128)}
		if err := ip.SetupIPMasqForNetworks(&backend, []*net.IPNet{ipn, ip6}, network, "eth0", cid(i)); err != nil {
			t.Fatalf("bridge's ipMasq setup: %v", err)
		}
	}
	left := func() []string {
		t.Helper()
		nft, err := knftables.New(knftables.InetFamily, ipMasqTable)
		if err != nil {
			t.Fatal(err)
		}
		rules, err := nft.ListRules(context.Background(), ipMasqChain)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, r := range rules {
			if r.Comment != nil {
				out = append(out, *r.Comment)
			}
		}
		slices.Sort(out)
		return out
	}
	want := func(attachments ...[2]any) []string {
		var out []string
		for _, a := range attachments {
			c := nftComment(a[0].(string), "eth0", cid(a[1].(int)))
			out = append(out, c, c) // one rule per address family
		}
		slices.Sort(out)
		return out
	}

	err = netns.Do(func(ns.NetNS) error {
		// Nothing made yet: no table, nothing to do, no error.
		if err := nftablesTeardown(network, "eth0", cid(1)); err != nil {
			t.Errorf("teardown without bridge's table: %v", err)
		}
		if err := nftablesRelease(network, []types.GCAttachment{{ContainerID: cid(1), IfName: "eth0"}}); err != nil {
			t.Errorf("release without bridge's table: %v", err)
		}
		for i := 1; i <= 4; i++ {
			setup(i, network)
		}
		setup(5, "other")
		for _, c := range left() {
			if len(c) > nftCommentMax || !strings.HasPrefix(c, nftNetworkHash(network)) && !strings.HasPrefix(c, nftNetworkHash("other")) {
				t.Fatalf("unexpected comment from bridge: %q", c)
			}
		}
		if got, all := left(), want([2]any{network, 1}, [2]any{network, 2}, [2]any{network, 3}, [2]any{network, 4}, [2]any{"other", 5}); !slices.Equal(got, all) {
			t.Fatalf("bridge's comments are not the ones computed here:\n got %q\nwant %q", got, all)
		}

		if err := nftablesTeardown(network, "eth0", cid(1)); err != nil {
			t.Fatalf("teardown: %v", err)
		}
		if got, w := left(), want([2]any{network, 2}, [2]any{network, 3}, [2]any{network, 4}, [2]any{"other", 5}); !slices.Equal(got, w) {
			t.Fatalf("after teardown of 1:\n got %q\nwant %q", got, w)
		}
		if err := nftablesTeardown(network, "eth0", cid(1)); err != nil {
			t.Errorf("second teardown: %v", err)
		}

		// A sweep's batch: 2 and 4 are stale; 5 has the same ID on
		// another network and stays.
		stale := []types.GCAttachment{{ContainerID: cid(2), IfName: "eth0"}, {ContainerID: cid(4), IfName: "eth0"}, {ContainerID: cid(5), IfName: "eth0"}}
		if err := nftablesRelease(network, stale); err != nil {
			t.Fatalf("release: %v", err)
		}
		if got, w := left(), want([2]any{network, 3}, [2]any{"other", 5}); !slices.Equal(got, w) {
			t.Fatalf("after releasing 2 and 4:\n got %q\nwant %q", got, w)
		}

		// Orphans: the sweep knows 3 and 7; 6 is nobody's. Another
		// network's rule (5) is never asked about.
		setup(6, network)
		setup(7, network)
		known := map[string]bool{NFTInstance(network, "eth0", cid(3)): true, NFTInstance(network, "eth0", cid(7)): true}
		var asked []string
		keep := func(instance string) bool { asked = append(asked, instance); return known[instance] }
		for _, dryRun := range []bool{true, false} {
			asked = nil
			orphans, err := nftablesOrphans(network, keep, dryRun)
			if err != nil {
				t.Fatalf("orphans (dry run %v): %v", dryRun, err)
			}
			if len(orphans) != 1 || orphans[0].Instance != NFTInstance(network, "eth0", cid(6)) || orphans[0].IfName != "eth0" ||
				!orphans[0].Cut || !strings.HasPrefix(cid(6), orphans[0].ContainerID) || len(orphans[0].ContainerID) < 16 {
				t.Fatalf("orphans (dry run %v) = %+v, want the one of %s (its ID cut)", dryRun, orphans, cid(6))
			}
			if len(asked) != 3 {
				t.Errorf("keep asked about %d attachments, want 3 (one each, not per rule): %q", len(asked), asked)
			}
			w := want([2]any{network, 3}, [2]any{network, 6}, [2]any{network, 7}, [2]any{"other", 5})
			if !dryRun {
				w = want([2]any{network, 3}, [2]any{network, 7}, [2]any{"other", 5})
			}
			if got := left(); !slices.Equal(got, w) {
				t.Fatalf("after the orphans' release (dry run %v):\n got %q\nwant %q", dryRun, got, w)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// nftComment is the whole comment bridge gives one attachment's rules
// (commentForInstance upstream).
func nftComment(network, ifname, containerID string) string {
	comment := fmt.Sprintf("%s, net: %s, if: %s, id: %s",
		nftInstanceHash(network, ifname, containerID),
		strings.ReplaceAll(network, `"`, ``),
		strings.ReplaceAll(ifname, `"`, ``),
		strings.ReplaceAll(containerID, `"`, ``),
	)
	if len(comment) > nftCommentMax {
		comment = comment[:nftCommentMax]
	}
	return comment
}

// skipOrFail skips outside CI and fails in CI, where root and every tool
// are there (test/internal/testhost.SkipOrFail, which pkg/ cannot import).
func skipOrFail(t *testing.T, why string) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf("%s (CI is set: this test must run)", why)
	}
	t.Skip(why)
}

// A comment whole names its attachment exactly; one bridge cut names the
// beginning of its container ID, and says so; another network's is not
// read.
func TestParseNFTComment(t *testing.T) {
	cid := "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	o, ok := parseNFTComment("nomad", nftComment("nomad", "eth0", cid))
	if !ok || o.Cut || o.ContainerID != cid || o.IfName != "eth0" || o.Instance != NFTInstance("nomad", "eth0", cid) {
		t.Errorf("whole comment: %+v, %v", o, ok)
	}
	long := "a-network-name-long-enough-for-bridge-to-cut-the-comment"
	o, ok = parseNFTComment(long, nftComment(long, "eth1", cid))
	if !ok || !o.Cut || o.IfName != "eth1" || !strings.HasPrefix(cid, o.ContainerID) || o.Instance != NFTInstance(long, "eth1", cid) {
		t.Errorf("cut comment: %+v, %v", o, ok)
	}
	if _, ok := parseNFTComment("other", nftComment("nomad", "eth0", cid)); ok {
		t.Error("another network's comment was read as this one's")
	}
}
