package e2e

import (
	"encoding/json"
	"errors"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/invoke"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/cniexec"
)

// leasesJSON runs `leases --json` on the test's network and decodes it.
func (e *testEnv) leasesJSON(t *testing.T) leasesDoc {
	t.Helper()
	stdout, stderr, err := e.operator(t, "leases", "--data-dir", e.dataDir, "--network", e.netName, "--json")
	if err != nil {
		t.Fatalf("leases --json: %v\n%s", err, stderr)
	}
	var doc leasesDoc
	if err := json.Unmarshal([]byte(stdout), &doc); err != nil {
		t.Fatalf("leases --json is not JSON: %v\n%s", err, stdout)
	}
	return doc
}

// leasesDoc is the documented schema of `leases --json`.
type leasesDoc struct {
	DataDir string `json:"dataDir"`
	Leases  []struct {
		Network     string `json:"network"`
		IP          string `json:"ip"`
		ContainerID string `json:"containerID"`
		IfName      string `json:"ifName"`
		Netns       string `json:"netns"`
		State       string `json:"state"`
		Reason      string `json:"reason"`
	} `json:"leases"`
}

// operator runs the plugin's operator CLI: args, no CNI variables.
func (e *testEnv) operator(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	r := cniexec.Run(t, e.binary(pluginType), invoke.Args{}, cniexec.Opts{Argv: args})
	// The bare exit error: the callers show stdout and stderr themselves.
	return r.Stdout, r.Stderr, errors.Unwrap(r.Err)
}

// TestOperatorLeasesAndGC: after the stale-namespace scenario, `leases`
// marks exactly the dead container stale with the right reason, `gc
// --dry-run` changes no file and no rule, `gc` releases exactly that
// container, and a second `gc` is a no-op.
func TestOperatorLeasesAndGC(t *testing.T) {
	e := newEnv(t)
	e.requirePlugin(t)
	e.writeConflist(t, e.confFor(t, "nomad.conflist"))
	live, dead := e.addNetns(t, "live"), e.addNetns(t, "dead")
	liveAddr, _ := parseResult(t, e.mustCNI(t, "add", live, "")).addrIn(t, e.subnet4)
	deadAddr, _ := parseResult(t, e.mustCNI(t, "add", dead, "")).addrIn(t, e.subnet4)
	e.destroyNetns(t, dead)

	doc := e.leasesJSON(t)
	states := map[string]string{}
	for _, l := range doc.Leases {
		states[l.ContainerID] = l.State + " " + l.Reason
		if l.Network != e.netName || l.IfName != ifName {
			t.Errorf("row %+v: wrong network or ifname", l)
		}
	}
	if len(doc.Leases) != 2 || !strings.HasPrefix(states[live.cid], "live") || states[dead.cid] != "stale namespace "+dead.path+" is gone" {
		t.Fatalf("leases rows: %v", states)
	}
	table, _, err := e.operator(t, "leases", "--data-dir", e.dataDir)
	if err != nil || !strings.Contains(table, "NETWORK") || !strings.Contains(table, deadAddr.Addr().String()) || !strings.Contains(table, "stale (namespace "+dead.path+" is gone)") {
		t.Errorf("leases table (err %v):\n%s", err, table)
	}

	filesBefore, natBefore := treeState(t, e.dataDir), e.networkNAT(t)
	dry, stderr, err := e.operator(t, "gc", "--data-dir", e.dataDir, "--dry-run")
	if err != nil {
		t.Fatalf("gc --dry-run: %v\n%s", err, stderr)
	}
	if treeState(t, e.dataDir) != filesBefore || e.networkNAT(t) != natBefore {
		t.Fatal("gc --dry-run changed files or iptables")
	}
	if !strings.Contains(dry, "would release "+e.netName+" "+dead.cid) || strings.Contains(dry, live.cid) {
		t.Errorf("gc --dry-run output:\n%s", dry)
	}

	out, stderr, err := e.operator(t, "gc", "--data-dir", e.dataDir, "--network", e.netName)
	if err != nil {
		t.Fatalf("gc: %v\n%s", err, stderr)
	}
	if !strings.Contains(out, "released "+e.netName+" "+dead.cid) || !strings.Contains(out, "namespace "+dead.path+" is gone") {
		t.Errorf("gc output:\n%s", out)
	}
	leases := readLeases(t, e.leaseDir())
	if len(leases) != 1 || leases[deadAddr.Addr()] != "" {
		t.Errorf("leases after gc: %v", leases)
	}
	e.assertNAT(t, dead.cid, natWant{})
	e.assertNAT(t, live.cid, natWant{Masq: []netip.Addr{liveAddr.Addr()}})

	// A second gc releases nothing and changes nothing but the network's
	// last-sweep marker, which it writes as a CHECK does (the record
	// directory's mtime moves with it).
	recordDir := filepath.Join(e.dataDir, ".nomad-bridge-cni", e.netName)
	lastSweep := filepath.Join(recordDir, ".last-sweep")
	butLastSweep := func() string {
		var kept []string
		for _, line := range strings.Split(treeState(t, e.dataDir), "\n") {
			if !strings.HasPrefix(line, lastSweep+" ") && !strings.HasPrefix(line, recordDir+" ") {
				kept = append(kept, line)
			}
		}
		return strings.Join(kept, "\n")
	}
	filesBefore, natBefore, stampBefore := butLastSweep(), e.networkNAT(t), readFile(t, lastSweep)
	again, _, err := e.operator(t, "gc", "--data-dir", e.dataDir)
	if err != nil || !strings.Contains(again, "nothing to release") {
		t.Errorf("second gc (err %v):\n%s", err, again)
	}
	if butLastSweep() != filesBefore || e.networkNAT(t) != natBefore {
		t.Error("second gc changed something")
	}
	if readFile(t, lastSweep) == stampBefore {
		t.Errorf("second gc did not remember its sweep in %s", lastSweep)
	}
	e.mustCNI(t, "del", live, "")
}

