package reclaim

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/netfilter"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/records"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/sysinfo"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/dirstate"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/fakehost"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/fakenat"
)

const net1 = "nomad"

var bootTime = time.Unix(1764660000, 0)

// world is a data directory, a host and a nat table, all fake but in the
// real formats: leases are host-local files, records are ours.
type world struct {
	t       *testing.T
	dataDir string
	host    *fakehost.Host
	nat     *fakenat.Table
	log     *bytes.Buffer
	env     Env
	sweeper *Sweeper
	attach  *Attacher
	migrate *Migrator
	nextIno uint64
}

func newWorld(t *testing.T) *world {
	t.Helper()
	w := &world{t: t, dataDir: tmpfsDir(t), host: fakehost.New(bootTime), nat: fakenat.New(), log: &bytes.Buffer{}, nextIno: 1000}
	w.env = Env{Host: w.host, Netfilter: &netfilter.Cleaner{Tables: []netfilter.Table{w.nat}}, Log: w.log}
	w.sweeper, w.attach, w.migrate = &Sweeper{w.env}, &Attacher{Env: w.env}, &Migrator{w.env}
	if err := os.MkdirAll(filepath.Join(w.dataDir, net1), 0o755); err != nil {
		t.Fatal(err)
	}
	// host-local creates its lock file on first use; a network directory
	// always has one.
	if err := os.WriteFile(filepath.Join(w.dataDir, net1, "lock"), nil, 0o750); err != nil {
		t.Fatal(err)
	}
	return w
}

// lease writes a host-local lease file with the given mtime.
func (w *world) lease(ip, content string, mtime time.Time) {
	w.t.Helper()
	path := filepath.Join(w.dataDir, net1, ip)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		w.t.Fatal(err)
	}
	if err := os.Chtimes(path, mtime, mtime); err != nil {
		w.t.Fatal(err)
	}
}

// container creates a live namespace at /run/netns/<cid>, its lease, its
// complete record and its NAT rules, as an ADD through the plugin would.
func (w *world) container(cid, ip string) {
	w.t.Helper()
	ns := "/run/netns/" + cid
	w.nextIno++
	w.host.Namespaces[ns] = sysinfo.NetnsID{Dev: 4, Ino: w.nextIno}
	w.lease(ip, cid+"\r\neth0", bootTime.Add(time.Minute))
	w.record(&records.Record{ContainerID: cid, IfName: "eth0", Netns: ns, NetnsID: w.host.Namespaces[ns], BootID: w.host.ID, State: records.Complete, IPs: []string{ip + "/24"}})
	w.nat.AddContainer(net1, cid, ip, 0)
}

func (w *world) record(r *records.Record) {
	w.t.Helper()
	r.Version, r.Network = records.FormatVersion, net1
	if r.Created.IsZero() {
		r.Created = bootTime.Add(time.Minute)
	}
	if err := records.NewStore(w.dir()).Write(r); err != nil {
		w.t.Fatal(err)
	}
}

// dir is the world's network under its data directory.
func (w *world) dir() ipamdir.Dir { return ipamdir.New(w.dataDir, net1) }

// swept is a sweep's report with what it showed on the way: every
// attachment it judged and every release, in the order it made them.
type swept struct {
	*Report
	Attachments []*Attachment
	Releases    []Release
	Problems    []error
}

// sweep runs a sweep and collects what it streams, checking that it shows
// each attachment once and reports as many releases as it counts.
func (w *world) sweep(req Request) *swept {
	w.t.Helper()
	req.Dir = w.dir()
	out := &swept{}
	visited := map[records.Key]bool{}
	req.Visit = func(a *Attachment) {
		if visited[a.Key] {
			w.t.Errorf("attachment %s visited twice", a.Key)
		}
		visited[a.Key] = true
		out.Attachments = append(out.Attachments, a)
	}
	req.Released = func(rel Release) { out.Releases = append(out.Releases, rel) }
	problem := req.Problem
	req.Problem = func(err error) {
		out.Problems = append(out.Problems, err)
		if problem != nil {
			problem(err)
		}
	}
	rep, err := w.sweeper.Sweep(req)
	if err != nil {
		w.t.Fatalf("Sweep: %v", err)
	}
	if rep.Released != len(out.Releases) {
		w.t.Errorf("report counts %d releases, %d were shown", rep.Released, len(out.Releases))
	}
	out.Report = rep
	return out
}

