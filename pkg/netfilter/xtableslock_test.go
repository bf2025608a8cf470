package netfilter

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/coreos/go-iptables/iptables"
	"golang.org/x/sys/unix"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/testhost"
)

// iptables-legacy waits for the xtables lock: a process that holds it and
// is stuck (a hung iptables-restore) must not hang the plugin's own
// listings and deletions, which a DEL and a sweep (under host-local's
// lock) make; each gives up after iptablesWait and says so (regression:
// `-w` and go-iptables' `--wait` waited for ever). Each command runs in a
// network namespace of its own, on a lock file of the test's.
func TestIPTablesGivesUpOnAStuckXtablesLock(t *testing.T) {
	if missing := testhost.MissingTools("iptables-legacy", "unshare"); len(missing) > 0 {
		testhost.SkipOrFail(t, fmt.Sprintf("needs %v", missing))
	}
	legacy, _ := exec.LookPath("iptables-legacy")
	bin := t.TempDir()
	wrapper := filepath.Join(bin, "iptables")
	if err := os.WriteFile(wrapper, []byte("#!/bin/sh\nexec unshare -n "+legacy+" \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	lock := filepath.Join(t.TempDir(), "xtables.lock")
	t.Setenv("XTABLES_LOCKFILE", lock)
	t.Setenv("PATH", bin+":"+os.Getenv("PATH")) // go-iptables finds "iptables"
	held, err := os.Create(lock)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(int(held.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { held.Close() }) // lets a command still waiting go
	old := iptablesWait
	iptablesWait = time.Second
	t.Cleanup(func() { iptablesWait = old })

	tab := &natTable{path: wrapper, proto: iptables.ProtocolIPv4}
	for name, op := range map[string]func() error{
		"list":         func() error { _, err := tab.List("nat"); return err },
		"flush":        func() error { return tab.FlushChain("nat", "CNI-DN-x") },
		"delete":       func() error { return tab.Delete("nat", "POSTROUTING", "-j", "CNI-x") },
		"delete chain": func() error { return tab.DeleteChain("nat", "CNI-x") },
	} {
		done := make(chan error, 1)
		go func() { done <- op() }()
		select {
		case err := <-done:
			if err == nil || errors.Is(err, ErrNoChain) {
				t.Errorf("%s with the xtables lock held: %v, want it to fail for the lock", name, err)
			}
		case <-time.After(15 * time.Second):
			t.Errorf("%s waits for a held xtables lock without a bound", name)
		}
	}
}
