package reclaim

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/records"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/sysinfo"
)

// Nomad re-creates a lost allocation's namespace, then restores the others
// with CHECK, whose sweep may come before the lost one's ADD: that sweep
// releases it (its namespace was replaced), and the ADD must still ask for
// the address it had (regression: it got the next free one).
func TestARestoreAfterASweepAsksForTheAddressItHad(t *testing.T) {
	w := newWorld(t)
	w.container("lost", "10.0.0.3")
	w.container("other", "10.0.0.4")
	w.host.Namespaces["/run/netns/lost"] = sysinfo.NetnsID{Dev: 4, Ino: 9999} // re-created
	rep := w.sweep(Request{})
	if v := verdicts(rep)["lost"]; v != Stale {
		t.Fatalf("lost: %s, want stale", v)
	}
	if w.hasRecord("lost") {
		t.Fatal("record kept")
	}
	att, err := w.attach.BeginAdd(w.dir(), records.Key{ContainerID: "lost", IfName: "eth0"}, "/run/netns/lost")
	if err != nil {
		t.Fatal(err)
	}
	defer att.Close()
	if strings.Join(att.Previous, ",") != "10.0.0.3/24" {
		t.Errorf("the restore asks for %v, want 10.0.0.3/24", att.Previous)
	}
	// Nothing in the data dir names the container the sweep released.
	if b, _ := os.ReadFile(w.dir().Marker(ipamdir.RememberedMarker)); len(b) == 0 || strings.Contains(string(b), "lost") {
		t.Errorf("the remembered marker names the released container, or is empty: %s", b)
	}
	// Once the ADD completes, the record names the addresses again.
	if err := att.Complete([]string{"10.0.0.3/24"}); err != nil {
		t.Fatal(err)
	}
	if got := Remembered(w.dir(), records.Key{ContainerID: "lost", IfName: "eth0"}); got != nil {
		t.Errorf("still remembered after the ADD completed: %v", got)
	}
	// Another container of the network never had an address here.
	fresh, err := w.attach.BeginAdd(w.dir(), records.Key{ContainerID: "new", IfName: "eth0"}, "/run/netns/other")
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	if len(fresh.Previous) != 0 {
		t.Errorf("a new container asks for %v", fresh.Previous)
	}
}

// A DEL forgets what a sweep remembered of its attachment.
func TestDelForgetsTheRememberedAddresses(t *testing.T) {
	w := newWorld(t)
	key := records.Key{ContainerID: "gone", IfName: "eth0"}
	if err := w.env.remember(w.dir(), rememberIn(nil, key, []string{"10.0.0.5/24"}, w.host.Now())); err != nil {
		t.Fatal(err)
	}
	if err := w.attach.EndDel(w.dir(), key); err != nil {
		t.Fatal(err)
	}
	if got := Remembered(w.dir(), key); got != nil {
		t.Errorf("still remembered after its DEL: %v", got)
	}
}

