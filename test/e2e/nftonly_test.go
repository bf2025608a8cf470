package e2e

import (
	"bytes"
	"context"
	"net/netip"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/invoke"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/cniexec"
)

// hideIPTablesScript runs its arguments in a mount namespace of their own
// in which every iptables and ip6tables command (all links to the two
// xtables binaries) is /dev/null: not executable, so not found in PATH and
// not runnable by path. It refuses to run the command if one is still
// found.
const hideIPTablesScript = `set -e
for f in /usr/sbin/xtables-nft-multi /usr/sbin/xtables-legacy-multi /usr/bin/xtables-nft-multi /usr/bin/xtables-legacy-multi; do
	if [ -e "$f" ]; then mount --bind /dev/null "$f"; fi
done
for c in iptables ip6tables iptables-nft iptables-legacy; do
	if command -v "$c" >/dev/null 2>&1 && [ -x "$(command -v "$c")" ]; then echo "hideIPTables: $c still runs" >&2; exit 99; fi
done
exec "$@"`

// withoutIPTables is unshare's argv to run argv in a mount namespace
// without iptables.
func withoutIPTables(argv ...string) []string {
	return append([]string{"--mount", "--propagation", "private", "sh", "-c", hideIPTablesScript, "sh"}, argv...)
}

// nftOnly runs cnitool VERB on ns in a namespace without iptables.
func (e *testEnv) nftOnly(t *testing.T, verb string, ns netns, capArgs string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	var env []string
	if capArgs != "" {
		env = append(env, "CAP_ARGS="+capArgs)
	}
	cnitool := e.cnitoolCmd(ctx, verb, ns, env...)
	cmd := exec.CommandContext(ctx, "unshare", withoutIPTables(cnitool.Args...)...)
	cmd.Env = cnitool.Env
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("cnitool %s %s without iptables: %v\nstdout: %s\nstderr: %s", verb, ns.name, err, out.String(), errb.String())
	}
	return out.String()
}

// nftOnlyOperator runs the operator CLI without iptables.
func (e *testEnv) nftOnlyOperator(t *testing.T, args ...string) (string, error) {
	t.Helper()
	r := cniexec.Run(t, "unshare", invoke.Args{}, cniexec.Opts{Argv: withoutIPTables(append([]string{e.binary(pluginType)}, args...)...)})
	return r.Stdout + r.Stderr, r.Err
}

// portmapNFTRules lists the comments of portmap's nftables rules (tables
// ip and ip6 cni_hostport), one entry per rule.
func portmapNFTRules(t *testing.T) []string {
	t.Helper()
	var comments []string
	re := regexp.MustCompile(`comment "([^"]*)"`)
	for _, family := range []string{"ip", "ip6"} {
		out, err := exec.Command("nft", "list", "table", family, "cni_hostport").CombinedOutput()
		if err != nil {
			if strings.Contains(string(out), "No such file or directory") {
				continue
			}
			t.Fatalf("nft list table %s cni_hostport: %v: %s", family, err, out)
		}
		for _, m := range re.FindAllStringSubmatch(string(out), -1) {
			comments = append(comments, m[1])
		}
	}
	return comments
}

func countOf(list []string, s string) int {
	n := 0
	for _, x := range list {
		if x == s {
			n++
		}
	}
	return n
}

