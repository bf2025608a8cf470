package reclaim

import (
	"errors"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/netfilter"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/records"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/sysinfo"
)

// detach makes cid's path fail the way Nomad leaves it after a failed
// CHECK (how: "gone", "unmounted" or "replaced"), while a task (pid 20420,
// python3) still runs in the recorded namespace.
func (w *world) detach(cid, how string, holders ...sysinfo.Holder) sysinfo.NetnsID {
	w.t.Helper()
	path := "/run/netns/" + cid
	id := w.host.Namespaces[path]
	switch how {
	case "gone":
		delete(w.host.Namespaces, path)
	case "unmounted":
		delete(w.host.Namespaces, path)
		w.host.NotNetns[path] = true
	case "replaced":
		w.nextIno++
		w.host.Namespaces[path] = sysinfo.NetnsID{Dev: 4, Ino: w.nextIno}
	default:
		w.t.Fatalf("detach: unknown way %q", how)
	}
	w.host.Holders[id] = append(w.host.Holders[id], holders...)
	return id
}

var task = sysinfo.Holder{PID: 20420, Command: "python3"}

func TestSweepKeepsAnAttachmentWhoseNamespaceIsStillHeld(t *testing.T) {
	for _, how := range []string{"gone", "unmounted", "replaced"} {
		t.Run(how, func(t *testing.T) {
			w := newWorld(t)
			w.container("held", "10.0.0.2")
			w.container("free", "10.0.0.3")
			heldID := w.detach("held", how, task)
			w.detach("free", how) // nothing holds it: dead
			// A process in some other namespace changes nothing.
			w.host.Holders[sysinfo.NetnsID{Dev: 4, Ino: 1}] = []sysinfo.Holder{{PID: 1, Command: "init"}}

			rep := w.sweep(Request{})

			var held *Attachment
			for _, a := range rep.Attachments {
				if a.Key.ContainerID == "held" {
					held = a
				}
			}
			if held == nil || held.Verdict.State != Detached {
				t.Fatalf("verdicts = %v, want held detached", verdicts(rep))
			}
			want := "namespace net:[" + itoa(heldID.Ino) + "] still held by pid 20420 (python3)"
			if held.Verdict.Reason != want || held.Verdict.Holder == nil || held.Verdict.Holder.PID != 20420 {
				t.Errorf("verdict = %+v, want reason %q", held.Verdict, want)
			}
			if verdicts(rep)["free"] != Stale {
				t.Errorf("free: %s, want stale", verdicts(rep)["free"])
			}
			equal(t, "leases left", w.leases(), []string{"10.0.0.2"})
			if !w.hasRecord("held") || !w.nat.Owns(net1, "held") {
				t.Error("the detached attachment lost its record or NAT rules")
			}
			if w.host.HolderScans != 1 {
				t.Errorf("%d holder scans, want one per sweep", w.host.HolderScans)
			}
		})
	}
}

func TestHeldByAMountIsDetachedToo(t *testing.T) {
	w := newWorld(t)
	w.container("c1", "10.0.0.2")
	w.detach("c1", "gone", sysinfo.Holder{Mount: "/run/docker/netns/abc"})
	rep := w.sweep(Request{})
	if got := rep.Attachments[0].Verdict; got.State != Detached || !strings.Contains(got.Reason, "still held by mount /run/docker/netns/abc") {
		t.Errorf("verdict = %v", got)
	}
}

// A younger namespace that got the recorded inode number is not the
// recorded one: its cookie tells them apart.
func TestAHolderOfAReusedInodeIsNotTheRecordedNamespace(t *testing.T) {
	for _, tc := range []struct {
		recorded, held uint64
		want           State
	}{
		{recorded: 6108, held: 6113, want: Stale},
		{recorded: 6108, held: 6108, want: Detached},
		// The kernel could not say at ADD (before 5.14): the inode decides.
		{recorded: 0, held: 6113, want: Detached},
	} {
		w := newWorld(t)
		w.container("c1", "10.0.0.2")
		w.recordCookie("c1", tc.recorded)
		id := w.detach("c1", "gone", task)
		w.host.HolderCookies[id] = tc.held
		rep := w.sweep(Request{})
		if got := rep.Attachments[0].Verdict.State; got != tc.want {
			t.Errorf("recorded cookie %d, holder's %d: %s, want %s", tc.recorded, tc.held, got, tc.want)
		}
	}
}

func TestAHealthySweepScansNoProcesses(t *testing.T) {
	w := newWorld(t)
	for i, cid := range []string{"a", "b", "c"} {
		w.container(cid, "10.0.0."+itoa(uint64(i+2)))
	}
	w.sweep(Request{})
	w.sweep(Request{DryRun: true, Orphans: true})
	if w.host.HolderScans != 0 {
		t.Errorf("%d holder scans while every namespace path is intact", w.host.HolderScans)
	}
}

