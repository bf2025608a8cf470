package plugin

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/records"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/sysinfo"
)

func (h *harness) record() *records.Record {
	h.t.Helper()
	r, err := records.NewStore(ipamdir.New(h.dataDir, "nomad")).Read(records.Key{ContainerID: "c1", IfName: "eth0"})
	if err != nil {
		h.t.Fatal(err)
	}
	return r
}

func TestAddWritesPendingRecordBeforeDelegatingAndCompletesIt(t *testing.T) {
	h := newHarness(t, "bridge")
	var seenDuringDelegate *records.Record
	h.exec.reply["bridge ADD"] = bridgeResult100
	h.exec.onExec = func() { seenDuringDelegate = h.record() }
	if err := h.plugin.Funcs().Add(h.args(h.conf("1.0.0", ""))); err != nil {
		t.Fatal(err)
	}
	if seenDuringDelegate == nil || seenDuringDelegate.State != records.Started || seenDuringDelegate.PID != os.Getpid() {
		t.Errorf("record while the delegate ran = %+v, want pending with our pid", seenDuringDelegate)
	}
	r := h.record()
	if r == nil || r.State != records.Complete || r.Netns != "/var/run/netns/x" || r.NetnsID.Ino != 1000 || r.BootID != "boot-1" || strings.Join(r.IPs, ",") != "172.26.64.2/20" {
		t.Errorf("record after ADD = %+v", r)
	}
}

func TestFailedAddLeavesNoRecord(t *testing.T) {
	h := newHarness(t, "bridge")
	h.exec.fail["bridge ADD"] = types.NewError(types.ErrInternal, "boom", "")
	if err := h.plugin.Funcs().Add(h.args(h.conf("1.0.0", ""))); err == nil {
		t.Fatal("ADD succeeded")
	}
	if r := h.record(); r != nil {
		t.Errorf("record left after a failed ADD: %+v", r)
	}
}