func (w *world) leases() []string {
	w.t.Helper()
	entries, err := os.ReadDir(filepath.Join(w.dataDir, net1))
	if err != nil {
		w.t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if e.Name() != "lock" && !strings.HasPrefix(e.Name(), "last_reserved_ip") {
			out = append(out, e.Name())
		}
	}
	sort.Strings(out)
	return out
}

func (w *world) hasRecord(cid string) bool {
	r, err := records.NewStore(w.dir()).Read(records.Key{ContainerID: cid, IfName: "eth0"})
	return err == nil && r != nil
}

func verdicts(rep *swept) map[string]State {
	out := map[string]State{}
	for _, a := range rep.Attachments {
		out[a.Key.ContainerID] = a.Verdict.State
	}
	return out
}

func equal(t *testing.T, what string, got, want []string) {
	t.Helper()
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("%s = %v, want %v", what, got, want)
	}
}

func TestSweepReleasesOnlyProvedStaleAttachments(t *testing.T) {
	w := newWorld(t)
	w.container("live", "10.0.0.2")
	w.container("gone", "10.0.0.3")
	delete(w.host.Namespaces, "/run/netns/gone")
	w.container("replaced", "10.0.0.4")
	w.host.Namespaces["/run/netns/replaced"] = sysinfo.NetnsID{Dev: 4, Ino: 9999}
	w.container("unmounted", "10.0.0.5")
	delete(w.host.Namespaces, "/run/netns/unmounted")
	w.host.NotNetns["/run/netns/unmounted"] = true
	w.container("oldboot", "10.0.0.6")
	w.record(&records.Record{ContainerID: "oldboot", IfName: "eth0", Netns: "/run/netns/oldboot", NetnsID: w.host.Namespaces["/run/netns/oldboot"], BootID: "boot-0", State: records.Complete})
	w.lease("10.0.0.7", "norecord-old\r\neth0", bootTime.Add(-time.Hour))
	w.lease("10.0.0.8", "norecord-new\r\neth0", bootTime.Add(time.Second))
	w.nat.AddContainer(net1, "norecord-new", "10.0.0.8", 0)

	rep := w.sweep(Request{})

	want := map[string]State{"live": Live, "gone": Stale, "replaced": Stale, "unmounted": Stale, "oldboot": Stale, "norecord-old": Stale, "norecord-new": Unknown}
	if got := verdicts(rep); len(got) != len(want) {
		t.Errorf("verdicts = %v, want %v", got, want)
	} else {
		for cid, st := range want {
			if got[cid] != st {
				t.Errorf("%s: %s, want %s", cid, got[cid], st)
			}
		}
	}
	equal(t, "leases left", w.leases(), []string{"10.0.0.2", "10.0.0.8"})
	for _, cid := range []string{"gone", "replaced", "unmounted", "oldboot"} {
		if w.hasRecord(cid) {
			t.Errorf("record of stale %s kept", cid)
		}
		if w.nat.Owns(net1, cid) {
			t.Errorf("NAT rules of stale %s kept", cid)
		}
	}
	if !w.hasRecord("live") || !w.nat.Owns(net1, "live") || !w.nat.Owns(net1, "norecord-new") {
		t.Error("a live or unknown attachment lost its record or rules")
	}
	if len(rep.Releases) != 5 {
		t.Errorf("released %d: %v", len(rep.Releases), rep.Releases)
	}
	for _, reason := range []string{"namespace /run/netns/gone is gone", "was replaced", "no longer a network namespace", "earlier boot", "before this boot"} {
		if !strings.Contains(w.log.String(), reason) {
			t.Errorf("log does not say %q:\n%s", reason, w.log)
		}
	}
	if n := strings.Count(w.log.String(), "\n"); n != 5 {
		t.Errorf("log has %d lines, want one per release:\n%s", n, w.log)
	}

	// A second sweep has nothing to do, and says nothing.
	w.log.Reset()
	w.nat.Calls = nil
	rep = w.sweep(Request{})
	if len(rep.Releases) != 0 || w.log.Len() != 0 || len(w.nat.Calls) != 0 {
		t.Errorf("second sweep: released %v, log %q, nat calls %v", rep.Releases, w.log, w.nat.Calls)
	}
}