func TestOperatorErrors(t *testing.T) {
	e := newEnv(t)
	e.requirePlugin(t)
	for _, tc := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"leases", "--bogus"}, 2, "unknown flag: --bogus"},
		{[]string{"gc", "--network"}, 2, "flag needs an argument"},
		{[]string{"leases", "--data-dir", filepath.Join(e.dataDir, "missing")}, 1, "no such file or directory"},
		{[]string{"gc", "--data-dir", e.dataDir, "--network", "../x"}, 2, "invalid characters"},
		{[]string{"frob"}, 2, `unknown command "frob"`},
	} {
		_, stderr, err := e.operator(t, tc.args...)
		exitErr, ok := err.(*exec.ExitError)
		if !ok || exitErr.ExitCode() != tc.code || !strings.Contains(stderr, tc.msg) {
			t.Errorf("%v: err %v, stderr %q; want exit %d and %q", tc.args, err, stderr, tc.code, tc.msg)
		}
	}
}

// TestOperatorRefusesAMistypedDataDir: regression test. `leases --data-dir
// /etc` created a lock in some 70 directories under /etc, `gc` created
// /etc/lock, /usr/lock, /root/lock..., and both printed the first 64 bytes
// of every file they read, /etc/shadow included. Now the real /etc and /
// are refused as not a data dir, no file is created anywhere under them,
// and no file's content is printed.
func TestOperatorRefusesAMistypedDataDir(t *testing.T) {
	e := newEnv(t)
	e.requirePlugin(t)
	locks := func() []string {
		var found []string
		for _, pattern := range []string{"/lock", "/*/lock", "/etc/*/lock", "/etc/*/*/lock"} {
			m, _ := filepath.Glob(pattern)
			found = append(found, m...)
		}
		return found
	}
	before := locks()
	shadow, _ := os.ReadFile("/etc/shadow")
	firstLine, _, _ := strings.Cut(string(shadow), "\n")
	for _, dir := range []string{"/etc", "/"} {
		for _, args := range [][]string{
			{"leases", "--data-dir", dir},
			{"leases", "--json", "--data-dir", dir},
			{"gc", "--dry-run", "--data-dir", dir},
			{"gc", "--data-dir", dir},
			{"metrics", "--data-dir", dir},
		} {
			stdout, stderr, err := e.operator(t, args...)
			if err == nil || !strings.Contains(stderr, "not a data dir") {
				t.Errorf("%v: %v\nstdout: %s\nstderr: %s\nwant it refused as not a data dir", args, err, stdout, stderr)
			}
			if firstLine != "" && strings.Contains(stdout+stderr, firstLine[:min(len(firstLine), 12)]) {
				t.Errorf("%v printed /etc/shadow", args)
			}
		}
	}
	if after := locks(); !slices.Equal(before, after) {
		t.Errorf("lock files under / and /etc before: %v, after: %v", before, after)
	}
}

