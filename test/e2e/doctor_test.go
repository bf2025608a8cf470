package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/invoke"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/cniexec"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/testhost"
)

var updateDoctorGolden = flag.Bool("update", false, "rewrite the doctor test's golden files (testdata/doctor)")

// doctorFinding is one finding of `doctor --json`, with the test's names
// and paths replaced by placeholders (see doctorHost.normalize).
type doctorFinding struct {
	Level   string `json:"level"`
	Check   string `json:"check"`
	Subject string `json:"subject"`
	Message string `json:"message"`
	Fix     string `json:"fix"`
}

// doctorHost is what one doctor subtest set up: the test's conflist (the
// example Nomad chain, its legacy leases in persistDir), the CNI bin dirs
// doctor is told about, and the placeholders for the paths a setup made.
type doctorHost struct {
	conf    map[string]any
	cniPath []string
	names   [][2]string
	version string // what the plugin under test prints as its version
}

// doctorChain is the order in which doctor checks the plugins of the
// test's chain (nomad.conflist's entries, then the delegate and host-local)
// when no other conflist on the host uses the plugin.
var doctorChain = []string{"loopback", pluginType, "firewall", "portmap", "bridge", "host-local"}

// TestDoctor sets up one real problem per subtest on this host and runs
// `doctor --conf-dir <the test's> --cni-path <...>`, text and JSON: the
// test's own findings (those naming its network, bridge, directories or
// chain's plugins; the host's own conflists are left out) must be all ✓
// but exactly the problem's, with its level, check, subject, message and
// fix, and the exit status must follow (1 with an error, 0 otherwise).
// The golden cases also compare the whole text and JSON, names and paths
// replaced by placeholders (-update rewrites them).
func TestDoctor(t *testing.T) {
	for _, tc := range []struct {
		name   string
		setup  func(t *testing.T, e *testEnv, h *doctorHost)
		want   []doctorFinding // every finding of the test's that is not ✓
		code   int
		golden bool
	}{
		{
			name: "clean",
			setup: func(t *testing.T, e *testEnv, h *doctorHost) {
				ns := e.addNetns(t, "a")
				e.mustCNI(t, "add", ns, "")
			},
			golden: true,
		},
		{
			name: "invalid-entry",
			setup: func(t *testing.T, e *testEnv, h *doctorHost) {
				entryOfType(t, h.conf, pluginType)["delegateTimeout"] = "soon"
				e.writeConflist(t, h.conf)
				// ADD says the same.
				msg := `"delegateTimeout" "soon" must be a duration between 1s and 1h0m0s`
				if _, _, err := e.cnitool("add", e.addNetns(t, "a"), ""); err == nil || !strings.Contains(err.Error(), msg) {
					t.Fatalf("ADD with the invalid entry: %v, want %q", err, msg)
				}
			},
			want: []doctorFinding{{"error", "conflist", "CONF/NET.conflist",
				`entry 1 of network "NET": "delegateTimeout" "soon" must be a duration between 1s and 1h0m0s, such as "90s"`,
				"fix the entry: every ADD fails the same way"}},
			code:   1,
			golden: true,
		},
		{
			name:  "missing-bridge",
			setup: func(t *testing.T, e *testEnv, h *doctorHost) { h.binWithout(t, e, "bridge") },
			want: []doctorFinding{{"error", "plugin", "bridge",
				`not found in TMP/cni-bin: failed to find plugin "bridge" in path [TMP/cni-bin]`,
				"install the reference CNI plugins (the cni-plugins release of github.com/containernetworking/plugins, or make plugins, stamped) into one of TMP/cni-bin"}},
			code: 1,
		},
		{
			name:  "missing-host-local",
			setup: func(t *testing.T, e *testEnv, h *doctorHost) { h.binWithout(t, e, "host-local") },
			want: []doctorFinding{{"error", "plugin", "host-local",
				`not found in TMP/cni-bin: failed to find plugin "host-local" in path [TMP/cni-bin]`,
				"install the reference CNI plugins (the cni-plugins release of github.com/containernetworking/plugins, or make plugins, stamped) into one of TMP/cni-bin"}},
			code: 1,
		},
		{
			// bridge built without the version stamp prints "version
			// unknown" (what Nomad then records is the nomad: check's).
			name: "unstamped-bridge",
			setup: func(t *testing.T, e *testEnv, h *doctorHost) {
				dir := filepath.Join(filepath.Dir(e.dataDir), "unstamped")
				buildUnstamped(t, dir, "github.com/containernetworking/plugins/plugins/main/bridge")
				h.cniPath = []string{dir, e.bin}
			},
			want: []doctorFinding{{"warn", "plugin", "TMP/unstamped/bridge",
				`version unknown: built without its version stamped`,
				"install plugins stamped with their version: make plugins"}},
		},
		{
			name: "datadir-not-tmpfs",
			setup: func(t *testing.T, e *testEnv, h *doctorHost) {
				dir := testhost.DirOffTmpfs(t)
				h.names = append(h.names, [2]string{dir, "PERSISTENT"})
				entryOfType(t, h.conf, pluginType)["dataDir"] = dir
				e.writeConflist(t, h.conf)
			},
			want: []doctorFinding{{"warn", "dataDir", "PERSISTENT",
				"not a tmpfs: leases survive a reboot (the boot rule still reclaims them, later)",
				`mount a tmpfs there, or point "dataDir" at one (/run/cni)`}},
		},
		{
			name: "datadir-symlink",
			setup: func(t *testing.T, e *testEnv, h *doctorHost) {
				link := filepath.Join(filepath.Dir(e.dataDir), "link")
				if err := os.Symlink(e.dataDir, link); err != nil {
					t.Fatal(err)
				}
				entryOfType(t, h.conf, pluginType)["dataDir"] = link
				e.writeConflist(t, h.conf)
				if _, _, err := e.cnitool("add", e.addNetns(t, "a"), ""); err == nil || !strings.Contains(err.Error(), "it is a symlink") {
					t.Fatalf("ADD with a symlink as dataDir: %v, want it refused", err)
				}
			},
			want: []doctorFinding{{"error", "dataDir", "TMP/link",
				`unsafe for network "NET": refusing TMP/link: it is a symlink (a directory the plugin writes must not point elsewhere)`,
				"remove what was planted, or chown it to root: every verb refuses it"}},
			code: 1,
		},
		{
			name: "clash-same-name",
			setup: func(t *testing.T, e *testEnv, h *doctorHost) {
				e.otherNetwork(t, e.netName, "nbcx"+e.id, otherSubnet(e.subnet4))
			},
			want: []doctorFinding{{"error", "clash", "NET",
				`two networks named "NET" (CONF/99-other.conflist) and "NET" (CONF/NET.conflist)`,
				"rename one: runtimes pick one of them, and they share a lease directory"}},
			code: 1,
		},
		{
			name: "clash-same-bridge",
			setup: func(t *testing.T, e *testEnv, h *doctorHost) {
				e.otherNetwork(t, e.netName+"-x", e.bridge, otherSubnet(e.subnet4))
			},
			want: []doctorFinding{{"error", "clash", "BRIDGE",
				`one bridge for "NET-x" (CONF/99-other.conflist) and "NET" (CONF/NET.conflist)`,
				`give each network its own "bridge"`}},
			code: 1,
		},
		{
			name: "clash-overlapping-subnet",
			setup: func(t *testing.T, e *testEnv, h *doctorHost) {
				e.otherNetwork(t, e.netName+"-x", "nbcx"+e.id, e.subnet4)
			},
			want: []doctorFinding{{"error", "clash", "SUBNET4",
				`SUBNET4 overlaps SUBNET4 of "NET-x" (CONF/99-other.conflist) and "NET" (CONF/NET.conflist), kept in PERSIST/NET-x and DATA/NET: one address can be handed out twice`,
				"give one of them another subnet"}},
			code:   1,
			golden: true,
		},
		{
			// The conflist's ipam.dataDir (persistDir) names where
			// host-local kept the network's leases before the plugin.
			name: "legacy-leases",
			setup: func(t *testing.T, e *testEnv, h *doctorHost) {
				writeLease(t, filepath.Join(e.persistDir, e.netName), e.hostAddr(9), leaseContent("old-container"), time.Now())
			},
			want: []doctorFinding{{"warn", "state", "NET",
				"1 legacy lease(s) in PERSIST/NET wait for the migration",
				"the network's next ADD or CHECK migrates them"}},
		},
		{
			// A container whose namespace went without a DEL.
			name: "stale-attachment",
			setup: func(t *testing.T, e *testEnv, h *doctorHost) {
				ns := e.addNetns(t, "a")
				e.mustCNI(t, "add", ns, "")
				e.destroyNetns(t, ns)
			},
			want: []doctorFinding{{"warn", "state", "NET",
				"0 live, 0 pending, 1 stale, 0 detached, 0 unknown, 0 orphan NAT rule set(s)",
				"nomad-bridge-cni gc --data-dir DATA --network NET --orphan-rules (see nomad-bridge-cni leases --data-dir DATA)"}},
			golden: true,
		},
		{
			// Nomad's restore: a new namespace at the path, the task still
			// running in the old one.
			name: "detached-attachment",
			setup: func(t *testing.T, e *testEnv, h *doctorHost) {
				ns := e.addNetns(t, "a")
				e.mustCNI(t, "add", ns, "")
				e.startContainer(t, ns)
				// Before the environment's cleanup kills the task: its
				// namespace, and the veth in it, would then go
				// asynchronously, under the cleanup's feet.
				t.Cleanup(func() {
					if err := e.deleteBridgePorts(); err != nil {
						t.Errorf("delete veths: %v", err)
					}
				})
				if err := ns.named().Recreate(); err != nil {
					t.Fatal(err)
				}
			},
			want: []doctorFinding{{"warn", "state", "NET",
				"0 live, 0 pending, 0 stale, 1 detached, 0 unknown, 0 orphan NAT rule set(s)",
				"see nomad-bridge-cni leases: a detached attachment's container still runs in its old namespace"}},
		},
		{
			// A lease of this boot without the plugin's record (as bare
			// bridge leaves them): kept, and flagged.
			name: "unknown-attachment",
			setup: func(t *testing.T, e *testEnv, h *doctorHost) {
				ns := e.addNetns(t, "a")
				e.mustCNI(t, "add", ns, "")
				if err := os.Remove(e.recordPath(ns.cid)); err != nil {
					t.Fatal(err)
				}
			},
			want: []doctorFinding{{"warn", "state", "NET",
				"0 live, 0 pending, 0 stale, 0 detached, 1 unknown, 0 orphan NAT rule set(s)",
				"see nomad-bridge-cni leases: an unknown attachment's lease has no record of the plugin (another writer, or a judgement it could not make) and is never released by a sweep: DEL it through its runtime, or remove the lease once nothing uses its address"}},
		},
		{
			// bridge's ipMasq chain and jump of a container the network
			// has no lease or record of, next to a live one.
			name: "orphan-nat-rules",
			setup: func(t *testing.T, e *testEnv, h *doctorHost) {
				ns := e.addNetns(t, "a")
				e.mustCNI(t, "add", ns, "")
				e.orphanMasq(t, "orphan-"+e.id)
			},
			want: []doctorFinding{{"warn", "state", "NET",
				"1 live, 0 pending, 0 stale, 0 detached, 0 unknown, 1 orphan NAT rule set(s)",
				"nomad-bridge-cni gc --data-dir DATA --network NET --orphan-rules (see nomad-bridge-cni leases --data-dir DATA)"}},
		},
		{
			// The same in a network whose directories are gone: found in
			// the nat table, and doctor creates no directory.
			name: "orphan-nat-rules-no-leases",
			setup: func(t *testing.T, e *testEnv, h *doctorHost) {
				e.orphanMasq(t, "orphan-"+e.id)
			},
			want: []doctorFinding{{"warn", "state", "NET",
				"0 live, 0 pending, 0 stale, 0 detached, 0 unknown, 1 orphan NAT rule set(s)",
				// Every gc refuses a network with no directory in the data dir.
				"no gc sweeps NET in DATA before an ADD through the plugin makes its directory there: the first one marks the network the plugin's, and the next CHECK or gc releases them"}},
		},
		{
			// A directory named for an address among the leases, next to
			// a live container: the sweep skips it, `leases` lists it.
			name: "skipped-file",
			setup: func(t *testing.T, e *testEnv, h *doctorHost) {
				e.mustCNI(t, "add", e.addNetns(t, "a"), "")
				if err := os.Mkdir(filepath.Join(e.leaseDir(), "10.255.255.254"), 0o755); err != nil {
					t.Fatal(err)
				}
			},
			want: []doctorFinding{{"warn", "state", "NET",
				"1 damaged or foreign file(s) skipped: neither judged nor counted",
				"see nomad-bridge-cni leases --data-dir DATA --network NET: it lists them, each with why"}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.requirePlugin(t)
			h := &doctorHost{conf: e.reclaimConf(t, "nomad.conflist"), cniPath: []string{e.bin}, version: pluginVersion(t, e)}
			e.writeConflist(t, h.conf)
			tc.setup(t, e, h)
			before := h.files(t, e)

			text, doc, code := e.runDoctor(t, h)
			if after := h.files(t, e); after != before {
				t.Errorf("doctor, which only reads, changed files:\n--- before\n%s\n--- after\n%s", before, after)
			}
			var mine []doctorFinding
			foreignError := false
			for _, raw := range doc.Findings {
				var f doctorFinding
				if err := json.Unmarshal(raw, &f); err != nil {
					t.Fatalf("finding %s: %v", raw, err)
				}
				if !h.mine(e, f.Check, f.Subject, f.Message) {
					foreignError = foreignError || f.Level == "error"
					continue
				}
				mine = append(mine, h.normalizeFinding(e, f))
			}
			var problems []doctorFinding
			seen := map[string]bool{}
			for _, f := range mine {
				seen[f.Check] = true
				if f.Level != "ok" {
					problems = append(problems, f)
				}
			}
			if !slices.Equal(problems, tc.want) {
				t.Errorf("doctor's findings about the test's setup are not ✓ but for %+v:\n%s", tc.want, findingLines(mine))
			}
			if len(tc.want) == 0 {
				for _, c := range []string{"conflist", "plugin", "dataDir", "state"} {
					if !seen[c] {
						t.Errorf("doctor said nothing of the test's %s:\n%s", c, findingLines(mine))
					}
				}
			}
			wantCode := tc.code
			if foreignError {
				t.Logf("the host's own conflists have errors: doctor exits 1 whatever the test's setup")
				wantCode = 1
			}
			if code != wantCode || doc.OK != (code == 0) {
				t.Errorf("doctor: exit %d, ok %v; want exit %d", code, doc.OK, wantCode)
			}
			if tc.golden {
				h.golden(t, e, tc.name, text, doc.Findings)
			}
		})
	}
}

