package containerd

import (
	"errors"
	"io/fs"
	"maps"
	"os"
	"slices"
	"testing"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/iptstate"
)

// A pod run, stopped and removed the way kubelet does: while it runs, its
// leases (one per family), record, ipMasq rules and addresses are there;
// after stopp and rmp, nothing is.
func TestRunStopRemove(t *testing.T) {
	e := newEnv(t, false)
	p := e.runPod(t, "a")
	e.assertAttached(t, p)
	if n := len(e.leases(t)); n != 2 {
		t.Errorf("%d leases for one pod, want 2 (one per family)", n)
	}
	e.stopAndRemove(t, p)
	e.assertNothingLeft(t)
}

// containerd SIGKILLed with pods running (their shims and pause processes
// survive it) and started again: the CRI plugin reconnects to the shims;
// the pods are ready with the addresses they had, still one lease per
// family each, and not one NAT rule more or less.
func TestContainerdRestart(t *testing.T) {
	e := newEnv(t, false)
	pods := []*pod{e.runPod(t, "a"), e.runPod(t, "b")}
	rulesBefore := e.natRules(t, "")
	e.killDaemon(t)
	if shims := e.shims(); len(shims) != len(pods) {
		t.Fatalf("%d shims of the daemon survived it, want one per pod (%d)", len(shims), len(pods))
	}
	e.start(t)
	for _, p := range pods {
		after := e.inspectPod(t, p.id)
		if after.state != "SANDBOX_READY" {
			t.Errorf("pod %s is %s after the restart, want SANDBOX_READY", p.id, after.state)
		}
		if !slices.Equal(after.addrs, p.addrs) {
			t.Errorf("pod %s has %v after the restart, had %v", p.id, after.addrs, p.addrs)
		}
		e.assertAttached(t, p)
	}
	if n := len(e.leases(t)); n != 2*len(pods) {
		t.Errorf("%d leases for %d pods after the restart, want %d: %v", n, len(pods), 2*len(pods), e.leases(t))
	}
	if after := e.natRules(t, ""); !maps.EqualFunc(after, rulesBefore, slices.Equal) {
		t.Errorf("nat rules changed with the restart:\nbefore %v\nafter  %v", rulesBefore, after)
	}
	for _, p := range pods {
		e.stopAndRemove(t, p)
	}
	e.assertNothingLeft(t)
}

// A pod's namespace path lost while containerd runs (unmounted and
// removed: a crash, a cleaned-up /var/run/netns), then the pod stopped and
// removed. The CRI plugin finds the namespace closed and sends DEL with an
// empty netns; bridge then releases the leases but skips its ipMasq
// teardown, and the plugin removes those rules itself.
func TestLostNetns(t *testing.T) {
	e := newEnv(t, false)
	p := e.runLoseNetnsAndRemove(t)
	if rules := e.natRules(t, p.id); len(rules) > 0 {
		t.Errorf("the pod's nat rules outlived its removal: %v", rules)
	}
	e.assertNothingLeft(t)
}

// The control of TestLostNetns: containerd's conflist as shipped ("type":
// "bridge"). Bare bridge must leave the pod's ipMasq rules of both
// families behind, or TestLostNetns would prove nothing. (The env's
// cleanup removes them.)
func TestLostNetnsBareBridge(t *testing.T) {
	e := newEnv(t, true)
	p := e.runLoseNetnsAndRemove(t)
	rules := e.natRules(t, p.id)
	for _, fam := range iptstate.Families {
		if len(rules[fam]) == 0 {
			t.Errorf("%s: bare bridge left no nat rule of the pod: the control proves nothing", fam)
		}
	}
	if chains := e.masqChains(t); len(chains) != len(iptstate.Families) {
		t.Errorf("bare bridge left ipMasq chains %v, want one per family", chains)
	}
	t.Logf("bare bridge left, as expected: %v", rules)
}

// runLoseNetnsAndRemove runs a pod, removes its namespace path while the
// pod runs, then stops and removes the pod.
func (e *env) runLoseNetnsAndRemove(t *testing.T) *pod {
	t.Helper()
	p := e.runPod(t, "a")
	e.assertAttached(t, p)
	if err := deleteNetns(p.netns); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(p.netns); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("netns %s still present after delete (lstat: %v)", p.netns, err)
	}
	e.stopAndRemove(t, p)
	return p
}

// A simulated reboot: containerd, its shims and the pause processes
// killed, every namespace of the pods and every mount of the daemon gone;
// containerd started again finds the pods NotReady. stopp and rmp must
// release everything (the DEL has an empty netns: nothing bridge could
// reach is left).
func TestSimulatedReboot(t *testing.T) {
	e := newEnv(t, false)
	pods := []*pod{e.runPod(t, "a"), e.runPod(t, "b")}
	for _, p := range pods {
		e.assertAttached(t, p)
	}
	e.killDaemon(t)
	if errs := e.killShims(); len(errs) > 0 {
		t.Fatalf("kill the shims: %v", errs)
	}
	if shims := e.shims(); len(shims) > 0 {
		t.Fatalf("shims %v still run", shims)
	}
	for _, p := range pods {
		if isPause(p.pid) {
			t.Fatalf("pause process %d of pod %s still runs", p.pid, p.id)
		}
	}
	if err := errors.Join(e.deleteNetnses(), e.unmountAll()); err != nil {
		t.Fatal(err)
	}
	e.start(t)
	for _, p := range pods {
		if got := e.inspectPod(t, p.id); got.state != "SANDBOX_NOTREADY" {
			t.Errorf("pod %s is %s after the reboot, want SANDBOX_NOTREADY", p.id, got.state)
		}
	}
	for _, p := range pods {
		e.stopAndRemove(t, p)
	}
	e.assertNothingLeft(t)
}