func TestSweepKeepsADDInFlight(t *testing.T) {
	w := newWorld(t)
	// A pending record by a running process whose namespace check would
	// fail: the ADD is still in flight and must be left alone.
	w.host.Processes[777] = 55
	w.record(&records.Record{ContainerID: "inflight", IfName: "eth0", Netns: "/run/netns/missing", BootID: w.host.ID, State: records.Started, PID: 777, PIDStart: 55})
	w.lease("10.0.0.2", "inflight\r\neth0", bootTime.Add(time.Minute))
	// The same, but the pid was reused by another process: the ADD died.
	w.host.Processes[778] = 99
	w.record(&records.Record{ContainerID: "crashed", IfName: "eth0", Netns: "/run/netns/missing2", BootID: w.host.ID, State: records.Started, PID: 778, PIDStart: 56})
	w.lease("10.0.0.3", "crashed\r\neth0", bootTime.Add(time.Minute))

	rep := w.sweep(Request{})
	v := verdicts(rep)
	if v["inflight"] != Pending || v["crashed"] != Stale {
		t.Errorf("verdicts = %v", v)
	}
	equal(t, "leases left", w.leases(), []string{"10.0.0.2"})
	if !w.hasRecord("inflight") || w.hasRecord("crashed") {
		t.Error("wrong records removed")
	}
}

func TestGCVerbKeepsExactlyTheValidList(t *testing.T) {
	w := newWorld(t)
	w.container("a", "10.0.0.2")
	w.container("b", "10.0.0.3")
	w.lease("10.0.0.4", "legacyformat", bootTime.Add(time.Minute)) // pre-ifname lease of "b"? no: of "legacyformat"
	w.lease("10.0.0.5", "b", bootTime.Add(time.Minute))            // pre-ifname lease of b: valid through b's ID
	w.nat.AddContainer(net1, "orphan", "10.0.0.9", 8080)           // rules with no lease, no record

	rep := w.sweep(Request{GC: true, Valid: []types.GCAttachment{{ContainerID: "b", IfName: "eth0"}}, Orphans: true})

	equal(t, "leases left", w.leases(), []string{"10.0.0.3", "10.0.0.5"})
	if w.hasRecord("a") || !w.hasRecord("b") {
		t.Error("records: a should be gone, b kept")
	}
	if w.nat.Owns(net1, "a") || w.nat.Owns(net1, "orphan") || !w.nat.Owns(net1, "b") {
		t.Errorf("nat after GC: %v", w.nat.Chains)
	}
	equal(t, "orphan rules", rep.OrphanRules, []string{"orphan"})
}

func TestGCWithoutListReleasesEverything(t *testing.T) {
	w := newWorld(t)
	w.container("a", "10.0.0.2")
	w.lease("10.0.0.3", "norecord\r\neth0", bootTime.Add(time.Minute))
	w.sweep(Request{GC: true})
	if got := w.leases(); len(got) != 0 {
		t.Errorf("leases left after GC with no valid list: %v", got)
	}
}

func TestDryRunChangesNothing(t *testing.T) {
	w := newWorld(t)
	w.container("gone", "10.0.0.3")
	delete(w.host.Namespaces, "/run/netns/gone")
	w.nat.AddContainer(net1, "orphan", "10.0.0.9", 8080)
	before := snapshotDir(t, w.dataDir)
	natBefore := len(w.nat.Chains)

	rep := w.sweep(Request{DryRun: true, Orphans: true})

	if after := snapshotDir(t, w.dataDir); after != before {
		t.Errorf("dry run changed the data dir:\n%s\n---\n%s", before, after)
	}
	if len(w.nat.Chains) != natBefore || !w.nat.Owns(net1, "gone") {
		t.Error("dry run changed the nat table")
	}
	if len(rep.Releases) != 2 {
		t.Fatalf("dry run reports %v, want gone and orphan", rep.Releases)
	}
	what := strings.Join(rep.Releases[0].What, ",")
	for _, want := range []string{"lease 10.0.0.3", "jump in POSTROUTING", "chain CNI-", "record"} {
		if !strings.Contains(what, want) {
			t.Errorf("dry run for gone says %q, missing %q", what, want)
		}
	}
}