// files is the state of every file the test made: its base directory
// (the dataDir's tmpfs, the legacy lease directory, the conflists) and the
// setup's own.
func (h *doctorHost) files(t *testing.T, e *testEnv) string {
	t.Helper()
	state := treeState(t, filepath.Dir(e.dataDir))
	for _, dir := range h.placeholders() {
		state += treeState(t, dir)
	}
	return state
}

// runDoctor runs doctor on the test's conflist directory and bin dirs
// twice, for its text and its JSON, and returns both and the exit status
// (the same for both).
func (e *testEnv) runDoctor(t *testing.T, h *doctorHost) (string, doctorJSON, int) {
	t.Helper()
	args := []string{"doctor", "--conf-dir", e.confDir, "--cni-path", strings.Join(h.cniPath, ":")}
	text, code := e.doctorCmd(t, args...)
	out, jsonCode := e.doctorCmd(t, append(args, "--json")...)
	var doc doctorJSON
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("doctor --json: %v\n%s", err, out)
	}
	if jsonCode != code {
		t.Errorf("doctor exits %d, with --json %d", code, jsonCode)
	}
	return text, doc, code
}

// doctorJSON is the documented schema of `doctor --json`; findings are
// kept raw for the golden file.
type doctorJSON struct {
	Findings []json.RawMessage `json:"findings"`
	OK       bool              `json:"ok"`
}