// TestNFTablesOnlyHost: on a host without iptables and ip6tables (hidden
// in a mount namespace), with bridge's nftables ipMasq backend and
// portmap's nftables backend (containerd's dual-stack conflist), every
// verb and command works: ADD, CHECK, a lost namespace released by gc
// (bridge's and portmap's nftables rules of it included), GC, DEL, leases,
// doctor and metrics; nothing of the network is left in either table.
func TestNFTablesOnlyHost(t *testing.T) {
	e := newEnv(t)
	e.requirePlugin(t)
	for _, tool := range []string{"nft", "unshare"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not found (.ci/run installs nftables and util-linux)", tool)
		}
	}
	conf := e.reclaimConf(t, "10-containerd-net.conflist")
	entryOfType(t, conf, pluginType)["ipMasqBackend"] = "nftables"
	entryOfType(t, conf, "portmap")["backend"] = "nftables"
	e.writeConflist(t, conf)
	live, dead := e.addNetns(t, "live"), e.addNetns(t, "dead")
	livePort, deadPort := randomHostPort(), randomHostPort()
	for deadPort == livePort {
		deadPort = randomHostPort()
	}
	e.nftOnly(t, "add", live, portMappings(livePort))
	e.nftOnly(t, "add", dead, portMappings(deadPort))
	e.nftOnly(t, "check", live, portMappings(livePort))
	if owners := e.nftMasqOwners(t, live.cid, dead.cid); owners[live.cid] != 2 || owners[dead.cid] != 2 {
		t.Fatalf("bridge's nftables ipMasq rules by owner: %v, want 2 each (IPv4, IPv6)", owners)
	}
	pm := portmapNFTRules(t)
	if countOf(pm, live.cid) == 0 || countOf(pm, dead.cid) == 0 {
		t.Fatalf("portmap's nftables rules: %q, want some of each container", pm)
	}
	// Nothing went to iptables (hidden from the plugins, not from here).
	e.assertNAT(t, live.cid, natWant{})
	e.assertNAT(t, dead.cid, natWant{})

	e.destroyNetns(t, dead)
	out, err := e.nftOnlyOperator(t, "leases", "--data-dir", e.dataDir, "--network", e.netName)
	if err != nil || !strings.Contains(out, dead.cid) || !strings.Contains(out, "stale") {
		t.Fatalf("leases without iptables: %v\n%s", err, out)
	}
	if out, err := e.nftOnlyOperator(t, "gc", "--data-dir", e.dataDir); err != nil || !strings.Contains(out, "released") {
		t.Fatalf("gc without iptables: %v\n%s", err, out)
	}
	if owners := e.nftMasqOwners(t, live.cid, dead.cid); owners[live.cid] != 2 || owners[dead.cid] != 0 {
		t.Errorf("after gc, bridge's nftables ipMasq rules by owner: %v, want live's 2 only", owners)
	}
	pm = portmapNFTRules(t)
	if countOf(pm, dead.cid) != 0 || countOf(pm, live.cid) == 0 {
		t.Errorf("after gc, portmap's nftables rules: %q, want the live container's only", pm)
	}
	if out, err := e.nftOnlyOperator(t, "metrics", "--data-dir", e.dataDir); err != nil || !strings.Contains(out, `nomad_bridge_cni_attachments{network="`+e.netName+`",state="live"} 1`) {
		t.Errorf("metrics without iptables: %v\n%s", err, out)
	}
	if out, err := e.nftOnlyOperator(t, "doctor", "--conf-dir", e.confDir, "--cni-path", e.bin); !strings.Contains(out, `network "`+e.netName+`" uses nomad-bridge-cni`) {
		t.Errorf("doctor without iptables: %v\n%s", err, out)
	}

	e.nftOnly(t, "gc", live, "")
	e.nftOnly(t, "del", live, portMappings(livePort))
	assertLeases(t, e.leaseDir(), nil)
	if owners := e.nftMasqOwners(t, live.cid, dead.cid); len(owners) != 0 {
		t.Errorf("bridge's nftables ipMasq rules left: %v", owners)
	}
	if pm := portmapNFTRules(t); countOf(pm, live.cid)+countOf(pm, dead.cid) != 0 {
		t.Errorf("portmap's nftables rules left: %q", pm)
	}
}

// legacyOnlyScript runs its arguments in a mount namespace of their own in
// which iptables and ip6tables (and their -save and -restore) are
// iptables-legacy, found first in PATH, and iptables-nft cannot run.
const legacyOnlyScript = `set -e
bin=$(mktemp -d)
for c in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do
	ln -s "/usr/sbin/${c%%-*}-legacy${c#${c%%-*}}" "$bin/$c"
done
for f in /usr/sbin/xtables-nft-multi /usr/bin/xtables-nft-multi; do
	if [ -e "$f" ]; then mount --bind /dev/null "$f"; fi
done
export PATH="$bin:$PATH"
case "$(iptables --version)" in *legacy*) ;; *) echo "legacyOnly: iptables is not legacy" >&2; exit 99;; esac
exec "$@"`