// The memory is bounded: the oldest entries go first.
func TestRememberedIsBounded(t *testing.T) {
	w := newWorld(t)
	for i := 0; i < maxRemembered+5; i++ {
		w.host.Clock = w.host.Clock.Add(1e9)
		key := records.Key{ContainerID: "c" + string(rune('a'+i%26)) + strings.Repeat("x", i/26), IfName: "eth0"}
		if err := w.env.remember(w.dir(), rememberIn(nil, key, []string{"10.0.0.2/24"}, w.host.Now())); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(readRemembered(w.dir())); n != maxRemembered {
		t.Errorf("%d entries, want %d", n, maxRemembered)
	}
	if got := Remembered(w.dir(), records.Key{ContainerID: "ca", IfName: "eth0"}); got != nil {
		t.Errorf("the oldest entry is kept: %v", got)
	}
}

// A sweep writes what it remembers once, however many attachments it
// releases (regression: it rewrote the marker, up to 48 KiB, for each
// one, and a gc of a leaked /20's 3000 leases took 4 s instead of 0.2).
func TestASweepWritesTheRememberedAddressesOnce(t *testing.T) {
	w := newWorld(t)
	const n = 40
	for i := range n {
		cid := fmt.Sprintf("lost%02d", i)
		w.container(cid, fmt.Sprintf("10.0.0.%d", i+2))
		delete(w.host.Namespaces, "/run/netns/"+cid)
	}
	marker := w.dir().Marker(ipamdir.RememberedMarker)
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	// IN_CREATE too: the kernel merges identical events in a row, and
	// each write's temp file comes between two renames.
	if _, err := unix.InotifyAddWatch(fd, filepath.Dir(marker), unix.IN_MOVED_TO|unix.IN_CREATE); err != nil {
		t.Fatal(err)
	}
	if rep := w.sweep(Request{}); rep.Released != n {
		t.Fatalf("released %d, want %d", rep.Released, n)
	}
	writes := 0
	buf := make([]byte, 64<<10)
	for {
		m, err := unix.Read(fd, buf)
		if err == unix.EAGAIN {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		for off := 0; off+unix.SizeofInotifyEvent <= m; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			name := strings.TrimRight(string(buf[off+unix.SizeofInotifyEvent:off+unix.SizeofInotifyEvent+int(ev.Len)]), "\x00")
			if ev.Mask&unix.IN_MOVED_TO != 0 && name == filepath.Base(marker) {
				writes++
			}
			off += unix.SizeofInotifyEvent + int(ev.Len)
		}
	}
	if writes != 1 {
		t.Errorf("the sweep wrote %s %d times, want once", filepath.Base(marker), writes)
	}
	for i := range n {
		key := records.Key{ContainerID: fmt.Sprintf("lost%02d", i), IfName: "eth0"}
		if got := Remembered(w.dir(), key); len(got) != 1 {
			t.Errorf("%s: remembered %v", key, got)
		}
	}
}

// An ADD of a container a sweep just released, made while that sweep still
// runs (a `gc` timer's, another runtime's CHECK), asks for the address the
// container had: the ADD reads no lock, so the addresses are remembered
// before the record goes (regression: they were written at the sweep's
// end, and an ADD in between got the next free address).
func TestARestoreDuringTheSweepAsksForTheAddressItHad(t *testing.T) {
	w := newWorld(t)
	w.container("lost", "10.0.0.3")
	w.container("later", "10.0.0.4")
	for _, cid := range []string{"lost", "later"} {
		w.host.Namespaces["/run/netns/"+cid] = sysinfo.NetnsID{Dev: 4, Ino: 9999} // re-created
	}
	key := records.Key{ContainerID: "lost", IfName: "eth0"}
	var previous []string
	released := 0
	rep, err := w.sweeper.Sweep(Request{Dir: w.dir(), Released: func(rel Release) {
		released++
		if rel.Key != key {
			return
		}
		att, err := w.attach.BeginAdd(w.dir(), key, "/run/netns/lost")
		if err != nil {
			t.Fatal(err)
		}
		defer att.Close()
		previous = att.Previous
	}})
	if err != nil || rep.Released != 2 || released != 2 {
		t.Fatalf("released %+v (%d shown), %v; want 2", rep, released, err)
	}
	if strings.Join(previous, ",") != "10.0.0.3/24" {
		t.Errorf("the restore during the sweep asks for %v, want 10.0.0.3/24", previous)
	}
}

// An attachment whose ADD got its address but never completed its record
// (the plugin killed after bridge returned, or a full data dir refused the
// record's last write) keeps that address when restored in place: its
// lease says what it had (regression: only a complete record's addresses
// were asked for again, by the ADD that released it and after a sweep).
func TestARestoreOfAnUnfinishedRecordAsksForItsLeasedAddress(t *testing.T) {
	for _, sweptFirst := range []bool{false, true} {
		w := newWorld(t)
		w.host.Namespaces["/run/netns/lost"] = sysinfo.NetnsID{Dev: 4, Ino: 9999} // re-created
		w.record(&records.Record{ContainerID: "lost", IfName: "eth0", Netns: "/run/netns/lost", NetnsID: sysinfo.NetnsID{Dev: 4, Ino: 5}, BootID: w.host.ID, State: records.Started, PID: 31337, PIDStart: 1})
		w.lease("10.0.0.3", "lost\r\neth0", bootTime.Add(time.Minute))
		if sweptFirst {
			if v := verdicts(w.sweep(Request{}))["lost"]; v != Stale || w.hasRecord("lost") {
				t.Fatalf("lost: %s, record kept %v; want it released", v, w.hasRecord("lost"))
			}
		}
		att, err := w.attach.BeginAdd(w.dir(), records.Key{ContainerID: "lost", IfName: "eth0"}, "/run/netns/lost")
		if err != nil {
			t.Fatal(err)
		}
		att.Close()
		if len(att.Previous) != 1 || !strings.HasPrefix(att.Previous[0], "10.0.0.3/") {
			t.Errorf("swept first %v: the restore asks for %v, want 10.0.0.3", sweptFirst, att.Previous)
		}
		if got := w.leases(); len(got) != 0 {
			t.Errorf("swept first %v: leases left %v", sweptFirst, got)
		}
	}
}

// A restore in place whose first ADD fails (Nomad tries three times, with
// no DEL between: bridge's race creating the bridge, an iptables lock)
// still asks for the address the container had on the next try, though
// the first one released the record that named it (regression: the retry
// got the next free address).
func TestARetriedRestoreAsksForTheAddressItHad(t *testing.T) {
	w := newWorld(t)
	w.container("lost", "10.0.0.3")
	w.host.Namespaces["/run/netns/lost"] = sysinfo.NetnsID{Dev: 4, Ino: 9999} // re-created
	key := records.Key{ContainerID: "lost", IfName: "eth0"}
	for try := 1; try <= 2; try++ {
		att, err := w.attach.BeginAdd(w.dir(), key, "/run/netns/lost")
		if err != nil {
			t.Fatal(err)
		}
		if strings.Join(att.Previous, ",") != "10.0.0.3/24" {
			t.Errorf("try %d asks for %v, want 10.0.0.3/24", try, att.Previous)
		}
		if try == 2 {
			if err := att.Complete([]string{"10.0.0.3/24"}); err != nil {
				t.Fatal(err)
			}
			break
		}
		if err := att.Abort(); err != nil { // its delegate failed
			t.Fatal(err)
		}
	}
	if got := Remembered(w.dir(), key); got != nil {
		t.Errorf("still remembered after the ADD completed: %v", got)
	}
}
