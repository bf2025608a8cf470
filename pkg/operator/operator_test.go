package operator

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/netfilter"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/reclaim"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/records"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/runtimes"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/sysinfo"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/dirstate"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/fakehost"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/fakenat"
)

var update = flag.Bool("update", false, "rewrite the golden files")

var boot = time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)

// fixture is a data dir with two networks and one attachment in each
// state, a fake host with a fixed clock, and NAT rules including an orphan.
func fixture(t *testing.T) (string, *reclaim.Sweeper, *fakenat.Table) {
	t.Helper()
	dataDir := t.TempDir()
	host := fakehost.New(boot)
	host.Clock = boot.Add(3*time.Hour + 25*time.Minute)
	nat := fakenat.New()

	lease := func(network, ip, content string, mtime time.Time) {
		dir := filepath.Join(dataDir, network)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "lock"), nil, 0o750); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, ip)
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(path, mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
	record := func(network, cid, netns string, ino uint64, bootID string, state records.Phase, pid int, created time.Time) {
		r := &records.Record{Version: records.FormatVersion, Network: network, ContainerID: cid, IfName: "eth0", Netns: netns,
			NetnsID: sysinfo.NetnsID{Dev: 4, Ino: ino}, BootID: bootID, Created: created, State: state, PID: pid}
		if pid != 0 {
			r.PIDStart = 1
			host.Processes[pid] = 1
		}
		if err := records.NewStore(ipamdir.New(dataDir, network)).Write(r); err != nil {
			t.Fatal(err)
		}
	}

	host.Namespaces["/var/run/netns/web"] = sysinfo.NetnsID{Dev: 4, Ino: 101}
	lease("nomad", "172.26.64.2", "web\r\neth0", boot.Add(time.Hour))
	record("nomad", "web", "/var/run/netns/web", 101, "boot-1", records.Complete, 0, boot.Add(time.Hour))
	nat.AddContainer("nomad", "web", "172.26.64.2", 0)

	lease("nomad", "172.26.64.10", "gone\r\neth0", boot.Add(2*time.Hour))
	record("nomad", "gone", "/var/run/netns/gone", 102, "boot-1", records.Complete, 0, boot.Add(2*time.Hour))
	nat.AddContainer("nomad", "gone", "172.26.64.10", 8080)

	lease("nomad", "172.26.64.3", "before\r\neth0", boot.Add(-26*time.Hour))
	record("nomad", "before", "/var/run/netns/before", 103, "boot-0", records.Complete, 0, boot.Add(-26*time.Hour))

	host.Namespaces["/var/run/netns/starting"] = sysinfo.NetnsID{Dev: 4, Ino: 104}
	lease("nomad", "172.26.64.4", "starting\r\neth0", boot.Add(3*time.Hour+24*time.Minute))
	record("nomad", "starting", "/var/run/netns/starting", 104, "boot-1", records.Started, 9999, boot.Add(3*time.Hour+24*time.Minute))

	// Nomad re-created the path after a failed CHECK; the task still runs
	// in the recorded namespace.
	host.Namespaces["/var/run/netns/detached"] = sysinfo.NetnsID{Dev: 4, Ino: 4026533999}
	host.Holders[sysinfo.NetnsID{Dev: 4, Ino: 105}] = []sysinfo.Holder{{PID: 20420, Command: "python3"}}
	lease("nomad", "172.26.64.6", "detached\r\neth0", boot.Add(3*time.Hour))
	record("nomad", "detached", "/var/run/netns/detached", 105, "boot-1", records.Complete, 0, boot.Add(3*time.Hour))
	nat.AddContainer("nomad", "detached", "172.26.64.6", 0)

	lease("nomad", "172.26.64.5", "migrated\r\neth0", boot.Add(30*time.Minute))
	nat.AddContainer("nomad", "vanished", "172.26.64.99", 0)

	lease("other", "10.10.0.2", "x\r\neth1", boot.Add(-time.Minute))

	s := &reclaim.Sweeper{Env: reclaim.Env{Host: host, Netfilter: &netfilter.Cleaner{Tables: []netfilter.Table{nat}}}}
	return dataDir, s, nat
}

