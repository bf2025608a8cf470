package reclaim

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/containernetworking/plugins/pkg/utils"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/netfilter"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/records"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/sysinfo"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/dirstate"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/fakenat"
)

// failingTable is a nat table whose deletions fail, as when iptables is
// killed or refuses: what a release must survive; with listing, its
// listing fails too.
type failingTable struct {
	netfilter.Table
	listing bool
}

func (f failingTable) List(table string) ([]string, error) {
	if f.listing && table == "nat" {
		return nil, errors.New("iptables -S killed")
	}
	return f.Table.List(table)
}

func (failingTable) Delete(string, string, ...string) error   { return errors.New("iptables killed") }
func (failingTable) ClearAndDeleteChain(string, string) error { return errors.New("iptables killed") }

// markOwned makes the world's network the plugin's, as its first
// ADD does.
func (w *world) markOwned() {
	w.t.Helper()
	if err := writeMarker(w.dir(), ipamdir.OwnedMarker, []byte(w.dir().Network+"\n")); err != nil {
		w.t.Fatal(err)
	}
}

// The record goes last: when the NAT rules cannot go, or cannot even be
// listed, the lease and the record stay, so the next sweep finds the rules
// through them.
func TestSweepKeepsFilesWhenNATRulesCannotGo(t *testing.T) {
	for _, listing := range []bool{false, true} {
		t.Run(map[bool]string{false: "delete-fails", true: "listing-fails"}[listing], func(t *testing.T) {
			w := newWorld(t)
			w.container("gone", "10.0.0.3")
			delete(w.host.Namespaces, "/run/netns/gone")
			w.env.Netfilter.Tables = []netfilter.Table{failingTable{Table: w.nat, listing: listing}}
			w.sweeper.Env = w.env

			if _, err := w.sweeper.Sweep(Request{Dir: w.dir()}); err == nil {
				t.Error("a sweep whose NAT release failed reports no error")
			}
			if !w.hasRecord("gone") || len(w.leases()) != 1 {
				t.Fatalf("NAT release failed, but record (%v) or lease (%v) went", w.hasRecord("gone"), w.leases())
			}

			w.env.Netfilter.Tables = []netfilter.Table{w.nat}
			w.sweeper.Env = w.env
			rep := w.sweep(Request{})
			if w.hasRecord("gone") || len(w.leases()) != 0 || w.nat.Owns(net1, "gone") {
				t.Errorf("second sweep left record %v, leases %v, NAT %v", w.hasRecord("gone"), w.leases(), w.nat.Chains)
			}
			if len(rep.Releases) != 1 {
				t.Fatalf("releases %v, want one", rep.Releases)
			}
			equal(t, "what went, in order", rep.Releases[0].What, []string{"lease 10.0.0.3", "jump in POSTROUTING", "chain " + utils.FormatChainName(net1, "gone"), "record"})
		})
	}
}

// NAT rules whose container has neither record nor lease (a sweep killed
// between them by an earlier version, a bare bridge run) go with every
// sweep of a network proved the plugin's, and with no sweep of one that
// is not (a wrong, new or empty data dir).
func TestOrphanRulesGoOnlyFromAnOwnedNetwork(t *testing.T) {
	w := newWorld(t)
	w.container("live", "10.0.0.2")
	w.nat.AddContainer(net1, "orphan", "10.0.0.9", 8080)

	rep := w.sweep(Request{})
	if !w.nat.Owns(net1, "orphan") || len(rep.OrphanRules) != 0 {
		t.Fatalf("a network not proved the plugin's lost orphan rules: %v", rep.OrphanRules)
	}

	w.markOwned()
	rep = w.sweep(Request{})
	equal(t, "orphans", rep.OrphanRules, []string{"orphan"})
	if w.nat.Owns(net1, "orphan") || !w.nat.Owns(net1, "live") {
		t.Errorf("after the sweep of an owned network: %v", w.nat.Chains)
	}
}

