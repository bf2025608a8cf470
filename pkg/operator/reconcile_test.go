package operator

import (
	"bytes"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/conflists"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/netconf"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/records"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/runtimes"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/sysinfo"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/fakehost"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/testhost"
	"golang.org/x/sys/unix"
)

// gc --runtime: the fixture's live attachments "web" (its namespace there)
// and "detached" (held by a running process) are not listed by the
// runtime. The first run only remembers them; a run a grace later releases
// web, never detached (a process runs there), never the pending ADD's; a
// namespace only a mount holds is released, and the mount named.
func TestGCReleasesWhatTheRuntimeStoppedListingPastTheGrace(t *testing.T) {
	dataDir, s, _ := fixture(t)
	host := s.Host.(*fakehost.Host)
	// A namespace a leaked mount keeps: its path is gone, no process is in it.
	host.Holders[sysinfo.NetnsID{Dev: 4, Ino: 106}] = []sysinfo.Holder{{Mount: "/run/netns-leaked/m1"}}
	writeAttachment(t, dataDir, host, "mounted", "172.26.64.7", 106, host.Clock.Add(-time.Hour))

	listing := &runtimes.Listing{IDs: map[string]bool{"starting": true}}
	run := func(now time.Time, dryRun bool) string {
		t.Helper()
		host.Clock = now
		rec := &Reconcile{Runtime: "podman", Listing: listing, Grace: 5 * time.Minute, Now: now}
		var text bytes.Buffer
		if err := GC(s, scopeOf(dataDir, []string{"nomad"}), dryRun, false, rec, NewGCText(&text, dryRun)); err != nil {
			t.Fatal(err)
		}
		return text.String()
	}
	first := host.Clock
	out := run(first, false)
	if strings.Contains(out, "not listed by podman") {
		t.Errorf("the first list released on the runtime's account:\n%s", out)
	}
	if _, err := os.Stat(ipamdir.New(dataDir, "nomad").Marker(ipamdir.UnlistedMarker)); err != nil {
		t.Fatalf("the first run remembered nothing: %v", err)
	}
	// Within the grace: still nothing.
	if out := run(first.Add(4*time.Minute), false); strings.Contains(out, "not listed by podman") {
		t.Errorf("released within the grace:\n%s", out)
	}
	out = run(first.Add(6*time.Minute), false)
	since := first.UTC().Format(time.RFC3339)
	for _, want := range []string{
		"released nomad web/eth0 172.26.64.2: not listed by podman since " + since + " (grace 5m0s); removed lease 172.26.64.2",
		"released nomad mounted/eth0 172.26.64.7: not listed by podman since " + since + " (grace 5m0s); its namespace is still held by mount /run/netns-leaked/m1 (not removed: --remove-mounts unmounts it); removed lease 172.26.64.7, record",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
	for _, kept := range []string{"detached/eth0", "starting/eth0"} {
		if strings.Contains(out, kept) {
			t.Errorf("released %s (a process holds it, or its ADD runs):\n%s", kept, out)
		}
	}
}

// gc --runtime never releases an attachment whose namespace, still at its
// recorded path, a process is in: something runs there, whatever the
// runtime's list says (a list read wrong, the wrong agent's, a container
// the runtime lost track of). Regression: only a namespace whose path was
// replaced was asked for its processes; one still at its path was released.
func TestGCRuntimeKeepsAnAttachmentAProcessIsIn(t *testing.T) {
	dataDir, s, _ := fixture(t)
	host := s.Host.(*fakehost.Host)
	// web's namespace, at its path: its container's init is in it.
	host.Holders[sysinfo.NetnsID{Dev: 4, Ino: 101}] = []sysinfo.Holder{{PID: 31337, Command: "nginx"}, {Mount: "/var/run/netns/web"}}
	listing := &runtimes.Listing{IDs: map[string]bool{}}
	first := host.Clock
	for _, now := range []time.Time{first, first.Add(6 * time.Minute)} {
		host.Clock = now
		rec := &Reconcile{Runtime: "nomad", Listing: listing, Grace: 5 * time.Minute, Now: now, RemoveMounts: true}
		var text bytes.Buffer
		if err := GC(s, scopeOf(dataDir, []string{"nomad"}), false, false, rec, NewGCText(&text, false)); err != nil {
			t.Fatal(err)
		}
		if out := text.String(); strings.Contains(out, "web/eth0") {
			t.Errorf("released an attachment a process is in:\n%s", out)
		}
	}
	if _, err := os.Stat(ipamdir.New(dataDir, "nomad").Lease(netipOf(t, "172.26.64.2"))); err != nil {
		t.Errorf("web's lease: %v", err)
	}
}

// An attachment younger than the grace is not released on the runtime's
// account, however long it has been unlisted.
func TestGCReleasesNothingOfAnAttachmentYoungerThanTheGrace(t *testing.T) {
	dataDir, s, _ := fixture(t)
	host := s.Host.(*fakehost.Host)
	first := host.Clock
	young := first.Add(4 * time.Minute)
	writeAttachment(t, dataDir, host, "young", "172.26.64.8", 107, young)
	listing := &runtimes.Listing{IDs: map[string]bool{}}
	for _, now := range []time.Time{first, first.Add(6 * time.Minute)} {
		host.Clock = now
		rec := &Reconcile{Runtime: "nomad", Listing: listing, Grace: 5 * time.Minute, Now: now}
		var text bytes.Buffer
		if err := GC(s, scopeOf(dataDir, []string{"nomad"}), false, false, rec, NewGCText(&text, false)); err != nil {
			t.Fatal(err)
		}
		if out := text.String(); strings.Contains(out, "young/eth0") {
			t.Errorf("released an attachment younger than the grace:\n%s", out)
		}
	}
}

// A released attachment is forgotten by .unlisted (regression: it stayed
// listed there); one kept (younger than the grace) is remembered with its
// first time missing.
func TestGCForgetsWhatItReleasedInTheUnlistedMarker(t *testing.T) {
	dataDir, s, _ := fixture(t)
	host := s.Host.(*fakehost.Host)
	listing := &runtimes.Listing{IDs: map[string]bool{"starting": true}}
	first := host.Clock
	writeAttachment(t, dataDir, host, "young", "172.26.64.8", 107, first.Add(2*time.Minute))
	for _, now := range []time.Time{first, first.Add(6 * time.Minute)} {
		host.Clock = now
		rec := &Reconcile{Runtime: "nomad", Listing: listing, Grace: 5 * time.Minute, Now: now}
		if err := GC(s, scopeOf(dataDir, []string{"nomad"}), false, false, rec, NewGCText(&bytes.Buffer{}, false)); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(ipamdir.New(dataDir, "nomad").Marker(ipamdir.UnlistedMarker))
	if err != nil {
		t.Fatal(err)
	}
	var st unlistedState
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	if _, ok := st.MissingSince["web@eth0"]; ok {
		t.Errorf("web@eth0, released, is still remembered as unlisted: %s", b)
	}
	if since, ok := st.MissingSince["young@eth0"]; !ok || !since.Equal(first) {
		t.Errorf("young@eth0, kept, is not remembered missing since %s: %s", first, b)
	}
}

// gc, with or without --runtime, of a data dir the plugin never served (a
// bare bridge's /var/lib/cni/networks: leases, no records) finds nothing
// to release and creates nothing there (regression: it made
// .nomad-bridge-cni/<network> for its markers).
func TestGCOfADirectoryThePluginNeverServedCreatesNothing(t *testing.T) {
	_, s, _ := fixture(t)
	dataDir := t.TempDir()
	leases := filepath.Join(dataDir, "podman")
	if err := os.MkdirAll(leases, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{"lock": "", "last_reserved_ip.0": "10.88.0.5", "10.88.0.5": "c1\r\neth0"} {
		if err := os.WriteFile(filepath.Join(leases, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, rec := range []*Reconcile{nil, {Runtime: "nomad", Listing: &runtimes.Listing{IDs: map[string]bool{}}, Grace: 5 * time.Minute, Now: s.Host.Now()}} {
		var text bytes.Buffer
		if err := GC(s, scopeOf(dataDir, []string{"podman"}), false, false, rec, NewGCText(&text, false)); err != nil {
			t.Fatal(err)
		}
		if text.String() != "nothing to release\n" {
			t.Errorf("gc (runtime %v) said:\n%s", rec != nil, text.String())
		}
		if _, err := os.Lstat(filepath.Join(dataDir, ipamdir.RecordDirName)); !os.IsNotExist(err) {
			t.Errorf("gc (runtime %v) created %s: %v", rec != nil, ipamdir.RecordDirName, err)
		}
	}
}

func writeAttachment(t *testing.T, dataDir string, host *fakehost.Host, cid, ip string, ino uint64, created time.Time) {
	t.Helper()
	d := ipamdir.New(dataDir, "nomad")
	if err := os.WriteFile(d.Lease(netipOf(t, ip)), []byte(cid+"\r\neth0"), 0o600); err != nil {
		t.Fatal(err)
	}
	writeRecord(t, d, cid, "/var/run/netns/"+cid, ino, created)
	if ino != 106 {
		host.Namespaces["/var/run/netns/"+cid] = sysinfo.NetnsID{Dev: 4, Ino: ino}
	}
}

func netipOf(t *testing.T, s string) net.IP {
	t.Helper()
	ip := net.ParseIP(s)
	if ip == nil {
		t.Fatalf("bad IP %q", s)
	}
	return ip
}

func writeRecord(t *testing.T, d ipamdir.Dir, cid, netns string, ino uint64, created time.Time) {
	t.Helper()
	r := &records.Record{Version: records.FormatVersion, Network: d.Network, ContainerID: cid, IfName: "eth0", Netns: netns,
		NetnsID: sysinfo.NetnsID{Dev: 4, Ino: ino}, BootID: "boot-1", Created: created, State: records.Complete, IPs: nil}
	if err := records.NewStore(d).Write(r); err != nil {
		t.Fatal(err)
	}
}

// leases --runtime: each row says whether the runtime lists its
// container; what it lists that holds nothing here is named after.
func TestLeasesDriftBothWays(t *testing.T) {
	dataDir, s, _ := fixture(t)
	var rows []Row
	var note bytes.Buffer
	sink := &Drift{Sink: &rowCollector{rows: &rows}, Runtime: "nomad", Listing: &runtimes.Listing{IDs: map[string]bool{"web": true, "elsewhere": true}}, Note: &note}
	if err := Leases(s, scopeOf(dataDir, []string{"nomad"}), sink); err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		want := "not listed"
		if r.ContainerID == "web" {
			want = "listed"
		}
		if r.Runtime != want {
			t.Errorf("row %s %s: runtime %q, want %q", r.ContainerID, r.IP, r.Runtime, want)
		}
	}
	if note.String() != "listed by nomad, holding nothing on these networks: elsewhere\n" {
		t.Errorf("note = %q", note.String())
	}
	// What it keeps is bounded by the runtime's list, not the leases.
	if len(sink.seen) != 1 || !sink.seen["web"] {
		t.Errorf("seen = %v, want only web, the listed container with rows", sink.seen)
	}
}

type rowCollector struct{ rows *[]Row }

func (c *rowCollector) Row(r Row)             { *c.rows = append(*c.rows, r) }
func (c *rowCollector) Kept(string, int)      {}
func (c *rowCollector) End(p *Problems) error { return nil }

// --remove-mounts unmounts the mount point the holder scan named, never
// what a symlink planted at that path since points to: the scan and the
// unmount are apart in time, and the path's directory may be writable by
// others (a runtime's netns directory).
func TestRemoveMountsNeverFollowsASymlinkAtTheMountPoint(t *testing.T) {
	if missing := testhost.MissingTools(); len(missing) > 0 {
		testhost.SkipOrFail(t, "needs "+strings.Join(missing, ", ")+" to mount a tmpfs")
	}
	dir := t.TempDir()
	victim := filepath.Join(dir, "victim")
	if err := os.Mkdir(victim, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", victim, "tmpfs", 0, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(victim, unix.MNT_DETACH) })
	planted := filepath.Join(dir, "netns-m1")
	if err := os.Symlink(victim, planted); err != nil {
		t.Fatal(err)
	}

	err := (&Reconcile{RemoveMounts: true}).unmount(planted, false)
	var st unix.Statfs_t
	if serr := unix.Statfs(victim, &st); serr != nil || st.Type != unix.TMPFS_MAGIC {
		t.Fatalf("unmount through a symlink at the mount point took the mount it points to (err %v)", err)
	}
	if err == nil {
		t.Fatal("unmount of a symlink reported success")
	}
}

// A network defined in two files is the first one's, as libcni, go-cni and
// Nomad load it (the files in lexical order, the first of that name): gc
// migrates from that one's legacy dir, as its CHECK does.
func TestScopeTakesTheFirstFileOfANetwork(t *testing.T) {
	dataDir := t.TempDir()
	var nets []*conflists.Network
	for _, legacy := range []string{"/srv/first", "/srv/second"} {
		nets = append(nets, &conflists.Network{Name: "nomad", Ours: true, Conf: &netconf.Config{DataDir: dataDir, LegacyDataDir: legacy}})
	}
	if got := NewScope(dataDir, nil, nets).LegacyDataDirs["nomad"]; got != "/srv/first" {
		t.Errorf("legacy dir of a network in two files: %q, want the first file's", got)
	}
}

// A migrated attachment (a lease the bare bridge chain made, copied in and
// kept alive by its legacy copy) names no namespace, so no process can be
// looked for in it: perhaps another runtime's container, running, which
// the runtime asked cannot speak for, as for a lease with no record. gc
// --runtime leaves it. Regression: its leases went on the runtime's word.
func TestGCRuntimeKeepsAMigratedAttachment(t *testing.T) {
	dataDir, s, _ := fixture(t)
	host := s.Host.(*fakehost.Host)
	legacy := ipamdir.New(t.TempDir(), "nomad")
	if err := os.MkdirAll(legacy.Leases(), 0o755); err != nil {
		t.Fatal(err)
	}
	lease := filepath.Join(legacy.Leases(), "172.26.64.50")
	if err := os.WriteFile(lease, []byte("bare\r\neth0"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(lease, boot.Add(time.Hour), boot.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	d := ipamdir.New(dataDir, "nomad")
	sc := Scope{DataDir: dataDir, Dirs: []ipamdir.Dir{d}, LegacyDataDirs: map[string]string{"nomad": filepath.Dir(legacy.Leases())}}
	first := host.Clock
	for _, now := range []time.Time{first, first.Add(6 * time.Minute)} {
		host.Clock = now
		rec := &Reconcile{Runtime: "cri", Listing: &runtimes.Listing{IDs: map[string]bool{}}, Grace: 5 * time.Minute, Now: now}
		var text bytes.Buffer
		if err := GC(s, sc, false, false, rec, NewGCText(&text, false)); err != nil {
			t.Fatal(err)
		}
		if out := text.String(); strings.Contains(out, "bare/eth0") {
			t.Errorf("released a migrated attachment on the runtime's word:\n%s", out)
		}
	}
	for _, path := range []string{lease, d.Lease(netipOf(t, "172.26.64.50"))} {
		if _, err := os.Stat(path); err != nil {
			t.Errorf("lease %s: %v", path, err)
		}
	}
}
