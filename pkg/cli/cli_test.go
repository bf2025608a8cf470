package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mattn/go-shellwords"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/netfilter"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/reclaim"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/sysinfo"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/fakenat"
)

const about = "CNI nomad-bridge-cni plugin v0.0.0-test"

func run4(t *testing.T, _ map[string]string, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := Run(args, &stdout, &stderr, about)
	return code, stdout.String(), stderr.String()
}

func TestCLI(t *testing.T) {
	cases := []struct {
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{args: []string{"--version"}, code: 0, stdout: "CNI nomad-bridge-cni plugin v"},
		{args: []string{"--help"}, code: 0, stdout: "Usage:"},
		{args: []string{"-h"}, code: 0, stdout: "--version"},
		{args: []string{"--bogus"}, code: 2, stderr: "unknown flag: --bogus"},
		{args: []string{"frobnicate"}, code: 2, stderr: `unknown command "frobnicate"`},
		// Was "stat : no such file or directory".
		{args: []string{"gc", "--data-dir="}, code: 1, stderr: "no data dir given (--data-dir is empty)"},
		{args: []string{"leases", "--data-dir", ""}, code: 1, stderr: "no data dir given"},
	}
	for _, tc := range cases {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, stdout, stderr := run4(t, nil, tc.args...)
			if code != tc.code {
				t.Errorf("exit = %d, want %d (stderr %q)", code, tc.code, stderr)
			}
			if tc.stdout != "" && !strings.Contains(stdout, tc.stdout) {
				t.Errorf("stdout = %q, want it to contain %q", stdout, tc.stdout)
			}
			if tc.stderr != "" && !strings.Contains(stderr, tc.stderr) {
				t.Errorf("stderr = %q, want it to contain %q", stderr, tc.stderr)
			}
			if strings.Contains(stdout, `"code"`) {
				t.Errorf("CLI printed a CNI error: %q", stdout)
			}
		})
	}
}

