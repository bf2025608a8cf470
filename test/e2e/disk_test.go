package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/cniexec"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/hostcmd"
)

// Hostile state on disk. The plugin must refuse data
// directories someone else could have planted (a symlink, another owner,
// not a directory) before touching anything; skip and report damaged lease
// files and records without following a symlink or releasing anything
// live; and create its files 0600 and its directories 0700.

// foreignUID owns the directories the tests plant as "someone else's".
const foreignUID = 12345

// TestUnsafeDirs plants each of the four directories the plugin writes in
// (dataDir itself, host-local's network directory, the record directory,
// the network's record directory) as a symlink to an empty directory
// elsewhere, as a directory owned by another uid, and as a regular file.
// Every verb must refuse with code 5 ("unsafe data directory", naming the
// directory and why; STATUS with 50) and change nothing: nothing is
// created through the symlink, the planted entries stay as they are.
func TestUnsafeDirs(t *testing.T) {
	type where struct {
		name string
		path func(e *testEnv, dataDir string) string
	}
	places := []where{
		{"dataDir", func(e *testEnv, d string) string { return d }},
		{"network-dir", func(e *testEnv, d string) string { return filepath.Join(d, e.netName) }},
		{"records-dir", func(e *testEnv, d string) string { return filepath.Join(d, recordDirName) }},
		{"records-network-dir", func(e *testEnv, d string) string { return filepath.Join(d, recordDirName, e.netName) }},
	}
	kinds := []struct {
		name  string
		plant func(t *testing.T, path, target string)
		why   string
	}{
		{"symlink", func(t *testing.T, path, target string) {
			if err := os.Symlink(target, path); err != nil {
				t.Fatalf("symlink: %v", err)
			}
		}, "symlink"},
		{"foreign-owner", func(t *testing.T, path, _ string) {
			if err := os.Mkdir(path, 0o700); err != nil {
				t.Fatalf("mkdir: %v", err)
			}
			if err := os.Chown(path, foreignUID, foreignUID); err != nil {
				t.Fatalf("chown: %v", err)
			}
		}, fmt.Sprintf("owned by uid %d", foreignUID)},
		{"regular-file", func(t *testing.T, path, _ string) {
			if err := os.WriteFile(path, []byte("not a directory\n"), 0o600); err != nil {
				t.Fatalf("write: %v", err)
			}
		}, "not a directory"},
	}
	for _, place := range places {
		for _, kind := range kinds {
			t.Run(place.name+"/"+kind.name, func(t *testing.T) {
				e := newEnv(t)
				e.requirePlugin(t)
				ns := e.addNetns(t, "a")
				// dataDir is a directory inside the test's tmpfs, so that
				// it can be planted too; the symlink target is elsewhere
				// on the same tmpfs, empty, and must stay empty.
				dataDir := filepath.Join(e.dataDir, "data")
				target := filepath.Join(e.dataDir, "elsewhere")
				if err := os.Mkdir(target, 0o700); err != nil {
					t.Fatalf("mkdir: %v", err)
				}
				planted := place.path(e, dataDir)
				if err := os.MkdirAll(filepath.Dir(planted), 0o700); err != nil {
					t.Fatalf("mkdir: %v", err)
				}
				kind.plant(t, planted, target)

				conf := e.reclaimConf(t, "minimal.conflist")
				conf["cniVersion"] = "1.1.0"
				entryOfType(t, conf, pluginType)["dataDir"] = dataDir
				stdin := entryConfig(t, conf, pluginType)

				scope := e.hostileScope("", e.dataDir, e.persistDir)
				before := takeHostState(t, scope)
				for _, verb := range []string{"ADD", "CHECK", "DEL", "GC", "STATUS"} {
					r := cniexec.Run(t, e.binary(pluginType), e.cniArgs(verb, ns), cniexec.Opts{Stdin: stdin})
					if verb == "STATUS" {
						ce := assertCNIFailure(t, r, 50)
						if !strings.Contains(ce.Msg+" "+ce.Details, kind.why) {
							t.Errorf("STATUS: error does not say %q: msg %q details %q", kind.why, ce.Msg, ce.Details)
						}
						continue
					}
					ce := assertCNIFailure(t, r, codeIOFailure)
					if ce.Msg != "unsafe data directory" {
						t.Errorf("%s: msg %q, want %q", verb, ce.Msg, "unsafe data directory")
					}
					if !strings.Contains(ce.Details, planted) || !strings.Contains(ce.Details, kind.why) {
						t.Errorf("%s: details %q do not name %s and say %q", verb, ce.Details, planted, kind.why)
					}
					t.Logf("%s: code %d: %s: %s", verb, ce.code(), ce.Msg, ce.Details)
				}
				before.assertUnchanged(t, takeHostState(t, scope))
				assertEmptyDir(t, target)
				if linkExists(e.bridge) {
					t.Errorf("bridge %s was created", e.bridge)
				}
				if linkExistsIn(ns, ifName) {
					t.Errorf("%s was created in %s", ifName, ns.name)
				}
			})
		}
	}
}