func (e *testEnv) doctorCmd(t *testing.T, args ...string) (string, int) {
	t.Helper()
	stdout, stderr, err := e.operator(t, args...)
	var exitErr *exec.ExitError
	switch {
	case errors.As(err, &exitErr) && exitErr.ExitCode() == 1:
		return stdout, 1
	case err != nil:
		t.Fatalf("%v: %v\n%s%s", args, err, stdout, stderr)
	}
	return stdout, 0
}

// mine tells the test's findings from those about the host's own
// configuration: they name the test's network, bridge or directories, or
// are about a plugin of its chain (doctor looks for them in the test's
// --cni-path only).
func (h *doctorHost) mine(e *testEnv, check, subject, message string) bool {
	if check == "plugin" {
		return slices.Contains(doctorChain, filepath.Base(subject))
	}
	s := subject + " " + message
	for _, name := range append([]string{e.netName, e.bridge, filepath.Dir(e.dataDir)}, h.placeholders()...) {
		if strings.Contains(s, name) {
			return true
		}
	}
	return false
}

// placeholders are the paths the setup made outside the test's base
// directory.
func (h *doctorHost) placeholders() []string {
	var out []string
	for _, n := range h.names {
		out = append(out, n[0])
	}
	return out
}

// normalize replaces what differs between runs: the test's names, paths
// and subnet, the bin dir, and the plugin's version.
func (h *doctorHost) normalize(e *testEnv, s string) string {
	pairs := slices.Clone(h.names)
	pairs = append(pairs,
		[2]string{e.confDir, "CONF"}, [2]string{e.dataDir, "DATA"}, [2]string{e.persistDir, "PERSIST"},
		[2]string{filepath.Dir(e.dataDir), "TMP"}, [2]string{e.bin, "BIN"},
		[2]string{e.netName, "NET"}, [2]string{e.bridge, "BRIDGE"}, [2]string{e.subnet4.String(), "SUBNET4"},
		[2]string{h.version, "VERSION"})
	for _, p := range pairs {
		s = strings.ReplaceAll(s, p[0], p[1])
	}
	return s
}