// TestIPTablesLegacyOnlyHost is the reverse of TestNFTablesOnlyHost: a
// host whose iptables is iptables-legacy and which has no iptables-nft
// (the plugins run in a network namespace of the test's, standing for the
// host, so the legacy tables live and die there). The sweep lists the
// legacy tables (no netlink probe: iptables is not iptables-nft), and gc
// releases a lost container's ipMasq, portmap and firewall rules; DEL of
// the live one leaves nothing.
func TestIPTablesLegacyOnlyHost(t *testing.T) {
	e := newEnv(t)
	e.requirePlugin(t)
	if _, err := exec.LookPath("iptables-legacy"); err != nil {
		t.Fatalf("iptables-legacy not found (.ci/run installs iptables)")
	}
	host := e.addNetns(t, "host")
	e.writeConflist(t, e.reclaimConf(t, "nomad.conflist"))
	inHost := func(args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
		defer cancel()
		cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", host.name, "unshare", "--mount", "--propagation", "private", "sh", "-c", legacyOnlyScript, "sh"}, args...)...)
		cmd.Env = e.cnitoolCmd(ctx, "add", host).Env
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		return out.String() + errb.String(), err
	}
	cni := func(verb string, ns netns, port int) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
		defer cancel()
		args := []string{"netns", "exec", host.name, "unshare", "--mount", "--propagation", "private", "sh", "-c", legacyOnlyScript, "sh",
			"env", "CAP_ARGS=" + portMappings(port), filepath.Join(e.bin, "cnitool"), verb, e.netName, ns.path}
		cmd := exec.CommandContext(ctx, "ip", args...)
		cmd.Env = e.cnitoolCmd(ctx, verb, ns).Env
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			t.Fatalf("cnitool %s %s with iptables-legacy: %v\n%s%s", verb, ns.name, err, out.String(), errb.String())
		}
		return out.String()
	}
	forwardRules := func(addr netip.Addr) int {
		t.Helper()
		out, err := exec.Command("ip", "netns", "exec", host.name, "iptables-legacy", "-w", "-t", "filter", "-S", "CNI-FORWARD").CombinedOutput()
		if err != nil {
			t.Fatalf("iptables-legacy -S CNI-FORWARD: %v: %s", err, out)
		}
		return strings.Count(string(out), " "+addr.String()+"/32 ")
	}
	legacyRulesOf := func(cid string) int {
		t.Helper()
		n := 0
		for _, cmd := range []string{"iptables-legacy", "ip6tables-legacy"} {
			for _, table := range []string{"nat", "filter"} {
				out, err := exec.Command("ip", "netns", "exec", host.name, cmd, "-w", "-t", table, "-S").CombinedOutput()
				if err != nil {
					t.Fatalf("%s -t %s -S: %v: %s", cmd, table, err, out)
				}
				n += strings.Count(string(out), `id: \"`+cid+`\"`)
			}
		}
		return n
	}
	live, dead := e.addNetns(t, "live"), e.addNetns(t, "dead")
	livePort, deadPort := randomHostPort(), randomHostPort()
	for deadPort == livePort {
		deadPort = randomHostPort()
	}
	cni("add", live, livePort)
	deadAddr, _ := parseResult(t, cni("add", dead, deadPort)).addrIn(t, e.subnet4)
	if n := forwardRules(deadAddr.Addr()); n != 2 {
		t.Fatalf("%d legacy firewall rules of %s, want 2", n, deadAddr)
	}
	if legacyRulesOf(live.cid) == 0 || legacyRulesOf(dead.cid) == 0 {
		t.Fatalf("no legacy rules of the containers: live %d, dead %d", legacyRulesOf(live.cid), legacyRulesOf(dead.cid))
	}
	e.assertNAT(t, dead.cid, natWant{}) // nothing in the test's own (nft) tables

	if err := run("ip", "netns", "delete", dead.name); err != nil {
		t.Fatal(err)
	}
	if out, err := inHost(e.binary(pluginType), "gc", "--data-dir", e.dataDir); err != nil || !strings.Contains(out, "released") {
		t.Fatalf("gc with iptables-legacy: %v\n%s", err, out)
	}
	if n := legacyRulesOf(dead.cid); n != 0 {
		t.Errorf("gc left %d legacy rules of the dead container", n)
	}
	if n := forwardRules(deadAddr.Addr()); n != 0 {
		t.Errorf("gc left %d legacy firewall rules of %s", n, deadAddr)
	}
	if legacyRulesOf(live.cid) == 0 {
		t.Error("gc took the live container's legacy rules")
	}
	cni("del", live, livePort)
	if n := legacyRulesOf(live.cid); n != 0 {
		t.Errorf("DEL left %d legacy rules", n)
	}
	assertLeases(t, e.leaseDir(), nil)
}
