package reclaim

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/records"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/sysinfo"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/dirstate"
)

func (w *world) legacyLease(legacy, ip, content string, mtime time.Time) string {
	w.t.Helper()
	dir := filepath.Join(legacy, net1)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		w.t.Fatal(err)
	}
	path := filepath.Join(dir, ip)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		w.t.Fatal(err)
	}
	if err := os.Chtimes(path, mtime, mtime); err != nil {
		w.t.Fatal(err)
	}
	return path
}

func TestMigrateMovesThisBootsLeasesAndDropsOlderOnes(t *testing.T) {
	w := newWorld(t)
	legacy := t.TempDir()
	running := bootTime.Add(10 * time.Minute)
	w.legacyLease(legacy, "10.0.0.2", "running\r\neth0", running)
	w.legacyLease(legacy, "10.0.0.3", "deadbeforeboot\r\neth0", bootTime.Add(-time.Hour))
	w.legacyLease(legacy, "10.0.0.4", "conflict\r\neth0", running)
	w.lease("10.0.0.4", "someone-else\r\neth0", running)
	if err := os.WriteFile(filepath.Join(legacy, net1, "last_reserved_ip.0"), []byte("10.0.0.4"), 0o600); err != nil {
		t.Fatal(err)
	}

	if err := w.migrate.Migrate(w.dir(), legacy); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	w.migrated(1, 1, 1)
	moved := filepath.Join(w.dataDir, net1, "10.0.0.2")
	b, err := os.ReadFile(moved)
	if err != nil || string(b) != "running\r\neth0" {
		t.Fatalf("moved lease = %q, %v", b, err)
	}
	if fi, _ := os.Stat(moved); !fi.ModTime().Equal(running) || fi.Mode().Perm() != 0o600 {
		t.Errorf("moved lease mtime %v mode %v, want %v 0600", fi.ModTime(), fi.Mode(), running)
	}
	left, _ := os.ReadDir(filepath.Join(legacy, net1))
	var names []string
	for _, e := range left {
		names = append(names, e.Name())
	}
	// The conflicting lease stays where it is, host-local's own files too,
	// and so does the migrated one: the sign that its attachment is alive.
	equal(t, "legacy dir", names, []string{"10.0.0.2", "10.0.0.4", "last_reserved_ip.0", "lock"})
	rec, err := records.NewStore(w.dir()).Read(records.Key{ContainerID: "running", IfName: "eth0"})
	if err != nil || rec == nil || rec.State != records.Migrated || len(rec.LegacyLeases) != 1 || rec.LegacyLeases[0] != filepath.Join(legacy, net1, "10.0.0.2") {
		t.Errorf("record of the migrated attachment = %+v, %v", rec, err)
	}
	if b, _ := os.ReadFile(filepath.Join(w.dataDir, net1, "10.0.0.4")); string(b) != "someone-else\r\neth0" {
		t.Errorf("our lease was overwritten: %q", b)
	}

	// Once per boot: a new legacy lease is not picked up again this boot.
	w.legacyLease(legacy, "10.0.0.5", "late\r\neth0", running)
	if err := w.migrate.Migrate(w.dir(), legacy); err != nil {
		t.Errorf("second Migrate this boot: %v", err)
	}
	w.migrated(0, 0, 0)
	// Next boot, it is (and 10.0.0.2 again, which already has a record:
	// its legacy copy is removed this time).
	w.host.ID = "boot-2"
	if err := w.migrate.Migrate(w.dir(), legacy); err != nil {
		t.Errorf("Migrate in the next boot: %v", err)
	}
	w.migrated(2, 0, 1) // 10.0.0.4 still has another owner here
}