// TestDataDirBelowSymlink: only the dataDir's last component must be a
// real directory. /var/run, the default's parent, is a symlink to /run on
// most distributions, so a symlink higher up must keep working.
func TestDataDirBelowSymlink(t *testing.T) {
	e := newEnv(t)
	e.requirePlugin(t)
	link := filepath.Join(t.TempDir(), "run")
	if err := os.Symlink(e.dataDir, link); err != nil {
		t.Fatalf("symlink: %v", err)
	}
	conf := e.reclaimConf(t, "minimal.conflist")
	entryOfType(t, conf, pluginType)["dataDir"] = filepath.Join(link, "cni")
	e.writeConflist(t, conf)
	ns := e.addNetns(t, "a")
	p, _ := parseResult(t, e.mustCNI(t, "add", ns, "")).addrIn(t, e.subnet4)
	assertLease(t, filepath.Join(e.dataDir, "cni", e.netName), p.Addr(), ns.cid)
	e.mustCNI(t, "check", ns, "")
	e.mustCNI(t, "del", ns, "")
	assertLeases(t, filepath.Join(e.dataDir, "cni", e.netName), nil)
}

// damagedEntry is one damaged entry a test put in the plugin's directories.
type damagedEntry struct {
	path string
	what string
}

// TestDamagedStateSkipped fills host-local's network directory and the
// record directory with damage next to a live container and a dead one
// (its namespace deleted without DEL): garbage, zero bytes, directories
// and symlinks (to files outside, one holding the dead container's lease
// key) where leases and records should be, wrong names, foreign versions
// and networks, oversized files, and temp files of a dead and of a live
// writer. A CHECK of the live container, then the operator's gc and
// leases, must succeed, release exactly the dead container, say on stderr
// that the damaged entries were skipped, remove only the dead writer's
// temp file, and leave every damaged entry, every symlink target and the
// live container's lease and record exactly as they were. Since symlinks
// among the leases make CHECK refuse to run host-local (which would read
// and write through them), the CHECK is refused and changes nothing, and
// the sweep is the operator's gc; empty leases no record names are writes
// whose host-local died, and go.
func TestDamagedStateSkipped(t *testing.T) {
	e := newEnv(t)
	e.requirePlugin(t)
	conf := e.reclaimConf(t, "minimal.conflist")
	e.writeConflist(t, conf)
	live, dead := e.addNetns(t, "live"), e.addNetns(t, "dead")
	pl, gw := parseResult(t, e.mustCNI(t, "add", live, "")).addrIn(t, e.subnet4)
	pd, _ := parseResult(t, e.mustCNI(t, "add", dead, "")).addrIn(t, e.subnet4)
	e.assertRecord(t, dead, pd.Addr())
	e.mustKillNetns(t, dead)

	L, R := e.leaseDir(), e.recordDir()
	outside := t.TempDir()
	victimLease := writeTestFile(t, filepath.Join(outside, "victim-lease"), "victim\r\neth0", 0o644)
	victimDeadKey := writeTestFile(t, filepath.Join(outside, "victim-dead-key"), leaseContent(dead.cid), 0o644)
	_, liveRecordRaw := e.readRecord(t, live.cid)
	ghostRecord := func(cid, network string, version int) string {
		return string(mustJSON(t, map[string]any{
			"version": version, "network": network, "containerID": cid, "ifName": ifName,
			"netns": "/var/run/netns/nbc-e2e-" + e.id + "-gone", "netnsID": map[string]any{"dev": 4, "ino": 4026531000},
			"bootID": bootID(t), "created": time.Now().Add(-time.Hour).UTC(), "state": "complete",
			"ips": []string{e.hostAddr(200).String() + "/24"},
		}))
	}
	victimRecord := writeTestFile(t, filepath.Join(outside, "victim-record"), ghostRecord("ghost4", e.netName, 1), 0o644)
	beforeBoot := bootTime(t).Add(-time.Hour)
	myPID, gonePID := os.Getpid(), deadPID(t)

	var plants []damagedEntry
	add := func(path, what string) { plants = append(plants, damagedEntry{path, what}) }
	file := func(dir, name, content string, mtime time.Time, what string) {
		p := writeTestFile(t, filepath.Join(dir, name), content, 0o600)
		if !mtime.IsZero() {
			if err := os.Chtimes(p, mtime, mtime); err != nil {
				t.Fatalf("chtimes: %v", err)
			}
		}
		add(p, what)
	}
	dir := func(dir, name string, inside map[string]string, what string) {
		p := filepath.Join(dir, name)
		if err := os.Mkdir(p, 0o700); err != nil {
			t.Fatalf("mkdir: %v", err)
		}
		for n, c := range inside {
			writeTestFile(t, filepath.Join(p, n), c, 0o600)
		}
		add(p, what)
	}
	link := func(dir, name, target, what string) {
		p := filepath.Join(dir, name)
		if err := os.Symlink(target, p); err != nil {
			t.Fatalf("symlink: %v", err)
		}
		add(p, what)
	}
	ip := func(n int) string { return e.hostAddr(n).String() }

	// host-local's network directory.
	file(L, ip(150), "\x00\x01garbage\x00", time.Time{}, "lease with binary garbage")
	// Empty leases no record names are writes whose host-local died: the
	// sweep releases them, they are not kept like the rest.
	emptyLeases := []string{writeTestFile(t, filepath.Join(L, ip(151)), "", 0o600), writeTestFile(t, filepath.Join(L, ip(152)), "", 0o600)}
	if err := os.Chtimes(emptyLeases[1], beforeBoot, beforeBoot); err != nil {
		t.Fatal(err)
	}
	file(L, ip(153), "\r\n\r\n\x00", beforeBoot, "garbage lease from before the boot")
	file(L, ip(154), leaseContent(dead.cid)+"\x00", time.Time{}, "near-copy of the dead container's lease (NUL)")
	file(L, ip(155), "ghost1\r\neth0", time.Time{}, "lease of a container whose record is garbage")
	dir(L, ip(156), map[string]string{"x": leaseContent(dead.cid)}, "directory where a lease should be")
	link(L, ip(157), victimLease, "symlink lease to a file outside")
	link(L, ip(158), victimDeadKey, "symlink lease to a file outside holding the dead container's key")
	link(L, ip(159), filepath.Join(outside, "nonexistent"), "dangling symlink lease")
	// (Files whose names are not addresses: TestSweepSparesForeignAndPlantedFiles.)
	// The record directory.
	file(R, "ghost1@"+ifName, "{\x00garbage", time.Time{}, "record with garbage")
	file(R, "ghost2@"+ifName, "", time.Time{}, "zero-byte record")
	dir(R, "ghost3@"+ifName, map[string]string{"x": ghostRecord("ghost3", e.netName, 1)}, "directory where a record should be")
	link(R, "ghost4@"+ifName, victimRecord, "symlink record to a file outside (a stale-looking record)")
	file(R, "copy-of-live@"+ifName, string(liveRecordRaw), time.Time{}, "live container's record under another name")
	file(R, "no-at-sign", string(liveRecordRaw), time.Time{}, "live container's record under a name without @")
	file(R, "ghost5@"+ifName, ghostRecord("ghost5", e.netName, 2), time.Time{}, "record of format version 2")
	file(R, "ghost6@"+ifName, ghostRecord("ghost6", "another-network", 1), time.Time{}, "record of another network")
	file(R, "ghost7@"+ifName, `{"version":1,"pad":"`+strings.Repeat("x", 70<<10)+`"}`, time.Time{}, "70 KiB record")
	file(R, fmt.Sprintf(".tmp-%d-1", myPID), "{", time.Time{}, "temp file of a live writer")
	file(R, ".tmp-notapid", "{", time.Time{}, "temp-like file without a pid")
	deadTemp := writeTestFile(t, filepath.Join(R, fmt.Sprintf(".tmp-%d-1", gonePID)), "{", 0o600)

	watched := []string{victimLease, victimDeadKey, victimRecord, filepath.Join(L, pl.Addr().String()), e.recordPath(live.cid)}
	for _, p := range plants {
		watched = append(watched, p.path)
		if fi, err := os.Lstat(p.path); err == nil && fi.IsDir() {
			entries, _ := os.ReadDir(p.path)
			for _, ent := range entries {
				watched = append(watched, filepath.Join(p.path, ent.Name()))
			}
		}
	}
	snapshot := func() map[string]string {
		m := map[string]string{}
		for _, p := range watched {
			m[p] = entryState(t, p)
		}
		return m
	}
	before := snapshot()
	assertSame := func(step string) {
		t.Helper()
		after := snapshot()
		for _, p := range watched {
			if before[p] != after[p] {
				t.Errorf("after %s: %s changed:\n  before: %s\n  after:  %s", step, describePlanted(plants, p), before[p], after[p])
			}
		}
	}

	// CHECK refuses to run host-local beside the planted symlinks, which
	// it would read and write through, and changes nothing.
	if _, stderr, err := e.cnitool("check", live, ""); err == nil || !strings.Contains(err.Error(), "is a symlink") {
		t.Fatalf("CHECK beside planted symlinks: %v, want a refusal naming one\nstderr: %s", err, stderr)
	}
	assertSame("the refused CHECK")
	// The operator's gc sweeps the network.
	stdout, stderr, err := e.operator(t, "gc", "--data-dir", e.dataDir, "--network", e.netName)
	if err != nil {
		t.Fatalf("gc with damaged state around: %v\nstdout: %s\nstderr: %s", err, stdout, stderr)
	}
	t.Logf("gc:\n%s%s", stdout, stderr)
	if strings.Contains(stdout+stderr, "panic:") || strings.Contains(stdout+stderr, "goroutine ") {
		t.Fatalf("panic during the sweep:\n%s%s", stdout, stderr)
	}
	var releases []string
	for line := range strings.Lines(stdout) {
		if strings.HasPrefix(line, "released ") {
			releases = append(releases, line)
		}
	}
	if len(releases) != 3 || !strings.Contains(strings.Join(releases, ""), dead.cid+"/"+ifName+" "+pd.Addr().String()) {
		t.Errorf("released %q, want the dead container and the two empty leases", releases)
	}
	for _, p := range emptyLeases {
		if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("empty lease %s kept (lstat: %v)", p, err)
		}
	}
	if _, err := os.Lstat(filepath.Join(L, pd.Addr().String())); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the dead container's lease %s is still there (lstat: %v)", pd.Addr(), err)
	}
	e.assertNoRecord(t, dead.cid)
	e.assertNAT(t, dead.cid, natWant{})
	if _, err := os.Lstat(deadTemp); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("temp file of dead writer %d not removed by the sweep (lstat: %v)", gonePID, err)
	}
	assertSame("gc")
	e.assertNAT(t, live.cid, natWant{Masq: []netip.Addr{pl.Addr()}})
	ping(t, live, gw)

	// Every damaged entry is reported, except the valid lease of ghost1,
	// the live writer's temp file and the dot file, which are not damage.
	reported := len(plants) - 3
	if n := strings.Count(stdout, "skipped: "); n != reported {
		t.Errorf("gc reported %d skipped entries, want %d (one per damaged entry)", n, reported)
	}

	// The operator's commands read the same damage.
	for _, args := range [][]string{
		{"gc", "--data-dir", e.dataDir, "--network", e.netName},
		{"gc", "--data-dir", e.dataDir},
		{"leases", "--data-dir", e.dataDir},
		{"gc", "--data-dir", e.dataDir, "--json"},
	} {
		cmdline := strings.Join(args, " ")
		stdout, stderr, err := e.operator(t, args...)
		t.Logf("%s:\n%s%s", cmdline, stdout, stderr)
		if err != nil {
			t.Errorf("%s: %v\nstdout: %s\nstderr: %s", cmdline, err, stdout, stderr)
		}
		if strings.Contains(stdout+stderr, "panic:") {
			t.Fatalf("%s panicked:\n%s%s", cmdline, stdout, stderr)
		}
		switch {
		case slices.Contains(args, "--json"):
			var out struct {
				Released []any    `json:"released"`
				Problems []string `json:"problems"`
			}
			if err := json.Unmarshal([]byte(stdout), &out); err != nil {
				t.Fatalf("%s: %v", cmdline, err)
			}
			if len(out.Released) != 0 || len(out.Problems) != reported {
				t.Errorf("%s: released %v and %d problems, want nothing released and %d problems", cmdline, out.Released, len(out.Problems), reported)
			}
		case args[0] == "gc":
			if n := strings.Count(stdout, "skipped: "); n != reported || !strings.Contains(stdout, "nothing to release") {
				t.Errorf("%s: %d skipped lines, want %d, and nothing released", cmdline, n, reported)
			}
		}
		assertSame(cmdline)
	}

	// DEL of the live container touches only its own lease and record.
	e.mustCNI(t, "del", live, "")
	delete(before, filepath.Join(L, pl.Addr().String()))
	delete(before, e.recordPath(live.cid))
	watched = withoutPaths(watched, filepath.Join(L, pl.Addr().String()), e.recordPath(live.cid))
	assertSame("DEL of the live container")
	if _, err := os.Lstat(filepath.Join(L, pl.Addr().String())); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the live container's lease is still there after its DEL (lstat: %v)", err)
	}
	e.assertNoRecord(t, live.cid)
	e.assertNetworkNATEmpty(t)
}

