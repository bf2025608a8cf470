package reclaim

import (
	"os"
	"strings"
	"testing"

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
	if err := w.env.remember(w.dir(), key, []string{"10.0.0.5/24"}); err != nil {
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
		if err := w.env.remember(w.dir(), records.Key{ContainerID: "c" + string(rune('a'+i%26)) + strings.Repeat("x", i/26), IfName: "eth0"}, []string{"10.0.0.2/24"}); err != nil {
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