// migrated checks what the migrations since the last call logged: leases
// moved and dropped, and the conflicts, one line each.
func (w *world) migrated(moved, dropped, conflicts int) {
	w.t.Helper()
	log := w.log.String()
	w.log.Reset()
	if moved+dropped > 0 && !strings.Contains(log, fmt.Sprintf("migrated %d lease(s) from ", moved)) ||
		moved+dropped > 0 && !strings.Contains(log, fmt.Sprintf(", removed %d from before this boot", dropped)) ||
		moved+dropped == 0 && strings.Contains(log, " lease(s) from ") ||
		strings.Count(log, "not migrated") != conflicts {
		w.t.Errorf("want %d moved, %d dropped, %d conflicts; log:\n%s", moved, dropped, conflicts, log)
	}
}

func TestMigrateResumesAfterACrashBetweenCopyAndRemove(t *testing.T) {
	w := newWorld(t)
	legacy := t.TempDir()
	running := bootTime.Add(time.Minute)
	src := w.legacyLease(legacy, "10.0.0.2", "c1\r\neth0", running)
	// The previous run copied, then died: the target exists, the source too,
	// and there is no marker.
	w.lease("10.0.0.2", "c1\r\neth0", running)

	if err := w.migrate.Migrate(w.dir(), legacy); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	w.migrated(1, 0, 0)
	if _, err := os.Stat(src); err != nil {
		t.Errorf("source lease gone, want it kept for the migrated record: %v", err)
	}
	if r, err := records.NewStore(w.dir()).Read(records.Key{ContainerID: "c1", IfName: "eth0"}); err != nil || r == nil || r.State != records.Migrated {
		t.Errorf("record = %+v, %v; want a migrated one", r, err)
	}
}

// A migration killed after writing a migrated record and before its
// marker is run again by the next ADD, CHECK or GC: the record it finds is
// its own, and the legacy lease, the sign that the attachment is alive,
// stays (regression: it was removed as that of an attachment "already
// recorded", and the next sweep released the running container's copy).
func TestMigrateRunAgainKeepsTheLegacyLeaseOfItsOwnRecord(t *testing.T) {
	w := newWorld(t)
	legacy := t.TempDir()
	src := w.legacyLease(legacy, "10.0.0.2", "c1\r\neth0", bootTime.Add(time.Minute))
	if err := w.migrate.Migrate(w.dir(), legacy); err != nil {
		t.Fatal(err)
	}
	// What the killed run left: everything but its marker.
	if err := os.Remove(w.dir().Marker(ipamdir.MigratedMarker)); err != nil {
		t.Fatal(err)
	}
	w.log.Reset()
	if err := w.migrate.Migrate(w.dir(), legacy); err != nil {
		t.Fatalf("Migrate again: %v", err)
	}
	w.migrated(1, 0, 0)
	if _, err := os.Stat(src); err != nil {
		t.Fatalf("legacy lease gone after the migration ran again: %v", err)
	}
	rep := w.sweep(Request{LegacyDataDir: legacy})
	if got := verdicts(rep)["c1"]; got != Live {
		t.Errorf("c1: %s, want live", got)
	}
	equal(t, "leases", w.leases(), []string{"10.0.0.2"})
}