// TestSweepSparesForeignAndPlantedFiles: regression test. When a sweep
// released a stale attachment it deleted more than that
// attachment's lease, in host-local's network directory:
//
//   - the fast path (one disk.Store.GC pass with every other lease as the
//     keep list) removes every regular file whose name is not "lock" or
//     "last_reserved_ip.*" and whose content is not kept: host-local's GC
//     treats any such name as a reservation, while the sweep only reads
//     (and so only keeps) files named like an address. A file named
//     "operator-notes" disappears;
//   - the per-key fallback (taken when a lease file cannot be read in
//     full, e.g. one over 4 KiB) is disk.Store.ReleaseByKey, which walks the
//     directory recursively and reads through symlinks: a lease-named
//     symlink to a file outside that holds the stale key is deleted, and so
//     is a file inside a directory planted where a lease should be.
//
// Neither is "skipped and reported"; the contract asks for damaged entries
// and wrong names to stay where they are.
func TestSweepSparesForeignAndPlantedFiles(t *testing.T) {
	for _, tc := range []struct {
		name  string
		plant func(t *testing.T, e *testEnv, deadKey, outside string) []string
	}{
		{"fast-path-wrong-names", func(t *testing.T, e *testEnv, deadKey, _ string) []string {
			return []string{
				writeTestFile(t, filepath.Join(e.leaseDir(), "operator-notes"), "do not delete\n", 0o600),
				writeTestFile(t, filepath.Join(e.leaseDir(), "not-an-ip"), deadKey, 0o600),
			}
		}},
		{"fallback-symlink-and-directory", func(t *testing.T, e *testEnv, deadKey, outside string) []string {
			writeTestFile(t, filepath.Join(e.leaseDir(), e.hostAddr(160).String()), strings.Repeat("x", 5000), 0o600)
			victim := writeTestFile(t, filepath.Join(outside, "victim"), deadKey, 0o644)
			link := filepath.Join(e.leaseDir(), e.hostAddr(158).String())
			if err := os.Symlink(victim, link); err != nil {
				t.Fatalf("symlink: %v", err)
			}
			nested := writeTestFile(t, filepath.Join(e.leaseDir(), e.hostAddr(156).String(), "x"), deadKey, 0o600)
			return []string{victim, link, nested}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.requirePlugin(t)
			e.writeConflist(t, e.reclaimConf(t, "minimal.conflist"))
			live, dead := e.addNetns(t, "live"), e.addNetns(t, "dead")
			e.mustCNI(t, "add", live, "")
			pd, _ := parseResult(t, e.mustCNI(t, "add", dead, "")).addrIn(t, e.subnet4)
			e.mustKillNetns(t, dead)
			watched := tc.plant(t, e, leaseContent(dead.cid), t.TempDir())
			before := map[string]string{}
			for _, p := range watched {
				before[p] = entryState(t, p)
			}
			// The operator's gc sweeps: CHECK refuses to run host-local
			// beside a planted symlink.
			stdout, stderr, err := e.operator(t, "gc", "--data-dir", e.dataDir, "--network", e.netName)
			if err != nil {
				t.Fatalf("gc: %v\nstdout: %s\nstderr: %s", err, stdout, stderr)
			}
			t.Logf("gc:\n%s%s", stdout, stderr)
			if !strings.Contains(stdout, "released "+e.netName+" "+dead.cid+"/"+ifName+" "+pd.Addr().String()) {
				t.Errorf("gc did not release %s", dead.cid)
			}
			for _, p := range watched {
				if after := entryState(t, p); after != before[p] {
					t.Errorf("the sweep that released %s changed %s:\n  before: %s\n  after:  %s", dead.cid, p, before[p], after)
				}
			}
			e.mustCNI(t, "del", live, "")
		})
	}
}