func (h *doctorHost) normalizeFinding(e *testEnv, f doctorFinding) doctorFinding {
	return doctorFinding{f.Level, f.Check, h.normalize(e, f.Subject), h.normalize(e, f.Message), h.normalize(e, f.Fix)}
}

// pluginVersion is the version the plugin under test prints ("CNI
// nomad-bridge-cni plugin <version>"), as doctor reads it.
func pluginVersion(t *testing.T, e *testEnv) string {
	t.Helper()
	r := cniexec.Run(t, e.binary(pluginType), invoke.Args{}, cniexec.Opts{})
	f := strings.Fields(r.Stdout)
	if r.Err != nil || len(f) < 4 {
		t.Fatalf("%s prints no version: %v", pluginType, r)
	}
	return f[3]
}

// golden compares the test's findings, in doctor's order but the plugins
// in doctorChain's (other conflists of the host that use the plugin change
// the order doctor checks them in), text and JSON, with
// testdata/doctor/<name>.{txt,json}. ok and the exit status are left out:
// they count the host's own findings too (checked apart).
func (h *doctorHost) golden(t *testing.T, e *testEnv, name, text string, findings []json.RawMessage) {
	t.Helper()
	var blocks []string
	for line := range strings.SplitSeq(strings.TrimSuffix(text, "\n"), "\n") {
		if strings.HasPrefix(line, "    ") && len(blocks) > 0 {
			blocks[len(blocks)-1] += line + "\n"
			continue
		}
		blocks = append(blocks, line+"\n")
	}
	var txt []string
	for _, b := range blocks {
		_, rest, _ := strings.Cut(b, " ")
		f := strings.SplitN(strings.SplitN(rest, "\n", 2)[0], ": ", 3)
		if len(f) == 3 && h.mine(e, f[0], f[1], f[2]) {
			txt = append(txt, h.normalize(e, b))
		}
	}
	var js []string
	for _, raw := range findings {
		var f doctorFinding
		if err := json.Unmarshal(raw, &f); err == nil && h.mine(e, f.Check, f.Subject, f.Message) {
			js = append(js, h.normalize(e, string(raw)))
		}
	}
	sortPlugins(txt, func(b string) string {
		_, rest, _ := strings.Cut(b, " ")
		if f := strings.SplitN(rest, ": ", 3); len(f) == 3 && f[0] == "plugin" {
			return f[1]
		}
		return ""
	})
	sortPlugins(js, func(raw string) string {
		var f doctorFinding
		if json.Unmarshal([]byte(raw), &f) == nil && f.Check == "plugin" {
			return f.Subject
		}
		return ""
	})
	var jsBuf bytes.Buffer
	if err := json.Indent(&jsBuf, []byte(`{"findings": [`+strings.Join(js, ",")+"]}"), "", "  "); err != nil {
		t.Fatalf("indent: %v", err)
	}
	jsBuf.WriteString("\n")
	dir := filepath.Join(testhost.RepoDir(t), "test", "e2e", "testdata", "doctor")
	for file, got := range map[string][]byte{name + ".txt": []byte(strings.Join(txt, "")), name + ".json": jsBuf.Bytes()} {
		path := filepath.Join(dir, file)
		if *updateDoctorGolden {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, got, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (run the test with -update)", err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from the golden file:\n--- got\n%s\n--- want\n%s", file, got, want)
		}
	}
}

