package reclaim

import (
	"errors"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/records"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/sysinfo"
)

// lockedRecord writes r as w.record does, then again as BeginAdd does,
// locked; the returned file stands for the delegate still holding it.
func (w *world) lockedRecord(r *records.Record) *os.File {
	w.t.Helper()
	w.record(r)
	held, err := records.NewStore(w.dir()).WriteLocked(r)
	if err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(func() { held.Close() })
	return held
}

// The plugin of an ADD was killed (its pid is dead) while its delegate
// runs on and holds the record's lock: every sweep keeps the attachment,
// whatever its namespace says, until the lock is free; the next sweep
// then judges it by the usual rules.
func TestSweepKeepsAnADDWhoseDelegateStillRuns(t *testing.T) {
	for _, tc := range []struct {
		name, netns string
		lease       bool
		after       State
	}{
		{"namespace gone, address allocated", "/run/netns/gone", true, Stale},
		{"namespace there, nothing allocated yet", "/run/netns/alive", false, Stale},
		{"namespace there, address allocated", "/run/netns/alive", true, Live},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			w.host.Namespaces["/run/netns/alive"] = sysinfo.NetnsID{Dev: 4, Ino: 5}
			held := w.lockedRecord(&records.Record{ContainerID: "killed", IfName: "eth0", Netns: tc.netns, NetnsID: sysinfo.NetnsID{Dev: 4, Ino: 5}, BootID: w.host.ID, State: records.Started, PID: 31337, PIDStart: 1})
			if tc.lease {
				w.lease("10.0.0.2", "killed\r\neth0", bootTime.Add(time.Minute))
				w.nat.AddContainer(net1, "killed", "10.0.0.2", 0)
			}

			for _, req := range []Request{{}, {GC: true}} {
				rep := w.sweep(req)
				if len(rep.Attachments) != 1 || rep.Attachments[0].Verdict.State != Pending || !strings.Contains(rep.Attachments[0].Verdict.Reason, "delegate still runs") {
					t.Fatalf("sweep %+v while the delegate runs: %v", req, rep.Attachments[0].Verdict)
				}
				if !w.hasRecord("killed") || (tc.lease && (len(w.leases()) != 1 || !w.nat.Owns(net1, "killed"))) {
					t.Fatalf("sweep %+v released part of a running ADD: leases %v, log %q", req, w.leases(), w.log)
				}
			}

			held.Close()
			rep := w.sweep(Request{})
			if got := rep.Attachments[0].Verdict.State; got != tc.after {
				t.Fatalf("verdict once the delegate is gone = %v, want %s", rep.Attachments[0].Verdict, tc.after)
			}
			if tc.after == Stale && (w.hasRecord("killed") || len(w.leases()) != 0 || w.nat.Owns(net1, "killed")) {
				t.Errorf("stale ADD not released: record %v, leases %v, log %q", w.hasRecord("killed"), w.leases(), w.log)
			}
		})
	}
}

// A new ADD of the same attachment waits (code 11) while the earlier
// ADD's delegate runs, and releases the earlier one once it is gone.
func TestBeginAddWaitsForTheDelegateOfAKilledADD(t *testing.T) {
	w := newWorld(t)
	w.host.Namespaces["/run/netns/c1"] = sysinfo.NetnsID{Dev: 4, Ino: 5}
	key := records.Key{ContainerID: "c1", IfName: "eth0"}
	held := w.lockedRecord(&records.Record{ContainerID: "c1", IfName: "eth0", Netns: "/run/netns/c1", NetnsID: sysinfo.NetnsID{Dev: 4, Ino: 5}, BootID: w.host.ID, State: records.Started, PID: 31337, PIDStart: 1})

	_, err := w.attach.BeginAdd(w.dir(), key, "/run/netns/c1")
	if !errors.Is(err, ErrAddInProgress) || !strings.Contains(err.Error(), "delegate still runs") {
		t.Fatalf("BeginAdd while the earlier delegate runs = %v, want ErrAddInProgress", err)
	}

	held.Close()
	att, err := w.attach.BeginAdd(w.dir(), key, "/run/netns/c1")
	if err != nil {
		t.Fatalf("BeginAdd once the earlier ADD is gone: %v", err)
	}
	defer att.Close()
	if att.Record.PID != os.Getpid() || !strings.Contains(w.log.String(), "died before an address was allocated") {
		t.Errorf("earlier ADD not replaced: record %+v, log %q", att.Record, w.log)
	}
}