// A container with a lease in the legacy directory (still added through
// bare bridge) or with a record that cannot be read is no orphan.
func TestOrphanRulesKeptForLegacyLeasesAndDamagedRecords(t *testing.T) {
	w := newWorld(t)
	w.markOwned()
	legacy := t.TempDir()
	if err := os.MkdirAll(filepath.Join(legacy, net1), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(legacy, net1, "10.0.0.7"), []byte("bare\r\neth0"), 0o600); err != nil {
		t.Fatal(err)
	}
	w.nat.AddContainer(net1, "bare", "10.0.0.7", 0)
	w.nat.AddContainer(net1, "damaged", "10.0.0.8", 0)
	w.nat.AddContainer(net1, "orphan", "10.0.0.9", 0)
	if err := os.WriteFile(filepath.Join(w.dir().Records(), "damaged@eth0"), []byte("{garbage"), 0o600); err != nil {
		t.Fatal(err)
	}

	rep := w.sweep(Request{LegacyDataDir: legacy})
	equal(t, "orphans", rep.OrphanRules, []string{"orphan"})
	if !w.nat.Owns(net1, "bare") || !w.nat.Owns(net1, "damaged") || w.nat.Owns(net1, "orphan") {
		t.Errorf("NAT after the sweep: %v", w.nat.Chains)
	}
}

// A failed ADD leaves nothing: host-local may keep a reservation it could
// not finish (full tmpfs), and Abort releases it before the record. Its
// lease is written after the pending record, as host-local writes it (a
// lease older than the record is an earlier attachment's:
// ranIntoEarlier), or within the same tick of the kernel's file clock,
// which gives both the same mtime: that one is the ADD's too.
func TestAbortReleasesWhatTheFailedADDLeft(t *testing.T) {
	for _, when := range []string{"later", "same-tick"} {
		t.Run(when, func(t *testing.T) {
			w := newWorld(t)
			w.container("other", "10.0.0.2")
			w.host.Namespaces["/run/netns/x"] = sysinfo.NetnsID{Dev: 4, Ino: 1}
			add, err := w.attach.BeginAdd(w.dir(), records.Key{ContainerID: "x", IfName: "eth0"}, "/run/netns/x")
			if err != nil {
				t.Fatal(err)
			}
			written := time.Now()
			if when == "same-tick" {
				fi, err := add.LockFile.Stat()
				if err != nil {
					t.Fatal(err)
				}
				written = fi.ModTime()
			}
			w.lease("10.0.0.4", "x\r\neth0", written)
			w.nat.AddContainer(net1, "x", "10.0.0.4", 0)
			if err := add.Abort(); err != nil {
				t.Fatal(err)
			}
			equal(t, "leases", w.leases(), []string{"10.0.0.2"})
			if w.hasRecord("x") || w.nat.Owns(net1, "x") || !w.nat.Owns(net1, "other") {
				t.Errorf("after Abort: record %v, NAT %v", w.hasRecord("x"), w.nat.Chains)
			}
		})
	}
}

// racingTable runs beforeList once, at the first listing: an ADD that
// starts while a sweep walks the records, writes its record after the
// walk passed it and has bridge make its rules before the sweep lists
// them.
type racingTable struct {
	netfilter.Table
	beforeList func()
}

func (r *racingTable) List(table string) ([]string, error) {
	if r.beforeList != nil && table == "nat" {
		r.beforeList()
		r.beforeList = nil
	}
	return r.Table.List(table)
}