// sortPlugins puts the plugin findings among items (pluginOf gives a
// finding's plugin path, "" for the others) in doctorChain's order, in the
// places they held; the other findings keep theirs.
func sortPlugins(items []string, pluginOf func(string) string) {
	var at []int
	var plugins []string
	for i, it := range items {
		if pluginOf(it) != "" {
			at = append(at, i)
			plugins = append(plugins, it)
		}
	}
	rank := func(it string) int { return slices.Index(doctorChain, filepath.Base(pluginOf(it))) }
	slices.SortStableFunc(plugins, func(a, b string) int { return rank(a) - rank(b) })
	for k, i := range at {
		items[i] = plugins[k]
	}
}

func findingLines(fs []doctorFinding) string {
	var b strings.Builder
	for _, f := range fs {
		b.WriteString(f.Level + " " + f.Check + ": " + f.Subject + ": " + f.Message + " (fix: " + f.Fix + ")\n")
	}
	return b.String()
}

// binWithout makes a CNI bin dir of the bin dir's plugins but one, and
// makes it doctor's --cni-path.
func (h *doctorHost) binWithout(t *testing.T, e *testEnv, missing string) {
	t.Helper()
	dir := filepath.Join(filepath.Dir(e.dataDir), "cni-bin")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range append(slices.Clone(referenceBinaries), pluginType) {
		if name == missing {
			continue
		}
		if err := os.Symlink(filepath.Join(e.bin, name), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	h.cniPath = []string{dir}
}

// buildUnstamped builds a reference plugin of go.mod into dir without the
// version stamp `make plugins` gives it: what `go build` or `go install`
// of the plugins yields.
func buildUnstamped(t *testing.T, dir, pkg string) {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("go is needed to build an unstamped plugin: %v", err)
	}
	cmd := exec.Command(goBin, "build", "-buildvcs=false", "-trimpath", "-o", dir+"/", pkg)
	cmd.Dir = testhost.RepoDir(t)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, out)
	}
}