// describePlanted names a watched path for an error message.
func describePlanted(plants []damagedEntry, p string) string {
	for _, pl := range plants {
		if pl.path == p {
			return pl.what + " " + p
		}
	}
	return p
}

func withoutPaths(s []string, drop ...string) []string {
	var out []string
	for _, v := range s {
		keep := true
		for _, d := range drop {
			if v == d {
				keep = false
			}
		}
		if keep {
			out = append(out, v)
		}
	}
	return out
}

// writeTestFile writes content to p with mode (exactly: not masked by umask).
func writeTestFile(t *testing.T, p, content string, mode os.FileMode) string {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		t.Fatalf("mkdir: %v", err)
	}
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatalf("write %s: %v", p, err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatalf("chmod %s: %v", p, err)
	}
	return p
}

// TestModes runs ADD, CHECK and DEL through cnitool with umask 000, so that
// only the modes the plugin asks for count: the dataDir it creates (and
// its missing parent), the record directories, the records and the
// migration marker must be 0700 and 0600. host-local's own network
// directory and files keep host-local's modes and are not checked.
func TestModes(t *testing.T) {
	e := newEnv(t)
	e.requirePlugin(t)
	conf := e.reclaimConf(t, "minimal.conflist")
	dataDir := filepath.Join(e.dataDir, "created", "by-plugin")
	entryOfType(t, conf, pluginType)["dataDir"] = dataDir
	e.writeConflist(t, conf)
	ns := e.addNetns(t, "a")

	cnitool := func(verb string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
		defer cancel()
		cmd := exec.CommandContext(ctx, "sh", "-c", `umask 000 && exec "$0" "$@"`, filepath.Join(e.bin, "cnitool"), verb, e.netName, ns.path)
		cmd.Env = hostcmd.CNIEnv("CNI_PATH="+e.bin, "NETCONFPATH="+e.confDir, "CNI_IFNAME="+ifName)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("cnitool %s with umask 000: %v\n%s", verb, err, out)
		}
		return string(out)
	}
	cnitool("add")
	records := filepath.Join(dataDir, recordDirName)
	want := map[string]os.FileMode{
		filepath.Join(e.dataDir, "created"): 0o700 | fs.ModeDir,
		dataDir:                             0o700 | fs.ModeDir,
		records:                             0o700 | fs.ModeDir,
		filepath.Join(records, e.netName):   0o700 | fs.ModeDir,
		filepath.Join(records, e.netName, ns.cid+"@"+ifName): 0o600,
		// (No .migrated: there was no legacy directory to migrate.)
		filepath.Join(records, e.netName, ".owned"): 0o600,
	}
	check := func(step string) {
		t.Helper()
		for p, mode := range want {
			fi, err := os.Lstat(p)
			if err != nil {
				t.Errorf("after %s: %v", step, err)
				continue
			}
			if fi.Mode() != mode {
				t.Errorf("after %s: %s has mode %v, want %v", step, p, fi.Mode(), mode)
			}
		}
		// Anything else the plugin created in its own directory.
		_ = filepath.WalkDir(records, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			fi, err := d.Info()
			if err != nil {
				return err
			}
			switch {
			case fi.IsDir() && fi.Mode().Perm() != 0o700:
				t.Errorf("after %s: directory %s has mode %v, want 0700", step, p, fi.Mode().Perm())
			case fi.Mode().IsRegular() && fi.Mode().Perm() != 0o600:
				t.Errorf("after %s: file %s has mode %v, want 0600", step, p, fi.Mode().Perm())
			case !fi.IsDir() && !fi.Mode().IsRegular():
				t.Errorf("after %s: %s is a %v", step, p, fi.Mode().Type())
			}
			return nil
		})
	}
	check("ADD")
	cnitool("check")
	check("CHECK")
	cnitool("del")
	delete(want, filepath.Join(records, e.netName, ns.cid+"@"+ifName))
	check("DEL")
	e.assertRecordsExactlyIn(t, filepath.Join(records, e.netName))
}

