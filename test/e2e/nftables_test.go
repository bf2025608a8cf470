package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/utils"
)

// bridge's nftables ipMasq backend (ipMasqBackend "nftables") keeps one
// rule per attachment and address in one chain, commented with a hash of
// the network and of "<ifname>:<containerID>".
const (
	nftMasqTable = "cni_plugins_masquerade"
	nftMasqChain = "masq_checks"
)

// nftMasqRule is one rule of bridge's nftables ipMasq chain.
type nftMasqRule struct {
	comment string
	handle  string
}

var nftRuleLine = regexp.MustCompile(`comment "([^"]*)".*# handle (\d+)`)

// nftMasqRules lists the rules of bridge's nftables ipMasq chain that
// belong to the test's network; none when the chain does not exist.
func (e *testEnv) nftMasqRules(t *testing.T) []nftMasqRule {
	t.Helper()
	rules, err := e.listNFTMasqRules()
	if err != nil {
		t.Fatal(err)
	}
	return rules
}

// listNFTMasqRules is nftMasqRules for cleanup: it returns an error
// instead of failing the test.
func (e *testEnv) listNFTMasqRules() ([]nftMasqRule, error) {
	out, err := exec.Command("nft", "-a", "list", "chain", "inet", nftMasqTable, nftMasqChain).CombinedOutput()
	if err != nil {
		if strings.Contains(string(out), "No such file or directory") {
			return nil, nil
		}
		return nil, fmt.Errorf("nft list chain inet %s %s: %v: %s", nftMasqTable, nftMasqChain, err, out)
	}
	prefix := utils.MustFormatHashWithPrefix(16, "", e.netName) + "-"
	var rules []nftMasqRule
	for _, line := range strings.Split(string(out), "\n") {
		m := nftRuleLine.FindStringSubmatch(line)
		if m != nil && strings.HasPrefix(m[1], prefix) {
			rules = append(rules, nftMasqRule{comment: m[1], handle: m[2]})
		}
	}
	return rules, nil
}

// nftMasqOwners counts the test network's nftables ipMasq rules by the
// container (of cids) whose attachment (ifName) they are; "?" counts the
// others.
func (e *testEnv) nftMasqOwners(t *testing.T, cids ...string) map[string]int {
	t.Helper()
	owners := map[string]int{}
	for _, r := range e.nftMasqRules(t) {
		owner := "?"
		for _, cid := range cids {
			if strings.HasPrefix(r.comment, utils.MustFormatHashWithPrefix(16, "", e.netName)+"-"+utils.MustFormatHashWithPrefix(16, "", ifName+":"+cid)) {
				owner = cid
			}
		}
		owners[owner]++
	}
	return owners
}

// deleteNFTMasqRules removes what is left of the test network's rules in
// bridge's nftables ipMasq chain (cleanup; nothing to do without nft).
func (e *testEnv) deleteNFTMasqRules() []error {
	if _, err := exec.LookPath("nft"); err != nil {
		return nil
	}
	rules, err := e.listNFTMasqRules()
	if err != nil {
		return []error{err}
	}
	var errs []error
	for _, r := range rules {
		if out, err := exec.Command("nft", "delete", "rule", "inet", nftMasqTable, nftMasqChain, "handle", r.handle).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("nft delete rule handle %s: %v: %s", r.handle, err, out))
		}
	}
	return errs
}