// otherNetwork writes a second network (99-other.conflist, bare bridge,
// its leases in persistDir) next to the test's.
func (e *testEnv) otherNetwork(t *testing.T, name, bridge string, subnet netip.Prefix) {
	t.Helper()
	other := e.confFor(t, "minimal.conflist")
	other["name"] = name
	bareBridge(t, other, e.persistDir)
	p := entryOfType(t, other, "bridge")
	p["bridge"] = bridge
	p["ipam"].(map[string]any)["subnet"] = subnet.String()
	if err := os.WriteFile(filepath.Join(e.confDir, "99-other.conflist"), mustJSON(t, other), 0o644); err != nil {
		t.Fatal(err)
	}
}

// otherSubnet is the /24 after p: no overlap.
func otherSubnet(p netip.Prefix) netip.Prefix {
	a := p.Addr().As4()
	a[2]++
	return netip.PrefixFrom(netip.AddrFrom4(a), 24)
}

// orphanMasq makes bridge's ipMasq chain and POSTROUTING jump (IPv4) for
// cid in the test's network, as a DEL that skipped the teardown leaves;
// cleanup removes them.
func (e *testEnv) orphanMasq(t *testing.T, cid string) {
	t.Helper()
	e.track(cid)
	chain := e.masqChain(cid)
	for _, args := range [][]string{
		{"-N", chain},
		{"-A", chain, "-j", "MASQUERADE"},
		{"-A", "POSTROUTING", "-s", e.hostAddr(250).String(), "-j", chain, "-m", "comment", "--comment", e.masqComment(cid)},
	} {
		if err := run("iptables", append([]string{"-w", "-t", "nat"}, args...)...); err != nil {
			t.Fatalf("create orphan rules: %v", err)
		}
	}
}