func TestReAddIsRefusedWhileTheOldNamespaceIsHeld(t *testing.T) {
	w := newWorld(t)
	w.container("c1", "10.0.0.2")
	id := w.detach("c1", "replaced", task)
	// The record directory's mtime aside: it moves with the count.
	recordDir := filepath.Dir(w.dir().Marker(ipamdir.ReleasesMarker))
	snapshot := func() string {
		var kept []string
		for line := range strings.Lines(snapshotDir(t, w.dataDir)) {
			if !strings.HasPrefix(line, recordDir+" ") {
				kept = append(kept, line)
			}
		}
		return strings.Join(kept, "")
	}
	before := snapshot()

	_, err := w.attach.BeginAdd(w.dir(), records.Key{ContainerID: "c1", IfName: "eth0"}, "/run/netns/c1")

	if !errors.Is(err, ErrStillAttached) {
		t.Fatalf("re-ADD with the old namespace held = %v, want ErrStillAttached", err)
	}
	for _, want := range []string{"c1/eth0 is still attached to " + net1, "net:[" + itoa(id.Ino) + "]", "pid 20420 (python3)", "Nothing to do by hand: the runtime stops the container and sends DEL"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	// The refusal is counted (metrics' add_refusals_total), and that
	// count is all it writes.
	if n := w.attach.Releases(w.dir())[RefusedLiveCount]; n != 1 {
		t.Errorf("refusal counted %d times, want 1", n)
	}
	if err := os.Remove(w.dir().Marker(ipamdir.ReleasesMarker)); err != nil {
		t.Fatal(err)
	}
	if after := snapshot(); after != before {
		t.Errorf("refused re-ADD changed the data directory:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if !w.nat.Owns(net1, "c1") || len(w.nat.Calls) != 0 {
		t.Errorf("refused re-ADD touched NAT rules: %v", w.nat.Calls)
	}

	// The task stopped: nothing holds the old namespace, re-ADD recovers.
	w.host.Holders[id] = nil
	if _, err := w.attach.BeginAdd(w.dir(), records.Key{ContainerID: "c1", IfName: "eth0"}, "/run/netns/c1"); err != nil {
		t.Fatalf("re-ADD once nothing holds the old namespace: %v", err)
	}
	if len(w.leases()) != 0 || w.nat.Owns(net1, "c1") {
		t.Errorf("old attachment not released: leases %v", w.leases())
	}
}

func itoa(n uint64) string { return strconv.FormatUint(n, 10) }

// recordCookie sets the namespace cookie cid's record carries.
func (w *world) recordCookie(cid string, cookie uint64) {
	w.t.Helper()
	store := records.NewStore(w.dir())
	r, err := store.Read(records.Key{ContainerID: cid, IfName: "eth0"})
	if err != nil || r == nil {
		w.t.Fatalf("read record of %s: %v", cid, err)
	}
	r.NetnsCookie = cookie
	if err := store.Write(r); err != nil {
		w.t.Fatal(err)
	}
}

// A process in the recorded namespace whose namespace cannot be entered to
// confirm it (a user's rootless container, looked at by that user outside
// its namespaces: setns is not allowed) proves nothing either way: the
// attachment is kept, as unknown, and nothing of it is released.
func TestAHolderThatCannotBeConfirmedKeepsTheAttachment(t *testing.T) {
	w := newWorld(t)
	w.container("c1", "10.0.0.2")
	w.recordCookie("c1", 6108)
	id := w.detach("c1", "unmounted", task)
	w.host.HolderErrs = map[sysinfo.NetnsID]error{id: errors.New("setns: operation not permitted")}

	rep := w.sweep(Request{})
	v := rep.Attachments[0].Verdict
	if v.State != Unknown || !strings.Contains(v.Reason, "operation not permitted") {
		t.Fatalf("verdict = %v, want unknown, saying why", v)
	}
	equal(t, "leases left", w.leases(), []string{"10.0.0.2"})
	if !w.hasRecord("c1") || !w.nat.Owns(net1, "c1") {
		t.Error("an attachment that could not be judged lost its record or NAT rules")
	}
}

// Every release is counted by its cause, across runs; a dry run and a
// sweep with nothing to release count nothing.
func TestReleasesAreCountedByCause(t *testing.T) {
	w := newWorld(t)
	w.container("gone", "10.0.0.2")
	w.detach("gone", "gone")
	w.container("old", "10.0.0.3")
	w.record(&records.Record{ContainerID: "old", IfName: "eth0", Netns: "/run/netns/old", NetnsID: w.host.Namespaces["/run/netns/old"], BootID: "boot-0", State: records.Complete})
	w.sweep(Request{DryRun: true})
	if got := w.sweeper.Releases(w.dir()); len(got) != 0 {
		t.Fatalf("a dry run counted %v", got)
	}
	w.sweep(Request{})
	w.sweep(Request{})
	w.container("again", "10.0.0.4")
	w.detach("again", "replaced")
	w.sweep(Request{})
	want := map[string]int{CauseNamespaceGone: 2, CauseEarlierBoot: 1}
	if got := w.sweeper.Releases(w.dir()); !maps.Equal(got, want) {
		t.Errorf("release counts = %v, want %v", got, want)
	}
}

// A re-ADD whose earlier attachment cannot be judged (a holder of its
// namespace that cannot be confirmed) is refused, and the refusal says
// that it cannot tell and why, not that the namespace is live.
func TestReAddRefusalSaysWhyItCannotTell(t *testing.T) {
	w := newWorld(t)
	w.container("c1", "10.0.0.2")
	w.recordCookie("c1", 6108)
	id := w.detach("c1", "replaced", task)
	w.host.HolderErrs = map[sysinfo.NetnsID]error{id: errors.New("setns: operation not permitted")}

	_, err := w.attach.BeginAdd(w.dir(), records.Key{ContainerID: "c1", IfName: "eth0"}, "/run/netns/c1")
	var addErr *AddError
	if !errors.As(err, &addErr) || addErr.Kind != ErrStillAttached {
		t.Fatalf("re-ADD: %v, want a refusal", err)
	}
	if strings.Contains(addErr.Msg, "live namespace") || !strings.Contains(addErr.Msg, "cannot tell") || !strings.Contains(addErr.Detail, "operation not permitted") {
		t.Errorf("refusal: %q (detail %q); want it to say it cannot tell, and why", addErr.Msg, addErr.Detail)
	}
	equal(t, "leases left", w.leases(), []string{"10.0.0.2"})
}

// An attachment is counted released once it went, not each time a sweep
// tried: one whose NAT rules cannot go keeps its files and is counted
// only by the sweep that finally releases it (regression: every sweep
// that kept it counted it, so the release counter grew while nothing
// went).
func TestAttachmentsKeptAreNotCountedReleased(t *testing.T) {
	w := newWorld(t)
	w.container("gone", "10.0.0.2")
	w.detach("gone", "gone")
	w.sweeper.Netfilter = &netfilter.Cleaner{Tables: []netfilter.Table{failingTable{Table: w.nat}}}
	for range 3 {
		if _, err := w.sweeper.Sweep(Request{Dir: w.dir()}); err == nil {
			t.Fatal("a sweep whose NAT release failed reports no error")
		}
	}
	if got := w.sweeper.Releases(w.dir()); len(got) != 0 {
		t.Errorf("kept attachment counted released: %v", got)
	}
	w.sweeper.Netfilter = w.env.Netfilter
	w.sweep(Request{})
	if got, want := w.sweeper.Releases(w.dir()), map[string]int{CauseNamespaceGone: 1}; !maps.Equal(got, want) {
		t.Errorf("release counts = %v, want %v", got, want)
	}
}

// Likewise the addresses whose firewall rules a release kept (another
// network leases them) are counted with the release, not with each sweep
// whose release of the attachment failed after them.
func TestFirewallRulesKeptAreCountedWithTheRelease(t *testing.T) {
	w := newWorld(t)
	w.record(&records.Record{ContainerID: "gone", IfName: "eth0", Netns: "/run/netns/gone", NetnsID: sysinfo.NetnsID{Dev: 4, Ino: 77}, BootID: w.host.ID, State: records.Complete, IPs: []string{"10.0.0.3/24", "10.0.0.4/24"}})
	for _, ip := range []string{"10.0.0.3", "10.0.0.4"} {
		w.lease(ip, "gone\r\neth0", bootTime.Add(time.Minute))
		w.nat.AddForward(ip)
	}
	plantLease(t, w.dataDir, "other-net", "10.0.0.3")
	w.sweeper.Netfilter = &netfilter.Cleaner{Tables: []netfilter.Table{failingTable{Table: w.nat}}}
	for range 3 {
		if _, err := w.sweeper.Sweep(Request{Dir: w.dir()}); err == nil {
			t.Fatal("a sweep whose firewall release failed reports no error")
		}
	}
	if got := w.sweeper.Releases(w.dir()); len(got) != 0 {
		t.Errorf("kept attachment counted: %v", got)
	}
	w.sweeper.Netfilter = w.env.Netfilter
	w.sweep(Request{})
	if got, want := w.sweeper.Releases(w.dir()), map[string]int{CauseNamespaceGone: 1, ForwardKeptCount: 1}; !maps.Equal(got, want) {
		t.Errorf("release counts = %v, want %v", got, want)
	}
}