func golden(t *testing.T, name string, got []byte, dataDir string) {
	t.Helper()
	got = bytes.ReplaceAll(got, []byte(dataDir), []byte("DATADIR"))
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./pkg/operator -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the golden file:\n--- got\n%s\n--- want\n%s", name, got, want)
	}
}

func TestLeasesTableAndJSON(t *testing.T) {
	dataDir, s, _ := fixture(t)
	networks, skipped, err := Networks(dataDir, "")
	if err != nil || len(skipped) != 0 {
		t.Fatal(err, skipped)
	}
	if strings.Join(networks, ",") != "nomad,other" {
		t.Fatalf("networks = %v", networks)
	}
	var table, js, whole bytes.Buffer
	if err := Leases(s, scopeOf(dataDir, networks), NewLeasesTable(&table)); err != nil {
		t.Fatal(err)
	}
	golden(t, "leases.txt", table.Bytes(), dataDir)
	if err := Leases(s, scopeOf(dataDir, networks), NewLeasesJSON(&js, dataDir)); err != nil {
		t.Fatal(err)
	}
	golden(t, "leases.json", js.Bytes(), dataDir)
	// The streamed document is the one WriteJSON writes of the rows held.
	out := &LeasesOutput{DataDir: dataDir}
	if err := Leases(s, scopeOf(dataDir, networks), out); err != nil {
		t.Fatal(err)
	}
	if err := WriteJSON(&whole, out); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(js.Bytes(), whole.Bytes()) {
		t.Errorf("streamed leases --json differs from the document:\n%s\n---\n%s", js.Bytes(), whole.Bytes())
	}
}

func TestGCDryRunThenGC(t *testing.T) {
	dataDir, s, nat := fixture(t)
	networks, _, _ := Networks(dataDir, "nomad")
	before := tree(t, dataDir)

	dry, text, err := runGC(s, dataDir, networks, true, false)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "gc-dry-run.txt", text, dataDir)
	if after := tree(t, dataDir); after != before {
		t.Errorf("dry run changed files:\n%s\n---\n%s", before, after)
	}
	if !nat.Owns("nomad", "gone") {
		t.Error("dry run changed NAT rules")
	}

	done, _, err := runGC(s, dataDir, networks, false, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(done.Released) != len(dry.Released) {
		t.Errorf("gc released %d, dry run announced %d", len(done.Released), len(dry.Released))
	}
	for i := range done.Released {
		if done.Released[i].ContainerID != dry.Released[i].ContainerID {
			t.Errorf("release %d: %s, dry run said %s", i, done.Released[i].ContainerID, dry.Released[i].ContainerID)
		}
	}
	if nat.Owns("nomad", "gone") || !nat.Owns("nomad", "web") || !nat.Owns("nomad", "vanished") || !nat.Owns("nomad", "detached") {
		t.Error("gc released the wrong NAT rules (orphans stay without --orphan-rules; a detached attachment keeps its rules)")
	}
	if _, err := os.Stat(filepath.Join(dataDir, "nomad", "172.26.64.6")); err != nil {
		t.Errorf("gc released the lease of an attachment whose namespace a process still holds: %v", err)
	}
	again, _, err := runGC(s, dataDir, networks, false, false)
	if err != nil || len(again.Released) != 0 {
		t.Errorf("second gc = %+v, %v; want a no-op", again.Released, err)
	}
	withOrphans, _, err := runGC(s, dataDir, networks, false, true)
	if err != nil || len(withOrphans.Released) != 1 || nat.Owns("nomad", "vanished") {
		t.Errorf("gc --orphan-rules = %+v, %v", withOrphans.Released, err)
	}
}

// collector is a GCSink that keeps the document, and the text GCText
// writes for it.
type collector struct {
	out  GCOutput
	text *GCText
}

func (c *collector) Release(r GCRelease) {
	c.out.Released = append(c.out.Released, r)
	c.text.Release(r)
}

func (c *collector) End(problems *Problems) error {
	var err error
	if c.out.Problems, err = all(problems); err != nil {
		return err
	}
	return c.text.End(problems)
}