func TestDamagedFilesAreSkippedAndKept(t *testing.T) {
	w := newWorld(t)
	w.container("gone", "10.0.0.3")
	delete(w.host.Namespaces, "/run/netns/gone")
	w.lease("10.0.0.11", "bad id \r\neth0", bootTime.Add(-time.Hour)) // not a valid lease
	w.lease("10.0.0.12", strings.Repeat("x", 5000), bootTime.Add(-time.Hour))
	if err := os.Mkdir(filepath.Join(w.dataDir, net1, "10.0.0.13"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(w.dataDir, net1, "10.0.0.14")); err != nil {
		t.Fatal(err)
	}
	recDir := w.dir().Records()
	if err := os.WriteFile(filepath.Join(recDir, "junk@eth0"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}

	rep := w.sweep(Request{})

	equal(t, "leases left", w.leases(), []string{"10.0.0.11", "10.0.0.12", "10.0.0.13", "10.0.0.14"})
	if len(rep.Problems) != 5 {
		t.Errorf("problems = %d: %v", len(rep.Problems), rep.Problems)
	}
	if _, err := os.Stat("/etc/passwd"); err != nil {
		t.Errorf("symlink target touched: %v", err)
	}
}

// host-local creates a lease, then writes it, both under its lock: an
// empty lease a sweep finds under that lock is a write whose host-local
// was killed, and no DEL can ever release it (it names nobody). A sweep
// releases it, unless a record names its address, and a dry run only
// reports it (regression: every gc said "skipped: …: empty" and the address
// was lost until the next boot).
func TestEmptyLeaseIsReleased(t *testing.T) {
	for name, req := range map[string]Request{"check": {}, "gc-verb": {GC: true}, "dry-run": {DryRun: true}} {
		t.Run(name, func(t *testing.T) {
			w := newWorld(t)
			w.container("live", "10.0.0.3")
			w.lease("10.0.0.3", "", bootTime.Add(time.Minute)) // the live record names it
			w.lease("10.0.0.10", "", bootTime.Add(time.Minute))
			if req.GC {
				req.Valid = []types.GCAttachment{{ContainerID: "live", IfName: "eth0"}}
			}
			rep := w.sweep(req)
			if len(rep.Releases) != 1 || rep.Releases[0].IPs[0] != "10.0.0.10" {
				t.Errorf("releases = %v, want the empty lease's", rep.Releases)
			}
			want := []string{"10.0.0.3"}
			if req.DryRun {
				want = []string{"10.0.0.10", "10.0.0.3"}
			}
			equal(t, "leases left", w.leases(), want)
			if !req.DryRun && !strings.Contains(w.log.String(), "empty lease: its host-local died") {
				t.Errorf("log does not say so: %q", w.log)
			}
			// A sweep that reads a live record's leases reports the
			// empty one (the common CHECK sweep only checks it is there).
			if (req.GC || req.DryRun) && !strings.Contains(fmt.Sprint(rep.Problems), "10.0.0.3: empty") {
				t.Errorf("the empty lease a record names is not reported: %v", rep.Problems)
			}
		})
	}
}

func TestReleaseLeasesRemovesEachStaleLease(t *testing.T) {
	w := newWorld(t)
	for i, cid := range []string{"a", "b", "c"} {
		w.lease("10.0.0."+string(rune('2'+i)), cid+"\r\neth0", bootTime.Add(-time.Hour))
	}
	rep := w.sweep(Request{})
	if len(rep.Releases) != 3 || len(w.leases()) != 0 {
		t.Fatalf("released %v, left %v", rep.Releases, w.leases())
	}

}

func TestReleaseGoesByExactKey(t *testing.T) {
	w := newWorld(t)
	// A pre-ifname lease of container k from an earlier boot, and k's live
	// eth1 attachment: the stale one goes, the live one stays, and so do
	// k's NAT rules.
	w.lease("10.0.0.2", "k", bootTime.Add(-time.Hour))
	w.host.Namespaces["/run/netns/k"] = sysinfo.NetnsID{Dev: 4, Ino: 77}
	w.lease("10.0.0.3", "k\r\neth1", bootTime.Add(time.Minute))
	w.record(&records.Record{ContainerID: "k", IfName: "eth1", Netns: "/run/netns/k", NetnsID: sysinfo.NetnsID{Dev: 4, Ino: 77}, BootID: w.host.ID, State: records.Complete})
	w.nat.AddContainer(net1, "k", "10.0.0.3", 0)

	w.sweep(Request{})
	equal(t, "leases left", w.leases(), []string{"10.0.0.3"})
	if !w.nat.Owns(net1, "k") {
		t.Error("NAT rules of k released although k/eth1 is live")
	}
}

func TestBeginAddReleasesStaleEarlierAttachment(t *testing.T) {
	w := newWorld(t)
	w.container("c1", "10.0.0.2")
	// Nomad re-creates the netns at the same path: new inode.
	w.host.Namespaces["/run/netns/c1"] = sysinfo.NetnsID{Dev: 4, Ino: 5555}

	att, err := w.attach.BeginAdd(w.dir(), records.Key{ContainerID: "c1", IfName: "eth0"}, "/run/netns/c1")
	if err != nil {
		t.Fatalf("BeginAdd: %v", err)
	}
	if len(w.leases()) != 0 || w.nat.Owns(net1, "c1") {
		t.Errorf("stale attachment not released: leases %v", w.leases())
	}
	if att.Record.State != records.Started || att.Record.NetnsID.Ino != 5555 || att.Record.BootID != "boot-1" || att.Record.PID != os.Getpid() {
		t.Errorf("pending record = %+v", att.Record)
	}
	if err := att.Complete([]string{"10.0.0.7/24"}); err != nil {
		t.Fatal(err)
	}
	r, _ := records.NewStore(w.dir()).Read(records.Key{ContainerID: "c1", IfName: "eth0"})
	if r == nil || r.State != records.Complete || r.PID != 0 || r.IPs[0] != "10.0.0.7/24" {
		t.Errorf("completed record = %+v", r)
	}
	if !strings.Contains(w.log.String(), "was replaced") {
		t.Errorf("release not logged: %q", w.log)
	}
}

func TestBeginAddRefusesARealDuplicate(t *testing.T) {
	w := newWorld(t)
	w.container("c1", "10.0.0.2")
	_, err := w.attach.BeginAdd(w.dir(), records.Key{ContainerID: "c1", IfName: "eth0"}, "/run/netns/c1")
	if !errors.Is(err, ErrStillAttached) || !strings.Contains(err.Error(), "already attached") {
		t.Fatalf("BeginAdd of a live attachment = %v", err)
	}
	equal(t, "leases", w.leases(), []string{"10.0.0.2"})
	if n := w.attach.Releases(w.dir())[RefusedLiveCount]; n != 1 {
		t.Errorf("refusal counted %d times, want 1", n)
	}

	w.host.Processes[777] = 1
	w.record(&records.Record{ContainerID: "c2", IfName: "eth0", Netns: "/run/netns/c1", BootID: "boot-1", State: records.Started, PID: 777, PIDStart: 1})
	_, err = w.attach.BeginAdd(w.dir(), records.Key{ContainerID: "c2", IfName: "eth0"}, "/run/netns/c1")
	if !errors.Is(err, ErrAddInProgress) {
		t.Errorf("BeginAdd during another ADD = %v, want ErrAddInProgress", err)
	}
}

func TestBeginAddNeedsANamespace(t *testing.T) {
	w := newWorld(t)
	_, err := w.attach.BeginAdd(w.dir(), records.Key{ContainerID: "c1", IfName: "eth0"}, "/run/netns/none")
	if !errors.Is(err, ErrNoNamespace) {
		t.Errorf("BeginAdd without netns = %v", err)
	}
	if w.hasRecord("c1") {
		t.Error("record written for a failed ADD")
	}
}

func TestEndDelTearsDownNATWhenNamespaceIsGone(t *testing.T) {
	w := newWorld(t)
	w.container("c1", "10.0.0.2")
	delete(w.host.Namespaces, "/run/netns/c1")
	if err := w.attach.EndDel(w.dir(), records.Key{ContainerID: "c1", IfName: "eth0"}); err != nil {
		t.Fatal(err)
	}
	if w.nat.Owns(net1, "c1") || w.hasRecord("c1") {
		t.Error("DEL without namespace left NAT rules or record")
	}
}

// bridge skips its teardown when the interface is gone from a namespace
// that is still there (deleted from inside it), and never removes a jump
// an earlier attachment of the same ID left with another address.
func TestEndDelReleasesWhatBridgeLeftInALiveNamespace(t *testing.T) {
	w := newWorld(t)
	w.container("c2", "10.0.0.3")
	w.nat.AddContainer(net1, "c2", "10.0.0.9", 0) // an earlier attachment's jump
	if err := w.attach.EndDel(w.dir(), records.Key{ContainerID: "c2", IfName: "eth0"}); err != nil {
		t.Fatal(err)
	}
	if w.nat.Owns(net1, "c2") || w.hasRecord("c2") {
		t.Errorf("DEL with namespace left NAT rules %v or the record (%v)", w.nat.Chains, w.hasRecord("c2"))
	}
}

// A DEL with no record to say which addresses the attachment had (a
// container of the bare chain's, a record lost) cannot tell that bridge's
// teardown covered every rule of the container, even when bridge found
// addresses on the interface: it lists the tables and releases what an
// earlier attachment of the same ID left.
func TestEndDelWithoutARecordReleasesWhatBridgeLeft(t *testing.T) {
	w := newWorld(t)
	w.nat.AddContainer(net1, "c5", "10.0.0.9", 0) // an earlier attachment's jump
	w.attach.TornDown = []net.IP{net.ParseIP("10.0.0.6")}
	if err := w.attach.EndDel(w.dir(), records.Key{ContainerID: "c5", IfName: "eth0"}); err != nil {
		t.Fatal(err)
	}
	if w.nat.Owns(net1, "c5") {
		t.Errorf("DEL without a record left NAT rules %v", w.nat.Chains)
	}
}

// A container attached twice to one network shares bridge's rules between
// its attachments: DEL of one keeps them for the other.
func TestEndDelKeepsNATOfAnotherAttachment(t *testing.T) {
	w := newWorld(t)
	w.container("c3", "10.0.0.4")
	w.record(&records.Record{ContainerID: "c3", IfName: "eth1", Netns: "/run/netns/c3", NetnsID: w.host.Namespaces["/run/netns/c3"], BootID: w.host.ID, State: records.Complete, IPs: []string{"10.0.0.5/24"}})
	if err := w.attach.EndDel(w.dir(), records.Key{ContainerID: "c3", IfName: "eth1"}); err != nil {
		t.Fatal(err)
	}
	if !w.nat.Owns(net1, "c3") {
		t.Error("DEL of eth1 removed the NAT rules eth0 still uses")
	}
}

func snapshotDir(t *testing.T, root string) string {
	t.Helper()
	state, err := dirstate.Describe(root)
	if err != nil {
		t.Fatal(err)
	}
	return state
}

func TestBeginAddTellsReusedInodeByCookie(t *testing.T) {
	w := newWorld(t)
	ns := "/run/netns/c1"
	w.host.Namespaces[ns] = sysinfo.NetnsID{Dev: 4, Ino: 4026532178}
	w.host.Cookies[ns] = 6108
	att, err := w.attach.BeginAdd(w.dir(), records.Key{ContainerID: "c1", IfName: "eth0"}, ns)
	if err != nil {
		t.Fatal(err)
	}
	if att.Record.NetnsCookie != 6108 {
		t.Fatalf("cookie not recorded: %+v", att.Record)
	}
	if err := att.Complete([]string{"10.0.0.2/24"}); err != nil {
		t.Fatal(err)
	}
	w.lease("10.0.0.2", "c1\r\neth0", bootTime.Add(time.Minute))

	// Same namespace, same cookie: a real duplicate.
	if _, err := w.attach.BeginAdd(w.dir(), records.Key{ContainerID: "c1", IfName: "eth0"}, ns); err == nil || !strings.Contains(err.Error(), "already attached") {
		t.Fatalf("ADD into the same namespace = %v", err)
	}
	// Deleted and re-created: the kernel gave the new namespace the old
	// inode number, but not the old cookie.
	w.host.Cookies[ns] = 6113
	if _, err := w.attach.BeginAdd(w.dir(), records.Key{ContainerID: "c1", IfName: "eth0"}, ns); err != nil {
		t.Fatalf("ADD into a re-created namespace with a reused inode: %v", err)
	}
	if len(w.leases()) != 0 || !strings.Contains(w.log.String(), "re-created (same inode") {
		t.Errorf("old attachment not released: leases %v, log %q", w.leases(), w.log)
	}
}

func TestPendingRecordOfDeadADDWithoutLeaseGoes(t *testing.T) {
	w := newWorld(t)
	w.host.Namespaces["/run/netns/alive"] = sysinfo.NetnsID{Dev: 4, Ino: 5}
	// Killed after writing its record, before host-local allocated.
	w.record(&records.Record{ContainerID: "died", IfName: "eth0", Netns: "/run/netns/alive", NetnsID: sysinfo.NetnsID{Dev: 4, Ino: 5}, BootID: w.host.ID, State: records.Started, PID: 31337, PIDStart: 1})
	// Killed after host-local allocated: the namespace is alive, keep it.
	w.record(&records.Record{ContainerID: "allocated", IfName: "eth0", Netns: "/run/netns/alive", NetnsID: sysinfo.NetnsID{Dev: 4, Ino: 5}, BootID: w.host.ID, State: records.Started, PID: 31338, PIDStart: 1})
	w.lease("10.0.0.2", "allocated\r\neth0", bootTime.Add(time.Minute))

	rep := w.sweep(Request{})
	v := verdicts(rep)
	if v["died"] != Stale || v["allocated"] != Live {
		t.Errorf("verdicts = %v", v)
	}
	if w.hasRecord("died") || !w.hasRecord("allocated") {
		t.Error("wrong pending record removed")
	}
}

func TestReleaseNeverTouchesForeignFilesOrFollowsSymlinks(t *testing.T) {
	for _, forceFallback := range []bool{false, true} {
		w := newWorld(t)
		w.container("gone", "10.0.0.3")
		delete(w.host.Namespaces, "/run/netns/gone")
		netDir := filepath.Join(w.dataDir, net1)
		if err := os.WriteFile(filepath.Join(netDir, "operator-notes"), []byte("do not delete"), 0o600); err != nil {
			t.Fatal(err)
		}
		// A planted symlink named like a lease, pointing at a file holding
		// the stale container's key.
		outside := filepath.Join(t.TempDir(), "outside")
		if err := os.WriteFile(outside, []byte("gone\r\neth0"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(outside, filepath.Join(netDir, "10.0.0.99")); err != nil {
			t.Fatal(err)
		}
		if forceFallback {
			// Too big to read in full: the one-pass GC cannot be proved safe.
			w.lease("10.0.0.50", strings.Repeat("x", maxLeaseSize+10), bootTime.Add(time.Minute))
		}
		w.sweep(Request{})
		want := []string{"10.0.0.99", "operator-notes"}
		if forceFallback {
			want = []string{"10.0.0.50", "10.0.0.99", "operator-notes"}
		}
		equal(t, fmt.Sprintf("left (fallback %v)", forceFallback), w.leases(), want)
		if b, err := os.ReadFile(outside); err != nil || string(b) != "gone\r\neth0" {
			t.Errorf("symlink target changed: %q %v", b, err)
		}
	}
}

// The lease at a live record's address is taken as the record's without
// being read (the sweep keeps it either way): a sweep of live attachments
// reads records only. A stale one's leases are read before they go.
func TestSweepReadsNoLeaseALiveRecordClaims(t *testing.T) {
	w := newWorld(t)
	w.container("live", "10.0.0.2")
	// Content a read would flag (too big): a sweep that reads it reports it.
	w.lease("10.0.0.2", strings.Repeat("x", maxLeaseSize+1), bootTime.Add(time.Minute))
	rep := w.sweep(Request{})
	if len(rep.Problems) != 0 {
		t.Errorf("a lease claimed by a live record was read: %v", rep.Problems)
	}
	w.container("gone", "10.0.0.3")
	delete(w.host.Namespaces, "/run/netns/gone")
	rep = w.sweep(Request{})
	if len(rep.Problems) != 0 || len(rep.Releases) != 1 || verdicts(rep)["live"] != Live {
		t.Errorf("problems %v, released %v; want gone released, live kept unread", rep.Problems, rep.Releases)
	}
	equal(t, "left", w.leases(), []string{"10.0.0.2"})
	// A dry run (leases, metrics) shows what the files say.
	if rep := w.sweep(Request{DryRun: true}); len(rep.Problems) != 1 {
		t.Errorf("dry run problems %v, want the big file reported", rep.Problems)
	}
}

// tmpfsDir is a temp dir on tmpfs, where data dirs belong. /dev/shm is a
// tmpfs on every Linux host this runs on.
func tmpfsDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("/dev/shm", "nbc-reclaim-test-")
	if err != nil {
		t.Fatalf("a tmpfs temp dir: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// A DEL of an attachment the plugin has no record of, sent with the
// namespace and ifname of one it has (a runtime's stale cache), must not
// reach bridge, which would delete that one's interface: AttachedThere
// names the other attachment, and only while its own path still names
// that namespace, in this boot, with the same cookie where both are known.
func TestAttachedThereNamesOnlyAnotherLiveAttachmentInTheNamespace(t *testing.T) {
	stranger := records.Key{ContainerID: "stranger", IfName: "eth0"}
	for _, tc := range []struct {
		name  string
		key   records.Key
		netns string
		setup func(w *world)
		want  string // the container ID named, "" none
	}{
		{name: "another attachment there", key: stranger, netns: "/run/netns/c1", want: "c1"},
		{name: "by another path to it", key: stranger, netns: "/run/netns/alias", want: "c1"},
		{name: "the same cookie", key: stranger, netns: "/run/netns/c1", want: "c1",
			setup: func(w *world) { w.recordCookie("c1", 6108); w.host.Cookies["/run/netns/c1"] = 6108 }},
		{name: "its own record", key: records.Key{ContainerID: "c1", IfName: "eth0"}, netns: "/run/netns/c1"},
		{name: "no namespace given", key: stranger},
		{name: "another ifname", key: records.Key{ContainerID: "stranger", IfName: "eth1"}, netns: "/run/netns/c1"},
		{name: "its path names another namespace now", key: stranger, netns: "/run/netns/alias",
			setup: func(w *world) { w.host.Namespaces["/run/netns/c1"] = sysinfo.NetnsID{Dev: 4, Ino: 9999} }},
		{name: "another cookie: a reused inode", key: stranger, netns: "/run/netns/c1",
			setup: func(w *world) { w.recordCookie("c1", 6108); w.host.Cookies["/run/netns/c1"] = 7000 }},
		{name: "an earlier boot's", key: stranger, netns: "/run/netns/c1",
			setup: func(w *world) {
				w.record(&records.Record{ContainerID: "c1", IfName: "eth0", Netns: "/run/netns/c1", NetnsID: w.host.Namespaces["/run/netns/c1"], BootID: "boot-0", State: records.Complete})
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			w.container("c1", "10.0.0.2")
			w.host.Namespaces["/run/netns/alias"] = w.host.Namespaces["/run/netns/c1"]
			if tc.setup != nil {
				tc.setup(w)
			}
			there, err := w.attach.AttachedThere(w.dir(), tc.key, tc.netns)
			got := ""
			if there != nil {
				got = there.ContainerID
			}
			if err != nil || got != tc.want {
				t.Errorf("AttachedThere(%s, %q) = %q, %v; want %q", tc.key, tc.netns, got, err, tc.want)
			}
		})
	}
}

// An attachment the runtime's GC lists as valid keeps its NAT rules even
// where the network holds no lease or record of it (added through another
// data dir, or before the network's dataDir changed): the runtime said it
// lives, and its masquerade and port mappings are its traffic (regression:
// they went as orphans' on a network the plugin owned).
func TestGCVerbKeepsNATRulesOfValidAttachments(t *testing.T) {
	w := newWorld(t)
	w.markOwned()
	nft := fakenat.NewNFT()
	w.sweeper.Netfilter = &netfilter.Cleaner{Tables: []netfilter.Table{w.nat}, NFTables: nft}
	for _, cid := range []string{"valid", "orphan"} {
		w.nat.AddContainer(net1, cid, "10.0.0.9", 8080)
		nft.Add(net1, cid, "eth0")
	}
	// Its eth0 unlisted, its eth1 listed: the container's iptables rules
	// are eth1's too.
	w.container("shared", "10.0.0.3")
	valid := []types.GCAttachment{{ContainerID: "valid", IfName: "eth0"}, {ContainerID: "shared", IfName: "eth1"}}
	rep := w.sweep(Request{GC: true, Valid: valid})
	if !w.nat.Owns(net1, "valid") || !nft.Has(net1, "valid", "eth0") || !w.nat.Owns(net1, "shared") {
		t.Errorf("the NAT rules of attachments the runtime lists as valid went: iptables %v, nftables %v", w.nat.Chains, nft.Rules)
	}
	if w.hasRecord("shared") {
		t.Error("the unlisted attachment's record stayed")
	}
	if w.nat.Owns(net1, "orphan") || nft.Has(net1, "orphan", "eth0") {
		t.Errorf("the orphan's NAT rules stayed: iptables %v, nftables %v", w.nat.Chains, nft.Rules)
	}
	equal(t, "orphan rules", rep.OrphanRules, []string{"orphan", "orphan"})
}