// One network whose directory is unsafe does not stop the others: gc,
// leases and metrics go through the good ones, say which one they skipped
// and why, and exit 1.
func TestCLISkipsOnlyTheBadNetwork(t *testing.T) {
	dataDir := t.TempDir()
	for _, dir := range []string{"good", "planted", ".nomad-bridge-cni"} {
		if err := os.Mkdir(filepath.Join(dataDir, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dataDir, "good", "10.1.2.3"), []byte("c1\r\neth0"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dataDir, "planted", "lock"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	// From before this boot: gc would release it.
	old := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	if err := os.Chtimes(filepath.Join(dataDir, "good", "10.1.2.3"), old, old); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(t.TempDir(), filepath.Join(dataDir, ".nomad-bridge-cni", "planted")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		good string
	}{
		{[]string{"leases", "--data-dir", dataDir}, "10.1.2.3"},
		{[]string{"gc", "--dry-run", "--data-dir", dataDir}, "would release good c1/eth0 10.1.2.3"},
		{[]string{"metrics", "--data-dir", dataDir}, `network="good"`},
	} {
		code, stdout, stderr := run4(t, nil, tc.args...)
		if code != 1 || !strings.Contains(stderr, "network planted skipped") || !strings.Contains(stdout, tc.good) {
			t.Errorf("%v: exit %d\nstdout: %s\nstderr: %s\nwant exit 1, planted skipped, and %q", tc.args, code, stdout, stderr, tc.good)
		}
	}
}

// fakeNATCLI is the CLI with the real host but fake NAT tables: a sweep
// that releases lists no real iptables.
func fakeNATCLI() (*cli, *bytes.Buffer, *bytes.Buffer) {
	var stdout, stderr bytes.Buffer
	nat := &netfilter.Cleaner{Tables: []netfilter.Table{fakenat.New()}}
	sweeper := func() *reclaim.Sweeper {
		return &reclaim.Sweeper{Env: reclaim.Env{Host: &sysinfo.Real{}, Netfilter: nat, Log: io.Discard}}
	}
	return &cli{stdout: &stdout, stderr: &stderr, sweeper: sweeper, about: about}, &stdout, &stderr
}

// gc --all-data-dirs (what the boot sweep and the timer run) sweeps the
// default data dir and every one the host's conflists give the plugin: a
// lease left on a persistent data dir before the reboot goes; a data dir
// that does not exist (the tmpfs one, early at boot) is no failure.
func TestGCAllDataDirsSweepsEveryDataDirTheConflistsUse(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "not-yet")
	persistent, confDir := t.TempDir(), t.TempDir()
	lease := networkWithOldLease(t, confDir, persistent, "pers", "10.99.0.5")

	c, stdout, stderr := fakeNATCLI()
	code := c.run([]string{"gc", "--all-data-dirs", "--data-dir", missing, "--conf-dir", confDir})
	out := stdout.String()
	if code != 0 || !strings.Contains(out, "data dir "+missing+": does not exist, nothing to sweep") ||
		!strings.Contains(out, "data dir "+persistent+":\nreleased pers c1/eth0 10.99.0.5") {
		t.Errorf("exit %d\nstdout: %s\nstderr: %s", code, out, stderr)
	}
	if _, err := os.Lstat(lease); err == nil {
		t.Error("the stale lease is still there")
	}

	c, _, stderr = fakeNATCLI()
	if code := c.run([]string{"gc", "--all-data-dirs", "--json"}); code != 2 || !strings.Contains(stderr.String(), "--json prints one data dir's document") {
		t.Errorf("--all-data-dirs --json: exit %d, %s", code, stderr)
	}
}

// gc --all-data-dirs names each data dir it sweeps as the conflists give
// it, escaped as everything else it prints of what files name
// (regression: a dataDir holding an escape sequence, in a --conf-dir,
// reached the terminal raw).
func TestGCAllDataDirsEscapesTheDataDirsItNames(t *testing.T) {
	root, confDir := t.TempDir(), t.TempDir()
	for i, dir := range []string{"made\x1b[2J", "absent\x1b]0;x\a"} {
		if i == 0 {
			if err := os.Mkdir(filepath.Join(root, dir), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		name := []string{"made", "absent"}[i]
		quoted := strings.NewReplacer("\x1b", `\u001b`, "\a", `\u0007`).Replace(filepath.Join(root, dir))
		conf := `{"cniVersion":"1.0.0","name":"` + name + `","plugins":[{"type":"nomad-bridge-cni","bridge":"nbc` + name + `0","dataDir":"` + quoted +
			`","ipam":{"type":"host-local","ranges":[[{"subnet":"10.9` + string(rune('0'+i)) + `.0.0/24"}]]}}]}`
		if err := os.WriteFile(filepath.Join(confDir, "10-"+name+".conflist"), []byte(conf), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	c, stdout, stderr := fakeNATCLI()
	c.run([]string{"gc", "--all-data-dirs", "--data-dir", filepath.Join(t.TempDir(), "none"), "--conf-dir", confDir})
	out := stdout.String() + stderr.String()
	if strings.ContainsAny(out, "\x1b\a") {
		t.Errorf("printed a data dir raw:\n%q", out)
	}
	for _, want := range []string{`made\x1b[2J`, `absent\x1b]0;x\a`} {
		if !strings.Contains(out, want) {
			t.Errorf("no %s in:\n%s", want, out)
		}
	}
}

// Installed as bridge, the plugin serves "type": "bridge" entries: gc
// takes such an entry as the plugin's where an ADD through the plugin
// marked its network in the data dir the entry gives it (the marker proves
// it; a bare bridge's entry has none), and then sweeps that data dir and
// migrates from the entry's ipam.dataDir, as the entry's CHECK does
// (regression: gc treated every such entry as bare bridge's).
func TestGCTakesABridgeEntryThePluginServedAsItsOwn(t *testing.T) {
	for _, marked := range []bool{true, false} {
		custom, legacy, confDir := t.TempDir(), t.TempDir(), t.TempDir()
		conf := `{"cniVersion":"1.0.0","name":"front","plugins":[{"type":"bridge","bridge":"nbcfront0","dataDir":"` + custom +
			`","ipam":{"type":"host-local","dataDir":"` + legacy + `","ranges":[[{"subnet":"10.95.0.0/24"}]]}}]}`
		if err := os.WriteFile(filepath.Join(confDir, "10-front.conflist"), []byte(conf), 0o644); err != nil {
			t.Fatal(err)
		}
		legacyLease := filepath.Join(legacy, "front", "10.95.0.5")
		if err := os.MkdirAll(filepath.Dir(legacyLease), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(legacyLease, []byte("c1\r\neth0"), 0o600); err != nil {
			t.Fatal(err)
		}
		if marked {
			owned := ipamdir.New(custom, "front").Marker(ipamdir.OwnedMarker)
			if err := os.MkdirAll(filepath.Dir(owned), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(owned, []byte("front\n"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		c, stdout, stderr := fakeNATCLI()
		if code := c.run([]string{"gc", "--all-data-dirs", "--data-dir", filepath.Join(t.TempDir(), "none"), "--conf-dir", confDir}); code != 0 {
			t.Fatalf("marked %v: exit %d\nstdout: %s\nstderr: %s", marked, code, stdout, stderr)
		}
		_, err := os.Lstat(filepath.Join(custom, "front", "10.95.0.5"))
		if migrated := err == nil; migrated != marked {
			t.Errorf("marked %v: the legacy lease migrated into %s: %v\nstdout: %s", marked, custom, migrated, stdout)
		}
		if _, err := os.Lstat(legacyLease); err != nil {
			t.Errorf("marked %v: the legacy lease went: %v", marked, err)
		}
	}
}

// gc --all-data-dirs --network N sweeps N alone, wherever it is: an unsafe
// other network neither shows nor fails it, a data dir without N is no
// error, and an N no network can be named is refused as without
// --all-data-dirs.
func TestGCAllDataDirsWithNetworkIsAboutThatNetworkOnly(t *testing.T) {
	dataDir, other, confDir := t.TempDir(), t.TempDir(), t.TempDir()
	networkWithOldLease(t, confDir, dataDir, "good", "10.97.0.5")
	otherLease := networkWithOldLease(t, confDir, other, "pers", "10.96.0.5")
	for _, dir := range []string{".nomad-bridge-cni", "planted"} {
		if err := os.MkdirAll(filepath.Join(dataDir, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dataDir, "planted", "lock"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(t.TempDir(), filepath.Join(dataDir, ".nomad-bridge-cni", "planted")); err != nil {
		t.Fatal(err)
	}
	c, stdout, stderr := fakeNATCLI()
	code := c.run([]string{"gc", "--all-data-dirs", "--network", "good", "--data-dir", dataDir, "--conf-dir", confDir})
	if code != 0 || strings.Contains(stderr.String(), "planted") || !strings.Contains(stdout.String(), "released good c1/eth0 10.97.0.5") {
		t.Errorf("exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
	if _, err := os.Lstat(otherLease); err != nil {
		t.Errorf("the lease of another network went: %v", err)
	}

	c, _, stderr = fakeNATCLI()
	if code := c.run([]string{"gc", "--all-data-dirs", "--network", "../x", "--data-dir", dataDir, "--conf-dir", confDir}); code != 2 || !strings.Contains(stderr.String(), "invalid characters") {
		t.Errorf("--all-data-dirs --network ../x: exit %d, %s", code, stderr)
	}
}

// metrics --textfile replaces the file whole, readable by node_exporter's
// user, and leaves it as it was when the collection fails.
func TestMetricsTextfileIsWrittenAtomically(t *testing.T) {
	dataDir, out := t.TempDir(), filepath.Join(t.TempDir(), "nbc.prom")
	if err := os.WriteFile(out, []byte("old\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c, _, stderr := fakeNATCLI()
	if code := c.run([]string{"metrics", "--data-dir", dataDir, "--textfile", out}); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	b, err := os.ReadFile(out)
	fi, _ := os.Stat(out)
	if err != nil || !strings.Contains(string(b), "# TYPE nomad_bridge_cni_") || fi.Mode().Perm() != 0o644 {
		t.Errorf("textfile %v %v:\n%s", fi.Mode(), err, b)
	}
	entries, _ := os.ReadDir(filepath.Dir(out))
	if len(entries) != 1 {
		t.Errorf("left %d files beside it", len(entries)-1)
	}
	notDir := filepath.Join(dataDir, "file")
	if err := os.WriteFile(notDir, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	c, _, _ = fakeNATCLI()
	if code := c.run([]string{"metrics", "--data-dir", notDir, "--textfile", out}); code != 1 {
		t.Errorf("metrics of a data dir that is a file: exit %d, want 1", code)
	}
	if b2, _ := os.ReadFile(out); !bytes.Equal(b, b2) {
		t.Error("a failed collection changed the textfile")
	}
}

// A tmpfs data dir does not exist after a boot until the first ADD (on a
// node that runs no bridge network, ever): metrics then reports no network
// and succeeds, as gc --all-data-dirs does, rather than failing every
// minute and leaving the textfile to age into NomadBridgeCNIMetricsStale,
// which says the timer is dead.
func TestMetricsOfADataDirNotMadeYetIsNoNetwork(t *testing.T) {
	out := filepath.Join(t.TempDir(), "nbc.prom")
	if err := os.WriteFile(out, []byte("nomad_bridge_cni_leases{network=\"before-reboot\"} 3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c, _, stderr := fakeNATCLI()
	if code := c.run([]string{"metrics", "--data-dir", filepath.Join(t.TempDir(), "run-cni"), "--textfile", out}); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if b, _ := os.ReadFile(out); !strings.Contains(string(b), "# TYPE nomad_bridge_cni_leases gauge") || strings.Contains(string(b), "before-reboot") {
		t.Errorf("textfile not rewritten with no network:\n%s", b)
	}
}

// A --conf-dir that is not there is a usage error of every command that
// takes one, not a host with nothing to report.
func TestMissingConfDirIsAUsageError(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "typo")
	for _, cmd := range []string{"doctor", "gc", "leases", "metrics"} {
		args := []string{cmd, "--conf-dir", missing}
		if cmd != "doctor" {
			args = append(args, "--data-dir", t.TempDir())
		}
		c, _, stderr := fakeNATCLI()
		code := c.run(args)
		if code != 2 || !strings.Contains(stderr.String(), "--conf-dir "+missing) {
			t.Errorf("%s --conf-dir %s: exit %d, %s", cmd, missing, code, stderr)
		}
	}
}

// --grace and --remove-mounts only act with --runtime: given without it,
// they are refused, not silently ignored.
func TestGCRuntimeOptionsNeedRuntime(t *testing.T) {
	for _, opt := range [][]string{{"--grace", "10m"}, {"--remove-mounts"}} {
		c, _, stderr := fakeNATCLI()
		code := c.run(append([]string{"gc", "--data-dir", t.TempDir()}, opt...))
		if code != 2 || !strings.Contains(stderr.String(), "only meaningful with --runtime") {
			t.Errorf("gc %v without --runtime: exit %d, %s", opt, code, stderr)
		}
	}
}

// A usage error is one before the runtime is asked: not 30 s later, and
// not exit 1 when the runtime cannot be asked.
func TestGCRefusesBadFlagsBeforeAskingTheRuntime(t *testing.T) {
	t.Setenv("PATH", t.TempDir()) // no podman here
	c, _, stderr := fakeNATCLI()
	code := c.run([]string{"gc", "--all-data-dirs", "--json", "--runtime", "podman"})
	if code != 2 || !strings.Contains(stderr.String(), "--json prints one data dir's document") || strings.Contains(stderr.String(), "cannot ask podman") {
		t.Errorf("gc --all-data-dirs --json --runtime podman: exit %d, %s", code, stderr)
	}
}

// The fix doctor prints for stale attachments can be pasted as it is: run
// as printed, it releases them.
func TestDoctorsGCFixCanBePasted(t *testing.T) {
	dataDir, confDir, bin := filepath.Join(t.TempDir(), "data dir"), t.TempDir(), t.TempDir()
	networkWithOldLease(t, confDir, dataDir, "web", "10.98.0.7")
	c, stdout, _ := fakeNATCLI()
	c.run([]string{"doctor", "--conf-dir", confDir, "--cni-path", bin})
	var fix string
	for _, line := range strings.Split(stdout.String(), "\n") {
		if f, ok := strings.CutPrefix(strings.TrimSpace(line), "fix: nomad-bridge-cni gc "); ok {
			fix = f
		}
	}
	if fix == "" {
		t.Fatalf("doctor printed no gc fix:\n%s", stdout)
	}
	cmd, _, _ := strings.Cut(fix, " (see ")
	args, err := shellwords.Parse(cmd)
	if err != nil {
		t.Fatalf("the fix %q is not a shell command: %v", cmd, err)
	}
	c, stdout, stderr := fakeNATCLI()
	if code := c.run(append([]string{"gc"}, args...)); code != 0 || !strings.Contains(stdout.String(), "released web c1/eth0 10.98.0.7") {
		t.Errorf("pasted %q: exit %d\n%s%s", cmd, code, stdout, stderr)
	}
}

// networkWithOldLease writes a conflist of the plugin for network, its
// dataDir dataDir and a /24 around ip, and a lease of container c1 at ip
// written before this boot (a sweep releases it); it returns the lease.
func networkWithOldLease(t *testing.T, confDir, dataDir, network, ip string) string {
	t.Helper()
	subnet := ip[:strings.LastIndex(ip, ".")] + ".0/24"
	conf := `{"cniVersion":"1.0.0","name":"` + network + `","plugins":[{"type":"nomad-bridge-cni","bridge":"nbc` + network + `0","dataDir":"` + dataDir +
		`","ipam":{"type":"host-local","ranges":[[{"subnet":"` + subnet + `"}]]}}]}`
	if err := os.WriteFile(filepath.Join(confDir, "10-"+network+".conflist"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	lease := filepath.Join(dataDir, network, ip)
	if err := os.MkdirAll(filepath.Dir(lease), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(lease, []byte("c1\r\neth0"), 0o600); err != nil {
		t.Fatal(err)
	}
	old := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	if err := os.Chtimes(lease, old, old); err != nil {
		t.Fatal(err)
	}
	return lease
}

// The textfile collector's directory is node_exporter's user's: while
// metrics --textfile writes its temp file there, that user can put a
// symlink in its place. Making the temp file readable never follows it
// (regression: os.Chmod did, and made any file root's timer named, say
// /etc/shadow, readable by everyone).
func TestMetricsTextfileTempIsMadeReadableWithoutFollowingALink(t *testing.T) {
	victim := filepath.Join(t.TempDir(), "shadow")
	if err := os.WriteFile(victim, []byte("secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(t.TempDir(), ".tmp-4242-1")
	if err := os.Symlink(victim, tmp); err != nil {
		t.Fatal(err)
	}
	if err := worldReadable(tmp); err == nil {
		t.Error("a symlink in the temp file's place was made readable")
	}
	if fi, err := os.Stat(victim); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("the link's target: %v, %v; want it left 0600", fi.Mode(), err)
	}
}

// A network name no CNI network can have is a usage error, said before the
// runtime is asked: not after a 30 s wait, nor as the runtime's failure.
func TestBadNetworkNameIsRefusedBeforeAskingTheRuntime(t *testing.T) {
	t.Setenv("PATH", t.TempDir()) // no podman here
	for _, cmd := range []string{"leases", "gc"} {
		c, _, stderr := fakeNATCLI()
		code := c.run([]string{cmd, "--data-dir", t.TempDir(), "--network", "no/such", "--runtime", "podman"})
		if code != 2 || !strings.Contains(stderr.String(), "--network") || strings.Contains(stderr.String(), "cannot ask podman") {
			t.Errorf("%s --network no/such --runtime podman: exit %d, %s", cmd, code, stderr)
		}
	}
}

// What an error says goes out escaped: a planted file's or a record's name
// in it must not reach the terminal raw.
func TestFailEscapesWhatItPrints(t *testing.T) {
	c, _, stderr := fakeNATCLI()
	c.fail(1, errors.New("record \x1b]0;owned\x07 damaged\nnomad-bridge-cni: forged"), "")
	if s := stderr.String(); strings.ContainsAny(s, "\x1b\x07") || strings.Count(s, "\n") != 1 {
		t.Errorf("fail printed %q", s)
	}
}

// gc --json and leases --json that cannot start (the data dir cannot be
// listed, the runtime cannot be asked) still print their document, with
// nothing in it and why in "error", as doctor --json prints its report
// when it fails: `gc --json | jq` in a shell without pipefail must not
// read an empty input as success (regression: nothing was printed).
func TestJSONCommandsThatCannotStartPrintTheirDocument(t *testing.T) {
	dataDir := t.TempDir()
	missing := filepath.Join(dataDir, "absent")
	for _, c := range []struct {
		args  []string
		items string
		why   string
	}{
		{[]string{"gc", "--json", "--data-dir", missing}, "released", "no such file or directory"},
		{[]string{"gc", "--json", "--dry-run", "--data-dir", dataDir, "--network", "web"}, "released", "no leases or records"},
		{[]string{"gc", "--json", "--data-dir", dataDir, "--runtime", "podman"}, "released", "cannot ask podman"},
		{[]string{"leases", "--json", "--data-dir", missing}, "leases", "no such file or directory"},
		{[]string{"leases", "--json", "--data-dir", dataDir, "--runtime", "podman"}, "leases", "cannot ask podman"},
	} {
		t.Setenv("PATH", t.TempDir()) // no podman here
		cli, stdout, stderr := fakeNATCLI()
		code := cli.run(c.args)
		var doc map[string]any
		if err := json.Unmarshal(stdout.Bytes(), &doc); err != nil {
			t.Errorf("%v: exit %d, stdout %q is no JSON document: %v", c.args, code, stdout, err)
			continue
		}
		items, _ := doc[c.items].([]any)
		problems, _ := doc["problems"].([]any)
		why, _ := doc["error"].(string)
		if code != 1 || items == nil || len(items) != 0 || problems == nil || len(problems) != 0 || !strings.Contains(why, c.why) || doc["dataDir"] != c.args[slices.Index(c.args, "--data-dir")+1] || !strings.Contains(stderr.String(), c.why) {
			t.Errorf("%v: exit %d, stdout %s, stderr %s", c.args, code, stdout, stderr)
		}
		if c.items == "released" && doc["dryRun"] != slices.Contains(c.args, "--dry-run") {
			t.Errorf("%v: dryRun %v", c.args, doc["dryRun"])
		}
	}
}
