package plugin

import (
	"context"
	"errors"
	"os"
	"testing"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/records"
)

// The ADD delegate inherits the pending record's lock, so a sweep counts
// the ADD as running while the delegate does; the rollback DEL does not
// (it is not the ADD's), and the plugin drops its own hold when ADD ends.
func TestAddHandsTheRecordLockToTheADDDelegateOnly(t *testing.T) {
	h := newHarness(t, "bridge")
	h.exec.fail["bridge ADD"] = errors.New("signal: killed")
	h.exec.fail["bridge DEL"] = errors.New("signal: killed")
	store := records.NewStore(ipamdir.New(h.dataDir, "nomad"))
	key := records.Key{ContainerID: "c1", IfName: "eth0"}
	var sameFile bool
	h.exec.onExec = func() {
		call := h.exec.calls[len(h.exec.calls)-1]
		if call.Command != "ADD" || call.Inherited == nil {
			return
		}
		held, err1 := call.Inherited.Stat()
		rec, err2 := os.Stat(store.PathOf(key))
		sameFile = err1 == nil && err2 == nil && os.SameFile(held, rec)
	}
	if err := h.plugin.Funcs().Add(h.args(h.conf("1.0.0", ""))); err == nil {
		t.Fatal("ADD succeeded")
	}
	if len(h.exec.calls) != 2 || !sameFile || h.exec.calls[1].Inherited != nil {
		t.Fatalf("calls %+v: want the ADD to inherit the pending record (%v) and the rollback DEL nothing", h.exec.calls, sameFile)
	}
	// The rollback failed: the record stays pending for a sweep, judged by
	// its processes, and this one is done with it.
	if r := h.record(); r == nil || r.State != records.Started {
		t.Errorf("record = %+v, want it pending", r)
	}
	if running, err := store.AddRunning(key); running || err != nil {
		t.Errorf("AddRunning after ADD returned = %v, %v", running, err)
	}
}

// The file handed to Inheriting reaches the delegate as fd 3, and the
// delegate's own children inherit it in turn.
func TestDelegateExecPassesTheInheritedFileDown(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "lock")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	e := (&delegateExec{}).Inheriting(f)
	out, err := e.ExecPlugin(context.Background(), script(t, `readlink /proc/$$/fd/3; sh -c 'readlink /proc/$$/fd/3'`), nil, os.Environ())
	if err != nil {
		t.Fatal(err)
	}
	if want := f.Name() + "\n" + f.Name() + "\n"; string(out) != want {
		t.Errorf("fd 3 of the delegate and its child = %q, want %q", out, want)
	}
}