// A runtime that adopted the plugin in place DELs with the configuration
// it cached at ADD: plain bridge on the legacy directory, which releases
// only the legacy copy. Until then the migrated attachment is alive; then a
// sweep, or its next ADD, releases what the plugin holds for it.
func TestMigratedAttachmentLivesWhileItsLegacyLeaseDoes(t *testing.T) {
	w := newWorld(t)
	legacy := t.TempDir()
	w.attach.LegacyDataDir = legacy
	running := bootTime.Add(time.Minute)
	a := w.legacyLease(legacy, "10.0.0.2", "a\r\neth0", running)
	b := w.legacyLease(legacy, "10.0.0.3", "b\r\neth0", running)
	w.nat.AddContainer(net1, "a", "10.0.0.2", 0)
	if err := w.migrate.Migrate(w.dir(), legacy); err != nil {
		t.Fatal(err)
	}

	rep := w.sweep(Request{LegacyDataDir: legacy})
	if got := verdicts(rep); got["a"] != Live || got["b"] != Live {
		t.Fatalf("verdicts with both legacy leases held = %v", got)
	}
	equal(t, "leases", w.leases(), []string{"10.0.0.2", "10.0.0.3"})

	// The runtime DELs a and b through the old configuration.
	for _, p := range []string{a, b} {
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
	}
	// b's container starts again: its ADD releases the old attachment first.
	w.host.Namespaces["/run/netns/b-new"] = sysinfo.NetnsID{Dev: 4, Ino: 7777}
	att, err := w.attach.BeginAdd(w.dir(), records.Key{ContainerID: "b", IfName: "eth0"}, "/run/netns/b-new")
	if err != nil {
		t.Fatalf("ADD of b after its DEL through the old configuration: %v", err)
	}
	att.Close()
	equal(t, "leases after b's re-ADD", w.leases(), []string{"10.0.0.2"})
	// a was removed for good: the next sweep releases it.
	rep = w.sweep(Request{LegacyDataDir: legacy})
	if got := verdicts(rep)["a"]; got != Stale {
		t.Fatalf("a: %s, want stale", got)
	}
	equal(t, "leases", w.leases(), nil)
	if w.hasRecord("a") || w.nat.Owns(net1, "a") {
		t.Error("a's record or NAT rules kept")
	}
	if !strings.Contains(w.log.String(), "released its legacy lease") {
		t.Errorf("log does not say why: %s", w.log)
	}
}

// While the legacy lease still names it, a re-ADD of a migrated attachment
// is a duplicate, refused with what to do.
func TestReAddOfALiveMigratedAttachmentIsRefused(t *testing.T) {
	w := newWorld(t)
	legacy := t.TempDir()
	w.legacyLease(legacy, "10.0.0.2", "a\r\neth0", bootTime.Add(time.Minute))
	if err := w.migrate.Migrate(w.dir(), legacy); err != nil {
		t.Fatal(err)
	}
	w.host.Namespaces["/run/netns/a"] = sysinfo.NetnsID{Dev: 4, Ino: 7777}
	_, err := w.attach.BeginAdd(w.dir(), records.Key{ContainerID: "a", IfName: "eth0"}, "/run/netns/a")
	if err == nil || !strings.Contains(err.Error(), "through the configuration it was added with") {
		t.Fatalf("re-ADD of a live migrated attachment = %v", err)
	}
	equal(t, "leases", w.leases(), []string{"10.0.0.2"})
}

// With no legacy directory there is nothing to move, and nothing is
// written: a verb on a network the plugin never served leaves nothing
// (regression: a failed ADD left .migrated).
func TestMigrateWithoutLegacyDirectoryCreatesNothing(t *testing.T) {
	w := newWorld(t)
	legacy := filepath.Join(t.TempDir(), "absent")
	if err := w.migrate.Migrate(w.dir(), legacy); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(legacy); !os.IsNotExist(err) {
		t.Errorf("Migrate created the legacy dir: %v", err)
	}
	if _, err := os.Stat(filepath.Join(w.dataDir, ".nomad-bridge-cni")); !os.IsNotExist(err) {
		t.Errorf("Migrate wrote in the data dir: %v", err)
	}
}