// TestGCOfAWrongDataDirKeepsTheLiveRulesOfACustomOne: regression test. `gc
// --data-dir <a wrong dir> --orphan-rules`, on a directory that looks like
// host-local's, named the NAT rules of a live container for release when the
// real data dir was a custom one (only the default data dir was checked
// before calling rules orphans). The data dirs the host's conflists name
// are checked too: the live container's rules are neither named nor
// removed, and a container that holds nothing anywhere still is.
func TestGCOfAWrongDataDirKeepsTheLiveRulesOfACustomOne(t *testing.T) {
	e := newEnv(t)
	e.requirePlugin(t)
	e.writeConflist(t, e.confFor(t, "nomad.conflist"))
	live := e.addNetns(t, "live")
	liveAddr, _ := parseResult(t, e.mustCNI(t, "add", live, "")).addrIn(t, e.subnet4)
	orphanNS := e.addNetns(t, "orphan")
	orphan, _ := parseResult(t, e.mustCNI(t, "add", orphanNS, "")).addrIn(t, e.subnet4)
	orphanCID := orphanNS.cid
	// The orphan keeps its rules but loses its lease and record, as if its
	// data dir had been lost.
	if err := os.Remove(filepath.Join(e.leaseDir(), orphan.Addr().String())); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(e.recordPath(orphanCID)); err != nil {
		t.Fatal(err)
	}

	wrong := t.TempDir()
	if err := os.MkdirAll(filepath.Join(wrong, e.netName), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(wrong, e.netName, "lock"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, dryRun := range []bool{true, false} {
		args := []string{"gc", "--data-dir", wrong, "--network", e.netName, "--orphan-rules", "--conf-dir", e.confDir}
		if dryRun {
			args = append(args, "--dry-run")
		}
		stdout, stderr, err := e.operator(t, args...)
		if err != nil {
			t.Fatalf("%v: %v\n%s%s", args, err, stdout, stderr)
		}
		if strings.Contains(stdout, live.cid) {
			t.Errorf("%v names the live container %s:\n%s", args, live.cid, stdout)
		}
		if !strings.Contains(stdout, orphanCID) {
			t.Errorf("%v does not name the orphan %s:\n%s", args, orphanCID, stdout)
		}
	}
	e.assertNAT(t, live.cid, natWant{Masq: []netip.Addr{liveAddr.Addr()}})
	e.assertNAT(t, orphanCID, natWant{})
}

// TestGCOfADirectoryThePluginNeverServedCreatesNothing: gc, with and
// without --runtime nomad (a stand-in nomad CLI that lists nothing), of a
// bare bridge's lease directory finds nothing to release and writes
// nothing there (regression: it created .nomad-bridge-cni/<network> for its
// markers).
func TestGCOfADirectoryThePluginNeverServedCreatesNothing(t *testing.T) {
	e := newEnv(t)
	e.requirePlugin(t)
	bare := filepath.Join(t.TempDir(), "networks")
	leases := filepath.Join(bare, e.netName)
	if err := os.MkdirAll(leases, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{"lock": "", "last_reserved_ip.0": "10.88.0.5", "10.88.0.5": "c1\r\neth0"} {
		if err := os.WriteFile(filepath.Join(leases, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	fake := t.TempDir()
	script := "#!/bin/sh\ncase \"$3\" in\n/v1/agent/self) echo '{\"stats\": {\"client\": {\"node_id\": \"n1\"}}}' ;;\n/v1/node/n1/allocations) echo '[]' ;;\n*) exit 1 ;;\nesac\n"
	if err := os.WriteFile(filepath.Join(fake, "nomad"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	before := treeState(t, bare)
	for _, args := range [][]string{
		{"gc", "--data-dir", bare},
		{"gc", "--runtime", "nomad", "--data-dir", bare},
	} {
		r := cniexec.Run(t, e.binary(pluginType), invoke.Args{}, cniexec.Opts{Argv: args, Env: []string{"PATH=" + fake + ":" + os.Getenv("PATH")}})
		if r.Err != nil || r.Stdout != "nothing to release\n" {
			t.Errorf("%v: %v\nstdout: %s\nstderr: %s", args, r.Err, r.Stdout, r.Stderr)
		}
		if after := treeState(t, bare); after != before {
			t.Errorf("%v changed %s:\n--- before\n%s--- after\n%s", args, bare, before, after)
		}
	}
}