// assertRecordsExactlyIn checks that a record directory holds nothing but
// markers.
func (e *testEnv) assertRecordsExactlyIn(t *testing.T, dir string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("read %s: %v", dir, err)
	}
	for _, ent := range entries {
		if !slices.Contains(recordMarkers, ent.Name()) {
			t.Errorf("%s left in %s after DEL", ent.Name(), dir)
		}
	}
}

// TestOperatorRefusesSymlinkedRecordsDir: regression test. The CNI verbs refuse a symlinked record directory
// (TestUnsafeDirs), but `nomad-bridge-cni gc --data-dir D` does not check
// D's directories: with D/.nomad-bridge-cni a symlink to a directory
// elsewhere it lists the networks in the target, sweeps them, deletes a
// stale-looking record there (outside D) and creates D/<net>/lock. The
// operator's commands must refuse (or at least never act through) the same
// planted directories as the plugin.
func TestOperatorRefusesSymlinkedRecordsDir(t *testing.T) {
	e := newEnv(t)
	e.requirePlugin(t)
	dataDir := filepath.Join(e.dataDir, "data")
	target := filepath.Join(e.dataDir, "elsewhere")
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		t.Fatalf("mkdir: %v", err)
	}
	if err := os.Symlink(target, filepath.Join(dataDir, recordDirName)); err != nil {
		t.Fatalf("symlink: %v", err)
	}
	// A record that any sweep would judge stale: its namespace is gone.
	rec := mustJSON(t, map[string]any{
		"version": 1, "network": e.netName, "containerID": "ghost", "ifName": ifName,
		"netns": "/var/run/netns/nbc-e2e-" + e.id + "-gone", "netnsID": map[string]any{"dev": 4, "ino": 4026531000},
		"bootID": bootID(t), "created": time.Now().UTC(), "state": "complete",
	})
	victim := writeTestFile(t, filepath.Join(target, e.netName, "ghost@"+ifName), string(rec), 0o600)
	scope := stateScope{trees: []string{e.dataDir}}
	before := takeHostState(t, scope)
	for _, args := range [][]string{
		{"leases", "--data-dir", dataDir},
		{"gc", "--data-dir", dataDir, "--dry-run"},
		{"gc", "--data-dir", dataDir},
		{"gc", "--data-dir", dataDir, "--network", e.netName},
	} {
		stdout, stderr, err := e.operator(t, args...)
		t.Logf("%s: err %v\nstdout: %s\nstderr: %s", strings.Join(args, " "), err, stdout, stderr)
	}
	if _, err := os.Lstat(victim); err != nil {
		t.Errorf("the operator's gc deleted %s, outside its data dir, through the symlink %s (lstat: %v)", victim, filepath.Join(dataDir, recordDirName), err)
	}
	before.assertUnchanged(t, takeHostState(t, scope))
}