func runGC(s *reclaim.Sweeper, dataDir string, networks []string, dryRun, orphans bool) (*GCOutput, []byte, error) {
	var text bytes.Buffer
	c := &collector{out: GCOutput{DataDir: dataDir, DryRun: dryRun, Released: []GCRelease{}}, text: NewGCText(&text, dryRun)}
	err := GC(s, scopeOf(dataDir, networks), dryRun, orphans, nil, c)
	return &c.out, text.Bytes(), err
}

// The streamed `gc --json` is byte for byte the document WriteJSON writes
// for the same releases: its schema and layout stay as documented.
func TestGCJSONStreamsTheDocument(t *testing.T) {
	for _, n := range []int{0, 1, 3} {
		var problems []string
		if n == 3 {
			problems = []string{"nomad: lease <x> & \"y\""}
		}
		doc := GCOutput{DataDir: "/run/d\"ir", DryRun: n == 1, Released: []GCRelease{}, Problems: nonNil(problems)}
		var streamed, whole bytes.Buffer
		j := NewGCJSON(&streamed, doc.DataDir, doc.DryRun)
		for i := range n {
			r := GCRelease{Network: "nomad", ContainerID: fmt.Sprintf("c%d", i), IfName: "eth0", IPs: []string{"10.0.0.2"}, Reason: "gone", Removed: []string{"lease 10.0.0.2", "record"}}
			if i == 1 {
				r.IPs, r.Removed = []string{}, []string{}
			}
			doc.Released = append(doc.Released, r)
			j.Release(r)
		}
		spool := &Problems{}
		for _, p := range problems {
			spool.Add(p)
		}
		if err := j.End(spool); err != nil {
			t.Fatal(err)
		}
		if err := WriteJSON(&whole, doc); err != nil {
			t.Fatal(err)
		}
		if streamed.String() != whole.String() {
			t.Errorf("%d releases: streamed\n%s\nwant\n%s", n, streamed.String(), whole.String())
		}
	}
}

// The document of a gc or leases --json that could not start is the
// documented one, laid out as WriteJSON lays it out, empty, with why in
// "error" (escaped as every field is).
func TestJSONDocumentOfACommandThatCannotStart(t *testing.T) {
	why := errors.New("data dir: stat /run/d\"ir\x1b[2J: no such file or directory")
	var gc, leases, want bytes.Buffer
	if err := GCJSONFailed(&gc, "/run/d\"ir", true, why); err != nil {
		t.Fatal(err)
	}
	if err := WriteJSON(&want, struct {
		GCOutput
		Error string `json:"error"`
	}{GCOutput{DataDir: "/run/d\"ir", DryRun: true, Released: []GCRelease{}, Problems: []string{}}, why.Error()}); err != nil {
		t.Fatal(err)
	}
	if gc.String() != want.String() {
		t.Errorf("gc:\n%s\nwant\n%s", gc.String(), want.String())
	}
	want.Reset()
	if err := LeasesJSONFailed(&leases, "/run/d\"ir", why); err != nil {
		t.Fatal(err)
	}
	if err := WriteJSON(&want, struct {
		LeasesOutput
		Error string `json:"error"`
	}{LeasesOutput{DataDir: "/run/d\"ir", Leases: []Row{}, Problems: []string{}}, why.Error()}); err != nil {
		t.Fatal(err)
	}
	if leases.String() != want.String() {
		t.Errorf("leases:\n%s\nwant\n%s", leases.String(), want.String())
	}
	if strings.Contains(gc.String(), "\x1b") {
		t.Errorf("an escape reaches the output raw:\n%q", gc.String())
	}
}

func TestNetworksErrors(t *testing.T) {
	dir := t.TempDir()
	if _, _, err := Networks(filepath.Join(dir, "missing"), ""); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("missing data dir: %v", err)
	}
	file := filepath.Join(dir, "f")
	os.WriteFile(file, nil, 0o600)
	if _, _, err := Networks(file, ""); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("file as data dir: %v", err)
	}
	if _, _, err := Networks(dir, "../etc"); err == nil || !strings.Contains(err.Error(), "invalid characters") {
		t.Errorf("bad network name: %v", err)
	}
	if _, _, err := Networks(dir, "nope"); err == nil || !strings.Contains(err.Error(), "no leases or records") {
		t.Errorf("unknown network: %v", err)
	}
}