// When the target of a migrated lease already exists, it is compared
// without following a symlink and without blocking on a FIFO: a symlink to
// an identical lease elsewhere is not "already moved", and neither hangs.
func TestCopyLeaseDoesNotFollowOrBlockOnAnExistingTarget(t *testing.T) {
	dir := t.TempDir()
	l := Lease{content: "c1\r\neth0", ModTime: time.Now()}
	elsewhere := filepath.Join(t.TempDir(), "lease")
	if err := os.WriteFile(elsewhere, []byte(l.content), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "10.0.0.2")
	if err := os.Symlink(elsewhere, link); err != nil {
		t.Fatal(err)
	}
	if moved, err := copyLease(l, link); moved || err == nil {
		t.Errorf("symlinked target: moved %v, err %v; want an error and no move", moved, err)
	}
	fifo := dirstate.PlantFIFO(t, filepath.Join(dir, "10.0.0.3")) // its cleanup lets a blocked copyLease go
	done := make(chan bool, 1)
	go func() { moved, _ := copyLease(l, fifo); done <- moved }()
	select {
	case moved := <-done:
		if moved {
			t.Error("a FIFO target counted as the migrated lease")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("copyLease blocked on a FIFO")
	}
}

// DELeted through the plugin, a migrated attachment leaves nothing: its
// legacy lease, kept as the sign it was alive, goes with it.
func TestDelOfAMigratedAttachmentRemovesItsLegacyLease(t *testing.T) {
	w := newWorld(t)
	legacy := t.TempDir()
	w.attach.LegacyDataDir = legacy
	a := w.legacyLease(legacy, "10.0.0.2", "a\r\neth0", bootTime.Add(time.Minute))
	other := w.legacyLease(legacy, "10.0.0.3", "someone\r\neth0", bootTime.Add(time.Minute))
	if err := w.migrate.Migrate(w.dir(), legacy); err != nil {
		t.Fatal(err)
	}
	if err := w.attach.EndDel(w.dir(), records.Key{ContainerID: "a", IfName: "eth0"}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(a); !os.IsNotExist(err) {
		t.Errorf("legacy lease of a kept after its DEL: %v", err)
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("another attachment's legacy lease went too: %v", err)
	}
	if w.hasRecord("a") {
		t.Error("record of a kept")
	}
}

// A DEL never fails on what the legacy directory holds: with host-local's
// lock there planted (a symlink, which the plugin never follows), the
// migrated attachment's DEL succeeds and leaves its legacy lease, which the
// next boot's migration drops (regression: the DEL failed on every retry).
func TestDelOfAMigratedAttachmentBesideAPlantedLegacyLock(t *testing.T) {
	w := newWorld(t)
	legacy := t.TempDir()
	w.attach.LegacyDataDir = legacy
	a := w.legacyLease(legacy, "10.0.0.2", "a\r\neth0", bootTime.Add(time.Minute))
	if err := w.migrate.Migrate(w.dir(), legacy); err != nil {
		t.Fatal(err)
	}
	lock := filepath.Join(filepath.Dir(a), ipamdir.LockFileName)
	if err := os.Remove(lock); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(t.TempDir(), "elsewhere"), lock); err != nil {
		t.Fatal(err)
	}
	if err := w.attach.EndDel(w.dir(), records.Key{ContainerID: "a", IfName: "eth0"}); err != nil {
		t.Fatalf("DEL failed on the planted legacy lock: %v", err)
	}
	if w.hasRecord("a") {
		t.Error("record of a kept")
	}
	if _, err := os.Stat(a); err != nil {
		t.Errorf("legacy lease went without its lock: %v", err)
	}
}

// A migration killed between creating a copy and writing it leaves an
// empty reservation, which names nobody and no DEL would ever release: the
// next run writes it. A FIFO planted there is left alone, unopened for
// writing (that would block).
func TestMigrateRewritesACopyKilledBeforeItsWrite(t *testing.T) {
	w := newWorld(t)
	legacy := t.TempDir()
	running := bootTime.Add(10 * time.Minute)
	w.legacyLease(legacy, "10.0.0.2", "running\r\neth0", running)
	w.legacyLease(legacy, "10.0.0.3", "other\r\neth0", running)
	w.lease("10.0.0.2", "", running)
	dirstate.PlantFIFO(t, filepath.Join(w.dataDir, net1, "10.0.0.3"))
	if err := w.migrate.Migrate(w.dir(), legacy); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	w.migrated(1, 0, 1) // the FIFO a conflict
	if b, err := os.ReadFile(filepath.Join(w.dataDir, net1, "10.0.0.2")); err != nil || string(b) != "running\r\neth0" {
		t.Errorf("copy = %q, %v", b, err)
	}
}

// A record is a file anyone with the data dir can edit: the legacy leases
// it names are trusted only in the network's directory under the entry's
// legacy data dir (regression: a DEL deleted any file a damaged record named
// that held "<cid>\r\n<ifname>", and created a lock beside it).
func TestLegacyLeasesOutsideTheLegacyDirAreNeverTouched(t *testing.T) {
	w := newWorld(t)
	legacy := t.TempDir()
	w.attach.LegacyDataDir = legacy
	outside := t.TempDir()
	victim := filepath.Join(outside, "sub", "file")
	if err := os.MkdirAll(filepath.Dir(victim), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(victim, []byte("a\r\neth0"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Beside them, one that looks right but for its network's name.
	wrongNet := w.legacyLease(legacy, "10.0.0.2", "a\r\neth0", bootTime.Add(time.Minute))
	moved := filepath.Join(filepath.Dir(filepath.Dir(wrongNet)), "other-net", "10.0.0.2")
	if err := os.MkdirAll(filepath.Dir(moved), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(wrongNet, moved); err != nil {
		t.Fatal(err)
	}
	w.record(&records.Record{ContainerID: "a", IfName: "eth0", BootID: w.host.ID, State: records.Migrated, LegacyLeases: []string{victim, moved}})

	rep := w.sweep(Request{LegacyDataDir: legacy})
	if got := verdicts(rep)["a"]; got != Unknown {
		t.Errorf("verdict on a record naming leases elsewhere = %s, want unknown (kept)", got)
	}
	if !w.hasRecord("a") {
		t.Fatal("the sweep released the record")
	}
	if err := w.attach.EndDel(w.dir(), records.Key{ContainerID: "a", IfName: "eth0"}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{victim, moved} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("DEL removed %s, which its record named outside the legacy dir: %v", p, err)
		}
	}
	for _, p := range []string{filepath.Join(outside, w.dir().Network, "lock"), filepath.Join(outside, "sub", "lock")} {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("DEL created %s", p)
		}
	}
	if w.hasRecord("a") {
		t.Error("DEL kept the record")
	}
}

// An attachment with a legacy lease from before this boot and another from
// this boot (an IPv4 and an IPv6 range, the older kept over the reboot):
// the older goes, the one from this boot stays where it is, the sign that
// the migrated attachment is alive, and the next sweep keeps its copy.
func TestMigrateKeepsThisBootsLegacyLeaseOfAnAttachmentWithAnOlderOne(t *testing.T) {
	w := newWorld(t)
	legacy := t.TempDir()
	w.legacyLease(legacy, "10.0.0.2", "c1\r\neth0", bootTime.Add(-time.Hour))
	src := w.legacyLease(legacy, "fd00::2", "c1\r\neth0", bootTime.Add(time.Minute))
	if err := w.migrate.Migrate(w.dir(), legacy); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(src); err != nil {
		t.Fatalf("this boot's legacy lease removed: %v", err)
	}
	if _, err := os.Stat(filepath.Join(legacy, net1, "10.0.0.2")); !os.IsNotExist(err) {
		t.Errorf("the lease from before this boot stayed: %v", err)
	}
	rep := w.sweep(Request{LegacyDataDir: legacy})
	if got := verdicts(rep)["c1"]; got != Live {
		t.Errorf("verdict after the migration = %s, want live", got)
	}
	equal(t, "leases", w.leases(), []string{"fd00::2"})
}

// A legacy lease is a file, and what it names is read back as such: the
// migration builds a record's file name from it, which must stay one name
// in the record directory (SECURITY.md: "cannot contain / or climb out of
// its directory"). Regression: a legacy lease naming ifname
// "../../../<path>" (or such a container ID) made a migration (run by an
// ADD, a CHECK or gc, as root) write a record at <path>, anywhere.
func TestMigrateWritesNoRecordOutsideTheRecordDirectory(t *testing.T) {
	w := newWorld(t)
	legacy := t.TempDir()
	outside := t.TempDir()
	victim := filepath.Join(outside, "victim")
	if err := os.WriteFile(victim, []byte("precious"), 0o600); err != nil {
		t.Fatal(err)
	}
	// From the record directory, <dataDir>/.nomad-bridge-cni/<net>: one
	// ".." undoes "<cid>@..", two more reach the data dir.
	rel, err := filepath.Rel(w.dataDir, victim)
	if err != nil {
		t.Fatal(err)
	}
	running := bootTime.Add(time.Minute)
	w.legacyLease(legacy, "10.0.0.2", "c1\r\n../../../"+rel, running)
	w.legacyLease(legacy, "10.0.0.3", "../../../"+rel+"\r\neth0", running)
	w.legacyLease(legacy, "10.0.0.4", "ok\r\neth0", running)

	_ = w.migrate.Migrate(w.dir(), legacy)
	if b, err := os.ReadFile(victim); err != nil || string(b) != "precious" {
		t.Errorf("%s = %q, %v: the migration wrote outside the record directory", victim, b, err)
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 1 {
		t.Errorf("the migration created files in %s: %v", outside, entries)
	}
	if entries, _ := os.ReadDir(w.dataDir); len(entries) != 2 {
		t.Errorf("the migration created files in the data dir's root: %v", entries)
	}
	// The valid one is migrated as ever.
	if r, err := records.NewStore(w.dir()).Read(records.Key{ContainerID: "ok", IfName: "eth0"}); err != nil || r == nil || r.State != records.Migrated {
		t.Errorf("record of the valid legacy lease = %+v, %v", r, err)
	}
}

// A migrated attachment is alive while its runtime's legacy lease names
// it; a legacy lease that cannot be read (here a directory in its place)
// proves nothing either way: kept, never released as if its runtime had
// DELed it.
func TestMigratedAttachmentWithAnUnreadableLegacyLeaseIsKept(t *testing.T) {
	w := newWorld(t)
	legacy := t.TempDir()
	path := w.legacyLease(legacy, "10.0.0.2", "a\r\neth0", bootTime.Add(time.Minute))
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(path, 0o700); err != nil {
		t.Fatal(err)
	}
	w.record(&records.Record{ContainerID: "a", IfName: "eth0", BootID: w.host.ID, State: records.Migrated, LegacyLeases: []string{path}})

	if got := verdicts(w.sweep(Request{LegacyDataDir: legacy}))["a"]; got != Unknown {
		t.Errorf("verdict on a migrated attachment whose legacy lease cannot be read = %s, want unknown (kept)", got)
	}
	if !w.hasRecord("a") {
		t.Error("the sweep released the record")
	}
}

// A legacy lease of this boot from before host-local recorded ifnames
// (its content the container ID alone) can get no record, which is named
// by both: its copy is made, and the legacy lease goes instead of staying
// as a migrated attachment's sign of life, so that the address is held in
// one directory only (the copy, which its runtime's DEL through the plugin
// releases).
func TestMigrateOfALeaseWithoutIfnameMovesItWithoutARecord(t *testing.T) {
	w := newWorld(t)
	legacy := t.TempDir()
	running := bootTime.Add(10 * time.Minute)
	legacyPath := w.legacyLease(legacy, "10.0.0.2", "oldstyle", running)

	if err := w.migrate.Migrate(w.dir(), legacy); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	log := w.log.String()
	w.migrated(1, 0, 0)
	if b, err := os.ReadFile(filepath.Join(w.dataDir, net1, "10.0.0.2")); err != nil || string(b) != "oldstyle" {
		t.Errorf("copy = %q, %v; want the lease moved", b, err)
	}
	if _, err := os.Stat(legacyPath); err == nil {
		t.Errorf("the legacy lease of an attachment with no record stayed; log:\n%s", log)
	}
	if !strings.Contains(log, "its legacy lease is removed instead") {
		t.Errorf("the log does not say why the legacy lease went:\n%s", log)
	}
}