// Installed as bridge in front of the reference plugins (make
// install-as-bridge), the plugin owns the conflists' "type": "bridge"
// entries: doctor, run with the runtime's plugin path, says so, checks the
// network as the plugin's, and names the reference bridge the front copy
// calls (the one whose version Nomad's CHECK depends on).
func TestDoctorKnowsThePluginInstalledAsBridge(t *testing.T) {
	e := newEnv(t)
	e.requirePlugin(t)
	conf := e.reclaimConf(t, "nomad.conflist")
	entryOfType(t, conf, pluginType)["type"] = "bridge"
	e.writeConflist(t, conf)
	front := e.frontDir(t)
	stdout, stderr, err := e.operator(t, "doctor", "--conf-dir", e.confDir, "--cni-path", front+":"+e.bin)
	var exitErr *exec.ExitError
	if err != nil && (!errors.As(err, &exitErr) || exitErr.ExitCode() != 1) {
		t.Fatalf("doctor: %v\n%s", err, stderr)
	}
	for _, want := range []string{
		"✓ plugin: " + filepath.Join(front, "bridge") + `: nomad-bridge-cni installed as bridge: the conflists' "type": "bridge" entries with host-local are its; it delegates to ` + filepath.Join(e.bin, "bridge"),
		`network "` + e.netName + `" uses nomad-bridge-cni (installed as "bridge")`,
		"✓ plugin: " + filepath.Join(e.bin, "bridge") + ": version v1.10.0",
		"✓ state: " + e.netName + ": 0 live",
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("doctor's output has no %q:\n%s", want, stdout)
		}
	}
}