func tree(t *testing.T, root string) string {
	t.Helper()
	state, err := dirstate.Describe(root)
	if err != nil {
		t.Fatal(err)
	}
	return state
}

func TestNetworksRefusesSymlinkedRecordsDir(t *testing.T) {
	dataDir := t.TempDir()
	elsewhere := t.TempDir()
	if err := os.MkdirAll(filepath.Join(elsewhere, "nomad"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(elsewhere, filepath.Join(dataDir, ".nomad-bridge-cni")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Networks(dataDir, ""); err == nil || !strings.Contains(err.Error(), "symlink") {
		t.Errorf("Networks = %v, want a refusal of the symlink", err)
	}
}

// One network whose directory fails the check (a symlink planted in its
// place, a directory owned by someone else) is skipped, with why; the
// others are still listed, and swept. A network asked for by name fails.
func TestNetworksSkipsOnlyTheBadOne(t *testing.T) {
	dataDir, _, _ := fixture(t)
	// host-local's directory of "planted" is real; its record directory
	// is a symlink to elsewhere.
	if err := os.Mkdir(filepath.Join(dataDir, "planted"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dataDir, "planted", "lock"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(t.TempDir(), filepath.Join(dataDir, ".nomad-bridge-cni", "planted")); err != nil {
		t.Fatal(err)
	}
	networks, skipped, err := Networks(dataDir, "")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(networks, ",") != "nomad,other" || len(skipped) != 1 || !strings.Contains(skipped[0].Error(), "planted") || !strings.Contains(skipped[0].Error(), "symlink") {
		t.Errorf("networks %v, skipped %v; want nomad and other, and planted skipped as a symlink", networks, skipped)
	}
	if _, _, err := Networks(dataDir, "planted"); err == nil {
		t.Error("the bad network asked for by name did not fail")
	}
}

// A data dir given by mistake (/etc, /, a network's own directory) is
// refused: its directories are not host-local's, so none is a network and
// nothing is created in them; a network's own directory is named as such.
// An empty one holds nothing to do.
func TestNetworksOfAMistypedDataDir(t *testing.T) {
	etc := t.TempDir()
	for _, f := range []string{"ssh/sshd_config", "shadow", "default/grub", "network/interfaces"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(etc, f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(etc, f), []byte("SECRET\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := Networks(etc, ""); err == nil || !strings.Contains(err.Error(), "not a data dir") || strings.Contains(err.Error(), "SECRET") {
		t.Errorf("Networks(etc-like) = %v, want it refused as not a data dir", err)
	}
	if networks, _, err := Networks(t.TempDir(), ""); err != nil || len(networks) != 0 {
		t.Errorf("Networks(empty) = %v, %v; want nothing, and no error", networks, err)
	}
	net := filepath.Join(t.TempDir(), "nomad")
	if err := os.MkdirAll(net, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"lock", "10.0.0.2"} {
		if err := os.WriteFile(filepath.Join(net, f), []byte("c1\r\neth0"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := Networks(net, ""); err == nil || !strings.Contains(err.Error(), "one network") {
		t.Errorf("Networks(a network's directory) = %v, want it named as such", err)
	}
}

// More skipped files than Problems keeps in memory: the streamed
// `leases --json` still lists them all, in order, exactly as the document
// held whole would.
func TestLeasesJSONStreamsManyProblems(t *testing.T) {
	dataDir, s, _ := fixture(t)
	records := filepath.Join(dataDir, ".nomad-bridge-cni", "nomad")
	n := problemsInMemory*2 + 7
	for i := range n {
		if err := os.WriteFile(filepath.Join(records, fmt.Sprintf("planted-%05d@eth0", i)), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	networks, _, err := Networks(dataDir, "")
	if err != nil {
		t.Fatal(err)
	}
	var js, whole bytes.Buffer
	if err := Leases(s, scopeOf(dataDir, networks), NewLeasesJSON(&js, dataDir)); err != nil {
		t.Fatal(err)
	}
	out := &LeasesOutput{DataDir: dataDir}
	if err := Leases(s, scopeOf(dataDir, networks), out); err != nil {
		t.Fatal(err)
	}
	if len(out.Problems) != n {
		t.Fatalf("%d problems, want %d", len(out.Problems), n)
	}
	if err := WriteJSON(&whole, out); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(js.Bytes(), whole.Bytes()) {
		t.Error("streamed leases --json with spilled problems differs from the document held whole")
	}
}

// Problems spills past problemsInMemory and gives every problem back in
// order, newlines and all.
func TestProblemsSpill(t *testing.T) {
	p := &Problems{}
	defer p.Close()
	var want []string
	for i := range problemsInMemory + 500 {
		s := fmt.Sprintf("problem %d", i)
		if i%100 == 0 {
			s += "\nwith a newline"
		}
		want = append(want, s)
		p.Add(s)
	}
	got, err := all(p)
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("All = %d problems, %v; want %d in order", len(got), err, len(want))
	}
}

// Networks names the networks ipamdir.List finds under dataDir.
func Networks(dataDir, only string) ([]string, []error, error) {
	dirs, skipped, err := ipamdir.List(dataDir, only)
	var names []string
	for _, d := range dirs {
		names = append(names, d.Network)
	}
	return names, skipped, err
}

func scopeOf(dataDir string, networks []string) Scope {
	sc := Scope{DataDir: dataDir}
	for _, n := range networks {
		sc.Dirs = append(sc.Dirs, ipamdir.New(dataDir, n))
	}
	return sc
}

// gc runs what a CHECK runs: it migrates the network's legacy leases from
// the legacy dir its conflist names (a lease of this boot is copied in and
// recorded as migrated, one from before it goes), and remembers when its sweep ended, as CHECK does
// (the doc said so, the code did neither). A dry run does neither.
func TestGCMigratesAndRemembersItsSweepAsCHECKDoes(t *testing.T) {
	for _, dryRun := range []bool{true, false} {
		t.Run(fmt.Sprintf("dry-run=%v", dryRun), func(t *testing.T) {
			dataDir, s, _ := fixture(t)
			legacy := t.TempDir()
			legacyNet := ipamdir.New(legacy, "nomad")
			if err := os.MkdirAll(legacyNet.Leases(), 0o755); err != nil {
				t.Fatal(err)
			}
			for ip, mtime := range map[string]time.Time{"172.26.64.50": boot.Add(time.Hour), "172.26.64.51": boot.Add(-time.Hour)} {
				path := filepath.Join(legacyNet.Leases(), ip)
				if err := os.WriteFile(path, []byte("old-"+ip+"\r\neth0"), 0o600); err != nil {
					t.Fatal(err)
				}
				if err := os.Chtimes(path, mtime, mtime); err != nil {
					t.Fatal(err)
				}
			}
			d := ipamdir.New(dataDir, "nomad")
			sc := Scope{DataDir: dataDir, Dirs: []ipamdir.Dir{d}, LegacyDataDirs: map[string]string{"nomad": legacy}}
			if err := GC(s, sc, dryRun, false, nil, NewGCText(io.Discard, dryRun)); err != nil {
				t.Fatal(err)
			}
			_, movedErr := os.Stat(filepath.Join(d.Leases(), "172.26.64.50"))
			_, leftErr := os.Stat(filepath.Join(legacyNet.Leases(), "172.26.64.50"))
			_, oldErr := os.Stat(filepath.Join(legacyNet.Leases(), "172.26.64.51"))
			_, stampErr := os.Stat(d.Marker(ipamdir.LastSweepMarker))
			if dryRun {
				if movedErr == nil || leftErr != nil || oldErr != nil || stampErr == nil {
					t.Errorf("a dry run changed something: moved %v, left %v, old %v, stamp %v", movedErr, leftErr, oldErr, stampErr)
				}
				return
			}
			rec, err := records.NewStore(d).Read(records.Key{ContainerID: "old-172.26.64.50", IfName: "eth0"})
			if movedErr != nil || leftErr != nil || oldErr == nil || err != nil || rec == nil || rec.State != records.Migrated {
				t.Errorf("legacy leases not migrated: copied %v, legacy copy %v, from before the boot %v, record %+v %v", movedErr, leftErr, oldErr, rec, err)
			}
			if _, ok := s.LastSweep(d); stampErr != nil || !ok {
				t.Errorf("gc's sweep was not remembered: %v", stampErr)
			}
		})
	}
}

// A network whose releases kept firewall rules (another network leased
// the address) says how many, below the table; with --runtime too (Drift
// wraps the table).
func TestLeasesTableSaysWhatReleasesKept(t *testing.T) {
	dataDir, s, _ := fixture(t)
	d := ipamdir.New(dataDir, "nomad")
	if err := os.WriteFile(d.Marker(ipamdir.ReleasesMarker), []byte(`{"namespace-gone":3,"firewall-rules-kept":2}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, runtime := range []bool{false, true} {
		var table bytes.Buffer
		var sink LeasesSink = NewLeasesTable(&table)
		if runtime {
			sink = &Drift{Sink: sink, Runtime: "nomad", Listing: &runtimes.Listing{IDs: map[string]bool{}}, Note: io.Discard}
		}
		if err := Leases(s, scopeOf(dataDir, []string{"nomad", "other"}), sink); err != nil {
			t.Fatal(err)
		}
		want := "kept: nomad: the firewall rules of 2 released address(es), which another network leases"
		if !strings.Contains(table.String(), want) || strings.Contains(table.String(), "kept: other") {
			t.Errorf("runtime %v: leases table lacks %q (or names other):\n%s", runtime, want, table.String())
		}
	}
}

// LeasesOutput is the whole `leases --json` document, as a LeasesSink
// that holds it (LeasesJSON streams the same document).
type LeasesOutput struct {
	DataDir  string   `json:"dataDir"`
	Leases   []Row    `json:"leases"`
	Problems []string `json:"problems"`
}

func (o *LeasesOutput) Row(r Row)        { o.Leases = append(o.Leases, r) }
func (o *LeasesOutput) Kept(string, int) {}

func (o *LeasesOutput) End(problems *Problems) error {
	if o.Leases == nil {
		o.Leases = []Row{}
	}
	var err error
	o.Problems, err = all(problems)
	return err
}

// GCOutput is the whole `gc --json` document (GCJSON streams it).
type GCOutput struct {
	DataDir  string      `json:"dataDir"`
	DryRun   bool        `json:"dryRun"`
	Released []GCRelease `json:"released"`
	Problems []string    `json:"problems"`
}

// all is every problem of p, in order.
func all(p *Problems) ([]string, error) {
	out := []string{}
	err := p.Each(func(s string) { out = append(out, s) })
	return out, err
}

// What `leases` and `gc` print of a planted file (its name, a container ID
// or netns path in it) or of a process (its name) reaches the operator's
// terminal: a terminal's escape sequences there, or a newline that forges
// a line, are written as Go escapes, never raw (regression: they were
// printed as read).
func TestTextOutputEscapesWhatFilesAndProcessesSay(t *testing.T) {
	dataDir := t.TempDir()
	host := fakehost.New(boot)
	host.Clock = boot.Add(time.Hour)
	d := ipamdir.New(dataDir, "nomad")
	for _, dir := range []string{d.Leases(), d.Records()} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write := func(path, content string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(d.Leases(), "lock"), "")
	// A lease whose container ID is an escape sequence, from before this
	// boot: stale.
	write(filepath.Join(d.Leases(), "172.26.64.7"), "\x1b]0;owned\x07\r\neth0")
	if err := os.Chtimes(filepath.Join(d.Leases(), "172.26.64.7"), boot.Add(-time.Hour), boot.Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	// A record named by an escape sequence, its netns path one too, gone.
	store := records.NewStore(d)
	if err := store.Write(&records.Record{Version: records.FormatVersion, Network: "nomad", ContainerID: "\x1b[2J", IfName: "eth0",
		Netns: "/var/run/netns/\x1b[31m\u202e", NetnsID: sysinfo.NetnsID{Dev: 4, Ino: 7}, BootID: host.ID, Created: boot, State: records.Complete, IPs: []string{"172.26.64.8/20"}}); err != nil {
		t.Fatal(err)
	}
	// A detached one, held by a process whose name is an escape sequence.
	if err := store.Write(&records.Record{Version: records.FormatVersion, Network: "nomad", ContainerID: "held", IfName: "eth0",
		Netns: "/var/run/netns/held", NetnsID: sysinfo.NetnsID{Dev: 4, Ino: 8}, BootID: host.ID, Created: boot, State: records.Complete, IPs: []string{"172.26.64.9/20"}}); err != nil {
		t.Fatal(err)
	}
	host.Holders[sysinfo.NetnsID{Dev: 4, Ino: 8}] = []sysinfo.Holder{{PID: 4242, Command: "\x1b]2;x\x07"}}
	// Damaged files whose names forge a line, or carry C1 controls.
	write(filepath.Join(d.Records(), "x\nFORGED@eth0"), "{garbage")
	write(filepath.Join(d.Leases(), "bad\u009b5m\xff"), "x\r\neth0")
	s := &reclaim.Sweeper{Env: reclaim.Env{Host: host}}

	var table bytes.Buffer
	if err := Leases(s, scopeOf(dataDir, []string{"nomad"}), NewLeasesTable(&table)); err != nil {
		t.Fatal(err)
	}
	_, gc, err := runGC(s, dataDir, []string{"nomad"}, true, false)
	if err != nil {
		t.Fatal(err)
	}
	for name, out := range map[string]string{"leases": table.String(), "gc --dry-run": string(gc)} {
		t.Logf("%s:\n%s", name, out)
		if !utf8.ValidString(out) {
			t.Errorf("%s prints bytes that are not UTF-8", name)
		}
		if i := strings.IndexFunc(out, func(r rune) bool { return r != '\n' && !unicode.IsGraphic(r) }); i >= 0 {
			t.Errorf("%s prints %q raw", name, []rune(out[i:])[0])
		}
		for line := range strings.Lines(out) {
			if strings.HasPrefix(line, "FORGED") {
				t.Errorf("%s prints a line a file name forged: %q", name, line)
			}
		}
		for _, want := range []string{`\x1b`, `FORGED`} {
			if !strings.Contains(out, want) {
				t.Errorf("%s does not show %s", name, want)
			}
		}
	}
}

// `leases --json` is printed as the table is: what a planted lease names
// reaches a terminal escaped. encoding/json leaves C1 controls (U+009B is
// a CSI) and bidi overrides raw; they are written \u-escaped, and the
// document decodes to the same container ID.
func TestLeasesJSONEscapesWhatATerminalWouldObey(t *testing.T) {
	dataDir, s, _ := fixture(t)
	cid := "c\u202eevil\u009b31m"
	if err := os.WriteFile(filepath.Join(dataDir, "other", "10.0.0.99"), []byte(cid+"\r\neth0"), 0o600); err != nil {
		t.Fatal(err)
	}
	var js bytes.Buffer
	if err := Leases(s, scopeOf(dataDir, []string{"other"}), NewLeasesJSON(&js, dataDir)); err != nil {
		t.Fatal(err)
	}
	if bytes.ContainsFunc(js.Bytes(), func(r rune) bool { return !unicode.IsGraphic(r) && !unicode.IsSpace(r) }) {
		t.Errorf("leases --json prints raw control or format characters:\n%q", js.String())
	}
	var doc LeasesOutput
	if err := json.Unmarshal(js.Bytes(), &doc); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, js.String())
	}
	if !slices.ContainsFunc(doc.Leases, func(r Row) bool { return r.ContainerID == cid }) {
		t.Errorf("no row of %q in %+v", cid, doc.Leases)
	}
}