func TestReAddIntoReplacedNamespaceSucceeds(t *testing.T) {
	h := newHarness(t, "bridge")
	h.exec.reply["bridge ADD"] = bridgeResult100
	if err := h.plugin.Funcs().Add(h.args(h.conf("1.0.0", ""))); err != nil {
		t.Fatal(err)
	}
	// A lease as host-local would have written it.
	lease := filepath.Join(h.dataDir, "nomad", "172.26.64.2")
	mkdir(t, filepath.Dir(lease))
	if err := os.WriteFile(lease, []byte("c1\r\neth0"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Same path, new namespace: what Nomad does when CHECK fails on restore.
	h.host.Namespaces["/var/run/netns/x"] = sysinfo.NetnsID{Dev: 4, Ino: 2000}
	h.stdout.Reset()
	if err := h.plugin.Funcs().Add(h.args(h.conf("1.0.0", ""))); err != nil {
		t.Fatalf("re-ADD: %v", err)
	}
	if _, err := os.Stat(lease); !os.IsNotExist(err) {
		t.Errorf("stale lease not released before delegating: %v", err)
	}
	if r := h.record(); r == nil || r.NetnsID.Ino != 2000 {
		t.Errorf("record = %+v, want the new namespace", r)
	}
	if !strings.Contains(h.stderr.String(), "was replaced") {
		t.Errorf("release not logged: %q", h.stderr.String())
	}

	// ADD again into the same live namespace is a real duplicate.
	err := h.plugin.Funcs().Add(h.args(h.conf("1.0.0", "")))
	if err == nil || !strings.Contains(err.Error(), "already attached") {
		t.Errorf("duplicate ADD = %v", err)
	}
}

func TestDelRemovesRecordAndIsIdempotent(t *testing.T) {
	h := newHarness(t, "bridge")
	h.exec.reply["bridge ADD"] = bridgeResult100
	if err := h.plugin.Funcs().Add(h.args(h.conf("1.0.0", ""))); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if err := h.plugin.Funcs().Del(h.args(h.conf("1.0.0", ""))); err != nil {
			t.Fatalf("DEL #%d: %v", i+1, err)
		}
	}
	if r := h.record(); r != nil {
		t.Errorf("record after DEL: %+v", r)
	}
}

func TestDelClearsNetnsForDelegateWhenNamespaceIsNotOne(t *testing.T) {
	h := newHarness(t, "bridge")
	h.host.NotNetns["/var/run/netns/gone"] = true
	t.Setenv("CNI_NETNS", "/var/run/netns/gone")
	args := h.args(h.conf("1.0.0", ""))
	args.Netns = "/var/run/netns/gone"
	if err := h.plugin.Funcs().Del(args); err != nil {
		t.Fatal(err)
	}
	if got := h.exec.only(t).Env["CNI_NETNS"]; got != "" {
		t.Errorf("delegate got CNI_NETNS=%q, want empty so bridge only releases the lease", got)
	}
	// The delegate's environment is built for it: the plugin's own is
	// not a control channel.
	if got := os.Getenv("CNI_NETNS"); got != "/var/run/netns/gone" {
		t.Errorf("the plugin's own CNI_NETNS became %q", got)
	}
}

func TestCheckSweepsTheNetworkButReturnsChecksVerdict(t *testing.T) {
	h := newHarness(t, "bridge")
	// A record whose namespace is gone, and its lease.
	gone := &records.Record{Version: records.FormatVersion, Network: "nomad", ContainerID: "dead", IfName: "eth0", Netns: "/var/run/netns/dead", BootID: "boot-1", State: records.Complete}
	if err := records.NewStore(ipamdir.New(h.dataDir, "nomad")).Write(gone); err != nil {
		t.Fatal(err)
	}
	lease := filepath.Join(h.dataDir, "nomad", "172.26.64.9")
	mkdir(t, filepath.Dir(lease))
	if err := os.WriteFile(lease, []byte("dead\r\neth0"), 0o600); err != nil {
		t.Fatal(err)
	}
	h.exec.fail["bridge CHECK"] = types.NewError(types.ErrInternal, "check failed", "")
	err := h.plugin.Funcs().Check(h.args(h.conf("1.0.0", "")))
	var cniErr *types.Error
	if !errors.As(err, &cniErr) || !strings.Contains(cniErr.Msg, "check failed") {
		t.Errorf("CHECK = %v, want the delegate's verdict", err)
	}
	if _, err := os.Stat(lease); !os.IsNotExist(err) {
		t.Errorf("CHECK did not sweep the dead lease: %v", err)
	}
}

func mkdir(t testing.TB, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
}

func TestCrashedDelegateIsRolledBack(t *testing.T) {
	h := newHarness(t, "bridge")
	h.exec.fail["bridge ADD"] = errors.New("netplugin failed: panic: runtime error")
	err := h.plugin.Funcs().Add(h.args(h.conf("1.0.0", "")))
	var cniErr *types.Error
	if !errors.As(err, &cniErr) || cniErr.Code != types.ErrInternal || !strings.Contains(cniErr.Msg, "crashed or was killed") {
		t.Fatalf("ADD = %v", err)
	}
	if len(h.exec.calls) != 2 || h.exec.calls[1].Command != "DEL" {
		t.Errorf("calls = %+v, want ADD then a rollback DEL", h.exec.calls)
	}
	if r := h.record(); r != nil {
		t.Errorf("record left: %+v", r)
	}
}

func TestHungDelegateTimesOut(t *testing.T) {
	h := newHarness(t, "bridge")
	h.exec.hang["bridge ADD"] = true
	err := h.plugin.Funcs().Add(h.args(h.conf("1.0.0", `,"delegateTimeout":"1s"`)))
	var cniErr *types.Error
	if !errors.As(err, &cniErr) || cniErr.Code != types.ErrTryAgainLater || !strings.Contains(cniErr.Msg, "did not answer add in time") {
		t.Fatalf("ADD = %v", err)
	}
	if conf := delegatedConf(t, h.exec.calls[0]); conf["delegateTimeout"] != nil {
		t.Errorf("delegateTimeout reached the delegate: %v", conf)
	}
	if len(h.exec.calls) != 2 || h.exec.calls[1].Command != "DEL" || h.record() != nil {
		t.Fatalf("calls = %+v, record %+v; want a rollback DEL and no record", h.exec.calls, h.record())
	}
	// The rollback has a bound of its own, not what is left of the ADD's.
	if bound := h.exec.calls[1].Bound; bound < 900*time.Millisecond {
		t.Errorf("the rollback DEL got %v, want a whole delegateTimeout (1s)", bound)
	}
}

func TestFailedRollbackKeepsThePendingRecord(t *testing.T) {
	h := newHarness(t, "bridge")
	h.exec.fail["bridge ADD"] = errors.New("signal: killed")
	h.exec.fail["bridge DEL"] = errors.New("signal: killed")
	if err := h.plugin.Funcs().Add(h.args(h.conf("1.0.0", ""))); err == nil {
		t.Fatal("ADD succeeded")
	}
	if r := h.record(); r == nil || r.State != records.Started {
		t.Errorf("record = %+v, want the pending record kept for a sweep", r)
	}
}

// deadAttachment writes what a container whose namespace is gone leaves:
// its record and its lease.
func (h *harness) deadAttachment(cid, ip string) string {
	h.t.Helper()
	return h.attachment(&records.Record{Version: records.FormatVersion, Network: "nomad", ContainerID: cid, IfName: "eth0", Netns: "/var/run/netns/" + cid, BootID: "boot-1", State: records.Complete}, ip)
}

// attachment writes rec, and its lease of ip as host-local writes it; it
// returns the lease's path.
func (h *harness) attachment(rec *records.Record, ip string) string {
	h.t.Helper()
	if err := records.NewStore(ipamdir.New(h.dataDir, "nomad")).Write(rec); err != nil {
		h.t.Fatal(err)
	}
	lease := filepath.Join(h.dataDir, "nomad", ip)
	mkdir(h.t, filepath.Dir(lease))
	if err := os.WriteFile(lease, []byte(rec.ContainerID+"\r\n"+rec.IfName), 0o600); err != nil {
		h.t.Fatal(err)
	}
	return lease
}

func gone(path string) bool {
	_, err := os.Stat(path)
	return os.IsNotExist(err)
}

// A client restart CHECKs every allocation back to back: within
// checkSweepInterval of a sweep a CHECK does not sweep again; after it, or
// with 0s, it does. The GC verb always sweeps.
func TestCheckSweepsAtMostOncePerInterval(t *testing.T) {
	h := newHarness(t, "bridge")
	first := h.deadAttachment("dead1", "172.26.64.9")
	if err := h.plugin.Funcs().Check(h.args(h.conf("1.0.0", ""))); err != nil {
		t.Fatal(err)
	}
	if !gone(first) {
		t.Fatal("the first CHECK did not sweep")
	}
	second := h.deadAttachment("dead2", "172.26.64.10")
	h.host.Clock = h.host.Clock.Add(9 * time.Second)
	if err := h.plugin.Funcs().Check(h.args(h.conf("1.0.0", ""))); err != nil {
		t.Fatal(err)
	}
	if gone(second) {
		t.Fatal("a CHECK 9s after a sweep swept again (default interval 10s)")
	}
	if err := h.plugin.Funcs().Check(h.args(h.conf("1.0.0", `,"checkSweepInterval":"0s"`))); err != nil {
		t.Fatal(err)
	}
	if !gone(second) {
		t.Fatal(`with "checkSweepInterval": "0s" a CHECK did not sweep`)
	}
	third := h.deadAttachment("dead3", "172.26.64.11")
	h.host.Clock = h.host.Clock.Add(10 * time.Second)
	if err := h.plugin.Funcs().Check(h.args(h.conf("1.0.0", ""))); err != nil {
		t.Fatal(err)
	}
	if !gone(third) {
		t.Fatal("a CHECK 10s after the last sweep did not sweep")
	}
	fourth := h.deadAttachment("dead4", "172.26.64.12")
	h.exec.reply["bridge GC"], h.exec.reply["host-local GC"] = "", ""
	h.exec.installed["host-local"] = true
	if err := h.plugin.Funcs().GC(&skel.CmdArgs{Path: "/opt/cni/bin", StdinData: h.conf("1.1.0", "")}); err != nil {
		t.Fatal(err)
	}
	if !gone(fourth) {
		t.Fatal("GC right after a sweep did not sweep")
	}
}