// A DEL of an attachment whose killed ADD's delegate still runs waits for
// it: past its bound it is refused (ErrAddInProgress) with nothing changed,
// and it goes on as soon as the delegate lets go of the record's lock.
func TestWaitForAddWaitsForTheDelegateOfAKilledADD(t *testing.T) {
	w := newWorld(t)
	key := records.Key{ContainerID: "c1", IfName: "eth0"}
	if err := w.attach.WaitForAdd(w.dir(), key, 0); err != nil {
		t.Fatalf("WaitForAdd with no record: %v", err)
	}
	held := w.lockedRecord(&records.Record{ContainerID: "c1", IfName: "eth0", Netns: "/run/netns/c1", NetnsID: sysinfo.NetnsID{Dev: 4, Ino: 5}, BootID: w.host.ID, State: records.Started, PID: 31337, PIDStart: 1})
	err := w.attach.WaitForAdd(w.dir(), key, 50*time.Millisecond)
	if !errors.Is(err, ErrAddInProgress) || !strings.Contains(err.Error(), "delegate still runs") {
		t.Fatalf("WaitForAdd while the delegate runs = %v, want ErrAddInProgress", err)
	}
	if !w.hasRecord("c1") {
		t.Fatal("WaitForAdd removed the pending record")
	}
	time.AfterFunc(100*time.Millisecond, func() { held.Close() })
	if err := w.attach.WaitForAdd(w.dir(), key, time.Minute); err != nil {
		t.Fatalf("WaitForAdd once the delegate let go: %v", err)
	}
}

// A DEL that comes right as the killed ADD began, and whose delegate hangs,
// waits until that ADD's deadline has passed, ends the overdue delegate as
// a sweep would, and goes on (docs/reclaim.md: "past the record's
// deadline, ends them"). Regression: the deadline is written rounded up to
// the next second plus one, and is past only a second after that, so such
// a DEL gave up (ErrAddInProgress) up to two seconds before it, having
// ended nothing, however long its bound.
func TestWaitForAddEndsTheOverdueDelegateOfAnADDBegunJustBefore(t *testing.T) {
	w := newWorld(t)
	const bound = 100 * time.Millisecond
	// Just before a whole second, so that the test takes a second and a
	// bit, not two.
	w.host.Clock = w.host.Clock.Truncate(time.Second).Add(-110 * time.Millisecond)
	w.host.Ticking = time.Now()
	key := records.Key{ContainerID: "c1", IfName: "eth0"}
	// As BeginAdd writes it, with the same bound, as the clock starts:
	// past at the whole second after next, 1.11 s on.
	deadline := uint64(w.host.Clock.Add(bound).Unix()) + 1
	held := w.lockedRecord(&records.Record{ContainerID: "c1", IfName: "eth0", Netns: "/run/netns/c1", NetnsID: sysinfo.NetnsID{Dev: 4, Ino: 5}, BootID: w.host.ID, State: records.Started, PID: 31337, PIDStart: 1, Deadline: deadline})
	const delegate = 31338
	w.host.LockHolders = map[string][]int{records.NewStore(w.dir()).PathOf(key): {delegate}}
	w.host.OnKill = func(string) { held.Close() }

	if err := w.attach.WaitForAdd(w.dir(), key, bound); err != nil {
		t.Fatalf("WaitForAdd of an ADD whose delegate hangs = %v, want it ended once overdue (deadline %d, now %d, killed %v)", err, deadline, w.host.Now().Unix(), w.host.Killed)
	}
	if !slices.Equal(w.host.Killed, []int{delegate}) {
		t.Errorf("killed %v, want the overdue delegate %d", w.host.Killed, delegate)
	}
}