// TestDoctorReadsTheNomadClient: with a Nomad agent answering (a stand-in
// nomad CLI serving /v1/agent/self as `nomad operator api` prints it),
// doctor takes the client's cni_path (the front copy first, the reference
// plugins last), computes the bridge version Nomad records from the last
// directory, and reports the built-in network's state.
func TestDoctorReadsTheNomadClient(t *testing.T) {
	e := newEnv(t)
	front := e.frontDir(t)
	fake := filepath.Join(t.TempDir(), "fakebin")
	if err := os.MkdirAll(fake, 0o755); err != nil {
		t.Fatal(err)
	}
	self := fmt.Sprintf(`{"config": {"Client": {"CNIPath": %q, "CNIConfigDir": %q, "BridgeNetworkName": "nbn%s", "BridgeNetworkSubnet": %q}}}`,
		front+":"+e.bin, e.confDir, e.id, otherSubnet(e.subnet4).String())
	script := "#!/bin/sh\n[ \"$1 $2 $3\" = \"operator api /v1/agent/self\" ] || exit 1\ncat <<'JSON'\n" + self + "\nJSON\n"
	if err := os.WriteFile(filepath.Join(fake, "nomad"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	r := cniexec.Run(t, e.binary(pluginType), invoke.Args{}, cniexec.Opts{Argv: []string{"doctor"}, Env: []string{"PATH=" + fake + ":" + os.Getenv("PATH"), "CNI_PATH"}})
	out := r.Stdout
	for _, want := range []string{
		"✓ nomad: client: settings from the agent's API (/v1/agent/self): cni_path " + front + ":" + e.bin + ", cni_config_dir " + e.confDir + ", bridge nbn" + e.id,
		"✓ nomad: bridge: Nomad records bridge v1.10.0 (from " + filepath.Join(e.bin, "bridge") + ", the last bridge of cni_path",
		"✓ plugin: " + filepath.Join(front, "bridge") + ": nomad-bridge-cni installed as bridge",
		"state: nomad (Nomad's built-in bridge network): ",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("doctor output lacks %q:\n%s\nstderr: %s", want, out, r.Stderr)
		}
	}
}

// TestDoctorOnASmallDataDir: a dataDir of 512 KiB holds ADDs; the doctor
// says it is nearly full, a warning, not an error (regression: less than
// 1 MiB free was "records and leases cannot be written", exit 1).
func TestDoctorOnASmallDataDir(t *testing.T) {
	e := newEnv(t)
	e.requirePlugin(t)
	e.mountTinyTmpfs(t, "512k")
	e.writeConflist(t, e.reclaimConf(t, "nomad.conflist"))
	e.mustCNI(t, "add", e.addNetns(t, "a"), "")
	text, _ := e.doctorCmd(t, "doctor", "--conf-dir", e.confDir, "--cni-path", e.bin)
	if want := "! dataDir: " + e.dataDir + ": nearly full: "; !strings.Contains(text, want) {
		t.Errorf("doctor lacks %q:\n%s", want, text)
	}
	if strings.Contains(text, "✗ dataDir: "+e.dataDir) {
		t.Errorf("doctor calls a dataDir that ADDs work in broken:\n%s", text)
	}
}

// TestDoctorJudgesNomadsFingerprintByTheAgentsVersion: cni_path starts
// with an empty directory, which Nomad's fingerprint passes from 1.11.2
// and stops at before (regression: Nomad 2.0.6-dev recorded bridge v1.10.0
// and sent CHECK, the doctor said it recorded nothing). The version comes
// from the agent's API (a stand-in nomad CLI), else from `nomad version`.
func TestDoctorJudgesNomadsFingerprintByTheAgentsVersion(t *testing.T) {
	e := newEnv(t)
	e.requirePlugin(t)
	empty := t.TempDir()
	cniPath := empty + ":" + e.bin
	fake := t.TempDir()
	nomad := filepath.Join(fake, "nomad")
	self := fmt.Sprintf(`{"config": {"Client": {"CNIPath": %q, "CNIConfigDir": %q}, "Version": {"Version": "1.11.1", "VersionPrerelease": ""}}}`, cniPath, e.confDir)
	for _, c := range []struct {
		name, script string
		env          []string
		want         []string
	}{
		{"api", "#!/bin/sh\n[ \"$1 $2 $3\" = \"operator api /v1/agent/self\" ] || exit 1\ncat <<'JSON'\n" + self + "\nJSON\n", []string{"CNI_PATH"}, []string{
			"; Nomad 1.11.1 (from the agent's API)",
			"! nomad: bridge: Nomad records no version of bridge from cni_path " + cniPath + ": it never sends CHECK (no CHECK-time sweep), and places no group with network mode \"bridge\" on this node (servers from Nomad 1.8.0 constrain each to attr.plugins.cni.version.bridge semver >= 0.4.0; \"cni/\" modes are not constrained); Nomad 1.11.1, as every Nomad before 1.11.2, reads no further than " + empty + " (empty)",
		}},
		{"cli", "#!/bin/sh\n[ \"$1\" = version ] || { echo 'Error querying agent: connection refused' >&2; exit 1; }\necho 'Nomad v2.0.6-dev'\necho 'BuildDate 2026-11-30T10:00:00Z'\n", []string{"CNI_PATH=" + cniPath}, []string{
			"; Nomad 2.0.6-dev (from " + nomad + " version, the CLI's: the agent's unless it runs another binary)",
			"✓ nomad: bridge: Nomad records bridge v1.10.0 (from " + filepath.Join(e.bin, "bridge") + ", the last bridge of the CNI path given (--cni-path or CNI_PATH) " + cniPath + " that prints a version): it sends CHECK on restore",
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := os.WriteFile(nomad, []byte(c.script), 0o755); err != nil {
				t.Fatal(err)
			}
			r := cniexec.Run(t, e.binary(pluginType), invoke.Args{}, cniexec.Opts{Argv: []string{"doctor", "--conf-dir", e.confDir}, Env: append([]string{"PATH=" + fake + ":" + os.Getenv("PATH")}, c.env...)})
			for _, want := range c.want {
				if !strings.Contains(r.Stdout, want) {
					t.Errorf("doctor output lacks %q:\n%s\nstderr: %s", want, r.Stdout, r.Stderr)
				}
			}
		})
	}
}