// The rules of an ADD that began after the sweep read the records are no
// orphans: its record was written before its delegate made them, so the
// sweep reads the records again after listing the rules.
func TestOrphanRulesOfAnADDThatBeganDuringTheSweepAreKept(t *testing.T) {
	w := newWorld(t)
	w.markOwned()
	w.container("gone", "10.0.0.3")
	delete(w.host.Namespaces, "/run/netns/gone")
	w.nat.AddContainer(net1, "gone", "10.0.0.3", 0)
	w.nat.AddContainer(net1, "orphan", "10.0.0.9", 0)
	w.host.Namespaces["/run/netns/racer"] = sysinfo.NetnsID{Dev: 4, Ino: 77}
	var add *PendingAdd
	w.env.Netfilter.Tables = []netfilter.Table{&racingTable{Table: w.nat, beforeList: func() {
		var err error
		add, err = w.attach.BeginAdd(w.dir(), records.Key{ContainerID: "racer", IfName: "eth0"}, "/run/netns/racer")
		if err != nil {
			t.Fatal(err)
		}
		w.nat.AddContainer(net1, "racer", "10.0.0.4", 8080)
	}}}
	w.sweeper.Env = w.env

	rep := w.sweep(Request{})
	if add == nil {
		t.Fatal("the sweep listed no NAT rules")
	}
	defer add.Close()
	equal(t, "orphans", rep.OrphanRules, []string{"orphan"})
	if !w.nat.Owns(net1, "racer") {
		t.Errorf("the sweep released the rules of an ADD under way: %v", w.nat.Chains)
	}
	if w.nat.Owns(net1, "gone") || w.nat.Owns(net1, "orphan") {
		t.Errorf("stale and orphan rules left: %v", w.nat.Chains)
	}
}