// BeginAdd's pending record is locked from the start; Complete and Abort
// drop the lock once the pending record is replaced or gone.
func TestBeginAddHoldsTheLockUntilCompleteOrAbort(t *testing.T) {
	for _, end := range []string{"complete", "abort"} {
		t.Run(end, func(t *testing.T) {
			w := newWorld(t)
			w.host.Namespaces["/run/netns/c1"] = sysinfo.NetnsID{Dev: 4, Ino: 5}
			key := records.Key{ContainerID: "c1", IfName: "eth0"}
			store := records.NewStore(w.dir())
			att, err := w.attach.BeginAdd(w.dir(), key, "/run/netns/c1")
			if err != nil {
				t.Fatal(err)
			}
			if running, err := store.AddRunning(key); !running || err != nil || att.LockFile == nil {
				t.Fatalf("pending record: AddRunning = %v, %v; lock file %v", running, err, att.LockFile)
			}
			if end == "complete" {
				err = att.Complete([]string{"10.0.0.2/24"})
			} else {
				err = att.Abort()
			}
			if err != nil {
				t.Fatal(err)
			}
			if running, err := store.AddRunning(key); running || err != nil || att.LockFile != nil {
				t.Errorf("after %s: AddRunning = %v, %v; lock file %v", end, running, err, att.LockFile)
			}
		})
	}
}

// The plugin was killed after bridge finished and before the record was
// completed: the record stays pending with no addresses while the
// container works. The runtime's retry, a re-ADD into the same live
// namespace, must not take it for an ADD that died before allocating
// (regression: it released the live container's lease and NAT rules, and a
// second container could be given the address). What host-local and the
// namespace hold decides, not the record alone.
func TestReADDAfterAKilledADDKeepsWhatItGot(t *testing.T) {
	for _, tc := range []struct {
		name     string
		lease    string // the lease's content, "" for none
		linkAddr string // an address on eth0 in the namespace, "" for none
		released bool
	}{
		{name: "lease and address", lease: "killed\r\neth0", linkAddr: "10.0.0.2", released: false},
		{name: "lease only", lease: "killed\r\neth0", released: false},
		{name: "address only", linkAddr: "10.0.0.2", released: false},
		{name: "link-local address only", linkAddr: "fe80::1", released: true},
		{name: "nothing", released: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			ns := sysinfo.NetnsID{Dev: 4, Ino: 5}
			w.host.Namespaces["/run/netns/alive"] = ns
			key := records.Key{ContainerID: "killed", IfName: "eth0"}
			// Written as BeginAdd writes it; its plugin (pid 31337) is gone
			// and nothing holds its lock.
			w.record(&records.Record{ContainerID: "killed", IfName: "eth0", Netns: "/run/netns/alive", NetnsID: ns, BootID: w.host.ID, State: records.Started, PID: 31337, PIDStart: 1})
			if tc.lease != "" {
				w.lease("10.0.0.2", tc.lease, bootTime.Add(time.Minute))
				w.nat.AddContainer(net1, "killed", "10.0.0.2", 0)
			}
			if tc.linkAddr != "" {
				w.host.Links["/run/netns/alive eth0"] = []net.IP{net.ParseIP(tc.linkAddr)}
			}

			att, err := w.attach.BeginAdd(w.dir(), key, "/run/netns/alive")
			if tc.released {
				if err != nil {
					t.Fatalf("re-ADD after an ADD that got nothing: %v", err)
				}
				att.Close()
				return
			}
			if !errors.Is(err, ErrStillAttached) {
				t.Fatalf("re-ADD into the live namespace = %v, want ErrStillAttached (log %q)", err, w.log)
			}
			if tc.lease != "" && (len(w.leases()) != 1 || !w.nat.Owns(net1, "killed")) {
				t.Errorf("re-ADD released the live container's lease or NAT rules: leases %v, log %q", w.leases(), w.log)
			}
			if !w.hasRecord("killed") {
				t.Error("re-ADD dropped the record")
			}
			// A sweep keeps it too.
			if v := verdicts(w.sweep(Request{}))["killed"]; v != Live {
				t.Errorf("sweep verdict = %s, want live", v)
			}
		})
	}
}