// TestNFTablesOrphanRules: with bridge's nftables ipMasq backend, the
// rules of a container whose namespace was lost go with its lease and
// record at the next gc, and so do the rules of one whose files are
// already gone (what a release killed by an earlier version, which removed
// the files first, left): no file names them, and the network is the
// plugin's. A live container keeps its rules, and its DEL leaves nothing.
func TestNFTablesOrphanRules(t *testing.T) {
	requireTool(t, "nft")
	e := newEnv(t)
	e.requirePlugin(t)
	conf := e.reclaimConf(t, "nomad.conflist")
	entryOfType(t, conf, pluginType)["ipMasqBackend"] = "nftables"
	e.writeConflist(t, conf)
	live, lost, orphan := e.addNetns(t, "live"), e.addNetns(t, "lost"), e.addNetns(t, "orphan")
	for _, ns := range []netns{live, lost, orphan} {
		e.mustCNI(t, "add", ns, "")
	}
	before := e.nftMasqOwners(t, live.cid, lost.cid, orphan.cid)
	if before[live.cid] == 0 || before[lost.cid] != before[live.cid] || before[orphan.cid] != before[live.cid] || before["?"] != 0 {
		t.Fatalf("bridge's nftables ipMasq rules after three ADDs, by container: %v", before)
	}
	if st := e.readNAT(t, live.cid); len(st["iptables"].masqJumps) > 0 {
		t.Fatalf("ipMasqBackend nftables, but bridge made iptables rules: %+v", st)
	}

	e.mustKillNetns(t, lost)
	if err := os.Remove(e.recordPath(orphan.cid)); err != nil {
		t.Fatal(err)
	}
	for addr, content := range readLeases(t, e.leaseDir()) {
		if content == leaseContent(orphan.cid) {
			if err := os.Remove(e.leaseDir() + "/" + addr.String()); err != nil {
				t.Fatal(err)
			}
		}
	}
	e.mustKillNetns(t, orphan)

	// gc --dry-run and leases name the nftables rules as they name
	// iptables ones: those of the lost container's release, and the
	// orphan's; and change nothing.
	dry, stderr, err := e.operator(t, "gc", "--dry-run", "--data-dir", e.dataDir, "--network", e.netName)
	if err != nil {
		t.Fatalf("gc --dry-run: %v\n%s", err, stderr)
	}
	for _, cid := range []string{lost.cid, orphan.cid} {
		if !regexp.MustCompile(`(?m)^would release \S+ ` + regexp.QuoteMeta(cid) + `/eth0 .*would remove .*nftables ipMasq rules [0-9a-f]{16}-[0-9a-f]{16} ` + fmt.Sprintf(`\(%d\)`, before[cid])).MatchString(dry) {
			t.Errorf("gc --dry-run does not name %s's %d nftables rules:\n%s", cid, before[cid], dry)
		}
	}
	table, stderr, err := e.operator(t, "leases", "--data-dir", e.dataDir, "--network", e.netName)
	if err != nil || !regexp.MustCompile(`(?m)^\S+\s+-\s+`+regexp.QuoteMeta(orphan.cid)+`\s.*orphan-rules.*nftables ipMasq rules`).MatchString(table) {
		t.Errorf("leases does not list the orphan's nftables rules (%v):\n%s%s", err, table, stderr)
	}
	if now := e.nftMasqOwners(t, live.cid, lost.cid, orphan.cid); now[lost.cid] != before[lost.cid] || now[orphan.cid] != before[orphan.cid] {
		t.Errorf("gc --dry-run or leases removed rules: %v, before %v", now, before)
	}

	out := e.operatorSweep(t)
	t.Logf("gc: %s", out)
	if !regexp.MustCompile(`(?m)^released \S+ ` + regexp.QuoteMeta(lost.cid) + `/eth0 .*removed .*nftables ipMasq rules .*record`).MatchString(out) {
		t.Errorf("gc does not say it removed the lost container's nftables rules before its record:\n%s", out)
	}
	after := e.nftMasqOwners(t, live.cid, lost.cid, orphan.cid)
	if after[lost.cid] != 0 || after[orphan.cid] != 0 || after[live.cid] != before[live.cid] || after["?"] != 0 {
		t.Errorf("after gc, by container: %v; want only the live one's %d", after, before[live.cid])
	}
	if !strings.Contains(out, "without a lease or record") {
		t.Errorf("gc did not report the orphan rules: %s", out)
	}
	e.assertNoTrace(t, lost.cid)
	e.assertNoTrace(t, orphan.cid)
	e.mustCNI(t, "check", live, "")

	e.mustCNI(t, "del", live, "")
	if left := e.nftMasqRules(t); len(left) != 0 {
		t.Errorf("nftables ipMasq rules left after the DEL: %v", left)
	}
	e.assertNetworkEmpty(t, e.leaseDir())
}