// bridge's nftables ipMasq rules of attachments the network holds nothing
// of go with the sweep of an owned network, as iptables orphans do; those
// of a live, a damaged, a legacy and a just-begun attachment stay.
func TestNFTablesOrphanRules(t *testing.T) {
	w := newWorld(t)
	w.markOwned()
	w.container("live", "10.0.0.2")
	legacy := t.TempDir()
	if err := os.MkdirAll(filepath.Join(legacy, net1), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(legacy, net1, "10.0.0.7"), []byte("bare\r\neth0"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(w.dir().Records(), "damaged@eth0"), []byte("{garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	w.host.Namespaces["/run/netns/racer"] = sysinfo.NetnsID{Dev: 4, Ino: 77}
	nft := fakenat.NewNFT()
	for _, cid := range []string{"live", "bare", "damaged", "racer", "orphan"} {
		nft.Add(net1, cid, "eth0")
	}
	nft.Add("other", "orphan", "eth0") // another network's: never touched
	var add *PendingAdd
	nft.OnList = func() {
		if add == nil {
			// The racer's ADD writes its record after its rules were
			// listed (and after the sweep's walk would be as good).
			var err error
			if add, err = w.attach.BeginAdd(w.dir(), records.Key{ContainerID: "racer", IfName: "eth0"}, "/run/netns/racer"); err != nil {
				t.Fatal(err)
			}
		}
	}
	w.env.Netfilter.NFTables = nft
	w.sweeper.Env = w.env

	dry := w.sweep(Request{LegacyDataDir: legacy, DryRun: true})
	if add == nil {
		t.Fatal("the sweep did not list nftables rules")
	}
	defer add.Close()
	equal(t, "orphans (dry run)", dry.OrphanRules, []string{"orphan"})
	if len(nft.Released) != 0 {
		t.Errorf("a dry run released %v", nft.Released)
	}
	rep := w.sweep(Request{LegacyDataDir: legacy})
	equal(t, "orphans", rep.OrphanRules, []string{"orphan"})
	if len(nft.Rules) != 5 || nft.Has(net1, "orphan", "eth0") || !nft.Has("other", "orphan", "eth0") {
		t.Errorf("rules left: %v, want those of live, bare, damaged and racer, and the other network's", nft.Rules)
	}
	if len(rep.Releases) != 1 || !rep.Releases[0].Orphan || rep.Releases[0].Key.ContainerID != "orphan" || rep.Releases[0].Key.IfName != "eth0" ||
		strings.Join(rep.Releases[0].What, ",") != "nftables ipMasq rules "+net1+"|eth0:orphan" {
		t.Errorf("releases %+v, want the orphan's, naming its rules", rep.Releases)
	}
}

// A network not proved the plugin's has no nftables orphans.
func TestNFTablesOrphanRulesOnlyFromAnOwnedNetwork(t *testing.T) {
	w := newWorld(t)
	w.container("live", "10.0.0.2")
	nft := fakenat.NewNFT()
	nft.Add(net1, "orphan", "eth0")
	w.env.Netfilter.NFTables = nft
	w.sweeper.Env = w.env
	if rep := w.sweep(Request{}); len(rep.OrphanRules) != 0 || !nft.Has(net1, "orphan", "eth0") {
		t.Errorf("orphans %v, rules %v: nftables orphans taken on a network that is not the plugin's", rep.OrphanRules, nft.Rules)
	}
	if nft.Lists != 0 {
		t.Errorf("nftables listed %d times on a network that is not the plugin's with nothing stale", nft.Lists)
	}
}

// A sweep logs at most maxProblemLines lines about the files it skipped,
// then how many more there were; its report keeps them all.
func TestSweepSummarisesSkippedFiles(t *testing.T) {
	w := newWorld(t)
	w.container("live", "10.0.0.2")
	for i := range 100 {
		if err := os.WriteFile(filepath.Join(w.dir().Records(), fmt.Sprintf("damaged-%d@eth0", i)), []byte("{garbage"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	w.log.Reset()
	rep := w.sweep(Request{})
	if len(rep.Problems) != 100 {
		t.Errorf("report has %d problems, want 100", len(rep.Problems))
	}
	if lines := strings.Count(w.log.String(), "skipped: "); lines != maxProblemLines || !strings.Contains(w.log.String(), "skipped 80 more") {
		t.Errorf("log has %d skipped lines, want %d and a summary of 80 more:\n%s", lines, maxProblemLines, w.log.String())
	}
}

// A pending ADD whose plugin was killed, and whose delegate (which holds
// the record open and locked) runs on past the record's deadline, is ended
// by the next sweep: what holds the record is killed, and the attachment is
// then judged like any dead ADD's. Before its deadline it is left alone,
// and a dry run never kills.
func TestSweepEndsTheOverdueDelegatesOfAKilledADD(t *testing.T) {
	w := newWorld(t)
	w.host.Namespaces["/run/netns/x"] = sysinfo.NetnsID{Dev: 4, Ino: 71}
	attacher := &Attacher{Env: w.env, AddBound: time.Minute}
	add, err := attacher.BeginAdd(w.dir(), records.Key{ContainerID: "x", IfName: "eth0"}, "/run/netns/x")
	if err != nil {
		t.Fatal(err)
	}
	defer add.Close()
	if add.Record.Deadline == 0 {
		t.Fatal("the pending record has no deadline")
	}
	w.lease("10.0.0.4", "x\r\neth0", bootTime.Add(time.Hour))
	// The plugin is killed; its delegate runs on, holding the record.
	delete(w.host.Processes, os.Getpid())
	path := records.NewStore(w.dir()).PathOf(add.Record.Key())
	w.host.LockHolders = map[string][]int{path: {4711}}
	w.host.OnKill = func(string) { add.Close() }
	delete(w.host.Namespaces, "/run/netns/x")

	w.sweep(Request{})
	if len(w.host.Killed) != 0 || !w.hasRecord("x") {
		t.Fatalf("before its deadline: killed %v, record kept %v", w.host.Killed, w.hasRecord("x"))
	}
	w.host.Clock = w.host.Clock.Add(2 * time.Minute)
	rep := w.sweep(Request{DryRun: true})
	if len(w.host.Killed) != 0 || rep.Attachments[0].Verdict.State != Pending || !strings.Contains(rep.Attachments[0].Verdict.Reason, "overdue") {
		t.Fatalf("a dry run past the deadline: killed %v, verdict %+v", w.host.Killed, rep.Attachments[0].Verdict)
	}
	w.sweep(Request{})
	if len(w.host.Killed) != 1 || w.host.Killed[0] != 4711 {
		t.Errorf("killed %v, want the delegate 4711", w.host.Killed)
	}
	if w.hasRecord("x") || len(w.leases()) != 0 {
		t.Errorf("after its delegate was ended: record %v, leases %v; want both gone (its namespace is)", w.hasRecord("x"), w.leases())
	}
	if !strings.Contains(w.log.String(), "ran past the deadline") {
		t.Errorf("the kill was not logged:\n%s", w.log.String())
	}
}

// A sweep of another data dir, even told to take NAT rules nobody holds
// there for orphans (gc --orphan-rules), keeps those of a container that
// has a record or a lease of the network in the plugin's other data dirs:
// they are a live container's of the real data dir.
func TestOrphanRulesKeptForContainersOfOtherDataDirs(t *testing.T) {
	real := newWorld(t)
	real.container("recorded", "10.0.0.2")
	real.lease("10.0.0.3", "leased\r\neth0", bootTime.Add(time.Minute))
	wrong := newWorld(t)
	if err := os.MkdirAll(wrong.dir().Leases(), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, cid := range []string{"recorded", "leased", "orphan"} {
		wrong.nat.AddContainer(net1, cid, "10.0.0.9", 0)
	}
	rep := wrong.sweep(Request{Orphans: true, OtherDataDirs: []string{real.dataDir}})
	equal(t, "orphans", rep.OrphanRules, []string{"orphan"})
	if !wrong.nat.Owns(net1, "recorded") || !wrong.nat.Owns(net1, "leased") || wrong.nat.Owns(net1, "orphan") {
		t.Errorf("NAT after the sweep: %v", wrong.nat.Chains)
	}
}

// A FIFO planted where the sweep looks for who else holds a container
// (the legacy directory's network, another data dir's leases or records)
// never hangs it, under host-local's lock: the orphans' rules are kept,
// since nothing could be read there, and the sweep says why (regression:
// each was opened blocking, and hung CHECK, gc and leases for ever).
func TestPlantedFIFOsWhereHoldersAreReadNeverHang(t *testing.T) {
	for _, where := range []string{"legacy", "other-leases", "other-records"} {
		t.Run(where, func(t *testing.T) {
			w := newWorld(t)
			w.markOwned()
			w.nat.AddContainer(net1, "orphan", "10.0.0.9", 0)
			legacy, other := t.TempDir(), t.TempDir()
			fifo := map[string]string{"legacy": ipamdir.New(legacy, net1).Leases(), "other-leases": ipamdir.New(other, net1).Leases(),
				"other-records": ipamdir.New(other, net1).Records()}[where]
			dirstate.PlantFIFO(t, fifo) // a sweep blocked in open(2) is let go at the end
			var problems []string
			done := make(chan *swept, 1)
			go func() {
				done <- w.sweep(Request{LegacyDataDir: legacy, OtherDataDirs: []string{other}, Problem: func(err error) { problems = append(problems, err.Error()) }})
			}()
			select {
			case rep := <-done:
				if len(rep.OrphanRules) != 0 || !w.nat.Owns(net1, "orphan") {
					t.Errorf("orphans %v released although %s could not be read", rep.OrphanRules, fifo)
				}
				if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, fifo) }) {
					t.Errorf("problems %q do not name %s", problems, fifo)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("the sweep hangs on a FIFO at %s", fifo)
			}
		})
	}
}

// What the plugin logs of a planted file's name (the runtime's log, and
// the entry's log file, take each line as one event) is one line of
// graphic characters: a newline in the name cannot forge a release in
// the log, nor an escape sequence reach a terminal (regression: the name
// was logged raw).
func TestLogLinesCannotBeForged(t *testing.T) {
	w := newWorld(t)
	w.container("live", "10.0.0.2")
	forged := "x\nnomad-bridge-cni: nomad: released y-eth0 10.0.0.3: \x1b[2J@eth0"
	if err := os.WriteFile(filepath.Join(w.dir().Records(), forged), []byte("{garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	w.sweep(Request{})
	log := w.log.String()
	if !strings.Contains(log, "skipped") {
		t.Fatalf("the damaged record was not logged:\n%s", log)
	}
	for line := range strings.Lines(log) {
		if !strings.HasPrefix(line, "nomad-bridge-cni: nomad: ") || strings.HasPrefix(line, "nomad-bridge-cni: nomad: released") {
			t.Errorf("a line the planted name forged: %q", line)
		}
		if i := strings.IndexFunc(strings.TrimSuffix(line, "\n"), func(r rune) bool { return !unicode.IsGraphic(r) }); i >= 0 {
			t.Errorf("logged raw: %q", line)
		}
	}
}
