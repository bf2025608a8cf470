// Package netns makes the named network namespaces (ip netns) tests put
// containers in, the way a runtime bind-mounts them under /var/run/netns.
package netns

import (
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/hostcmd"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/testhost"
)

// Dir is where ip netns mounts named namespaces.
const Dir = "/var/run/netns"

const timeout = 60 * time.Second

// NS is a named namespace: its name and the path a runtime hands plugins.
type NS struct{ Name, Path string }

// Named is the namespace called name, whether or not it exists.
func Named(name string) NS { return NS{name, filepath.Join(Dir, name)} }

// New creates a namespace named prefix-<random> (parallel runs never
// collide) and deletes it when the test ends, failed or not. It needs root
// and ip: a skip outside CI, a failure in CI.
func New(t testing.TB, prefix string) NS {
	t.Helper()
	if missing := testhost.MissingTools("ip"); len(missing) > 0 {
		testhost.SkipOrFail(t, "a network namespace needs "+strings.Join(missing, ", "))
	}
	ns := Named(fmt.Sprintf("%s-%08x", prefix, rand.Uint32()))
	if err := ns.Add(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// The test, or the plugin's gc, may have deleted it already.
		if _, err := os.Lstat(ns.Path); err == nil {
			if err := ns.Delete(); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		}
	})
	return ns
}

// Add creates the namespace; it fails if the name is taken.
func (ns NS) Add() error { return hostcmd.Run(timeout, "ip", "netns", "add", ns.Name) }

// Delete unmounts and removes the path, and fails if it is not gone then.
// Processes inside keep the namespace itself alive.
func (ns NS) Delete() error {
	if err := hostcmd.Run(timeout, "ip", "netns", "delete", ns.Name); err != nil {
		return err
	}
	if _, err := os.Lstat(ns.Path); !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("netns %s still present after delete (lstat: %v)", ns.Path, err)
	}
	return nil
}

// Recreate puts a fresh namespace at the path: Nomad's restore of an
// allocation, whose task, if it still runs, keeps the old one.
func (ns NS) Recreate() error {
	if err := ns.Delete(); err != nil {
		return err
	}
	return ns.Add()
}
