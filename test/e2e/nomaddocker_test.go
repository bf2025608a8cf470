package e2e

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Nomad's docker driver with `network { mode = "bridge" }`: the
// allocation's network namespace is not Nomad's /var/run/netns/<alloc ID>
// but a pause container's, and its path changes whenever that container
// starts again. What Nomad does, read at v1.11.2 (the same from v1.10.0 to
// v2.0.5):
//
//   - drivers/docker/network.go CreateNetwork: the pause container
//     nomad_init_<alloc ID> (network mode "none", restart policy
//     unless-stopped) is the network's owner, and the path Nomad hands CNI
//     is its NetworkSettings.SandboxKey, /var/run/docker/netns/<key>:
//     docker names it after the first 12 hex digits of a sandbox ID drawn
//     anew each time the container starts (moby's libnetwork,
//     osl.GenerateKey(sb.id)), with lo up (osl's NewSandbox). If that
//     container is running, CreateNetwork returns its spec with
//     created=false; otherwise it creates one (drivers/docker/driver.go
//     createContainer removes a stopped one of that name first), starts it
//     and returns created=true;
//   - client/allocrunner/network_hook.go Prerun and networking_cni.go
//     Setup: created=false sends CHECK on that path (with `bridge`
//     fingerprinted at 1.3.0 or later); a failed CHECK makes the hook
//     DestroyNetwork (stop and remove the pause container: its namespace
//     goes, unless a process still holds it) and CreateNetwork again (a
//     new pause container, a new path), then ADD with the same container
//     ID, the allocation ID, and no DEL; created=true sends ADD alone. ADD
//     is tried three times; if all fail, the allocation's tasks are killed
//     (alloc_runner.go Run: MarkFailedKill, runTasks) and Postrun's
//     Teardown sends DEL on the newest path, then DestroyNetwork;
//   - the docker tasks share the pause container's namespace through
//     network mode container:<pause ID> (driver.go): a task that outlives a
//     restart of the pause container stays in the old namespace.
//
// Nomad's own bridge conflist is cniVersion 0.4.0, so go-cni's Status()
// at the start of Setup and Teardown sends no STATUS here (see
// TestNomadStatusThenFailedCheckThenReAdd). What the plugin promises
// (docs/reclaim.md, When it happens): an attachment whose namespace is
// gone and held by nothing is released, by a CHECK's sweep or by the
// re-ADD of its container ID, and the re-ADD asks for its address again;
// one whose namespace a process still holds (detached) is kept, its re-ADD
// refused naming the holder, until the DEL. The namespaces are real, bound
// at paths shaped like docker's under the test's own directory.
func TestNomadDockerPauseContainerMovesTheNamespace(t *testing.T) {
	for _, tc := range []struct {
		name string
		// restarted: docker restarted the pause container (its process
		// died, or dockerd restarted it under its restart policy), so the
		// client's restore finds it running in a new namespace and sends
		// CHECK; otherwise it was stopped, and the restore sends ADD alone.
		restarted bool
		// taskRuns: a task kept running in the old namespace.
		taskRuns bool
	}{
		{name: "pause-restarted-CHECK-then-ADD", restarted: true},
		{name: "pause-stopped-ADD-without-CHECK"},
		{name: "pause-restarted-task-still-in-the-old-namespace", restarted: true, taskRuns: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			requireTool(t, "unshare")
			cniPath := e.frontDir(t) + ":" + e.bin
			e.stateDir = pluginDefaultDataDir
			nomad := e.nomadCNI(t, cniPath)
			ctx := runtimeCtx(t)
			root := t.TempDir()
			alloc := podUID(t)
			e.track(alloc)
			port := randomHostPort()

			// The allocation starts in pause container A's namespace.
			a := e.dockerSandbox(t, root, alloc)
			res, err := nomad.Setup(ctx, alloc, a.path, nomadOpts(alloc, port)...)
			if err != nil {
				t.Fatalf("Setup in %s: %v", a.path, err)
			}
			p1, gw := goCNIResult(t, res).addrIn(t, e.subnet4)
			e.assertRecord(t, a, p1.Addr())
			ping(t, a, gw)
			_, oldIno := netnsIdentity(t, a.path)
			var task *container
			if tc.taskRuns {
				task = e.startContainer(t, a)
			}
			nat := e.readNAT(t, alloc)

			// Docker ends pause container A: its namespace file goes.
			e.stopDockerSandbox(t, a, tc.taskRuns)
			if tc.restarted {
				// It comes back in a new namespace; the client restarts
				// and restores the allocation: CHECK there fails.
				b := e.dockerSandbox(t, root, alloc)
				err := nomad.Check(ctx, alloc, b.path, nomadOpts(alloc, port)...)
				if err == nil || !strings.Contains(err.Error(), "delegate bridge failed (check)") {
					t.Fatalf("CHECK in pause container B's namespace: %v, want the plugin's, from bridge (lo is up there: loopback passes it on)", err)
				}
				if tc.taskRuns {
					// The sweep after it keeps A: its namespace is held.
					e.assertDetachedKept(t, a, oldIno, p1.Addr(), nat)
				} else {
					// The sweep after it released A.
					e.assertNoTrace(t, alloc)
					assertNoFirewall(t, p1.Addr())
				}
				// DestroyNetwork, then CreateNetwork: pause container C.
				e.stopDockerSandbox(t, b, false)
			}
			newest := e.dockerSandbox(t, root, alloc)

			if tc.taskRuns {
				for try := 1; try <= 3; try++ {
					_, err := nomad.Setup(ctx, alloc, newest.path, nomadOpts(alloc, port)...)
					if err == nil {
						t.Fatalf("ADD %d into %s succeeded while pid %d holds the old namespace", try, newest.path, task.pid)
					}
					for _, want := range []string{"nomad-bridge-cni refused the ADD: ", fmt.Sprintf("net:[%d], held by pid %d (sleep)", oldIno, task.pid), newest.path} {
						if !strings.Contains(err.Error(), want) {
							t.Errorf("ADD %d: %v\nwant it to say %q", try, err, want)
						}
					}
					e.assertDetachedKept(t, a, oldIno, p1.Addr(), nat)
				}
				// The task still answers on its address.
				ping(t, task.ns, gw)
				// Nomad kills the tasks; the old namespace goes with them.
				if err := e.deleteHostVeth(task.ns); err != nil {
					t.Fatal(err)
				}
				task.stop()
			} else {
				res, err := nomad.Setup(ctx, alloc, newest.path, nomadOpts(alloc, port)...)
				if err != nil {
					t.Fatalf("ADD into %s after pause container A's namespace went: %v", newest.path, err)
				}
				p2, gw := goCNIResult(t, res).addrIn(t, e.subnet4)
				if p2 != p1 {
					t.Errorf("ADD in the new namespace got %s, first %s: the allocation keeps its free address", p2, p1)
				}
				assertLeases(t, e.leaseDir(), map[netip.Addr]string{p2.Addr(): leaseContent(alloc)})
				e.assertRecord(t, newest, p2.Addr())
				e.assertRecordsExactly(t, alloc)
				e.assertNAT(t, alloc, natWant{Masq: []netip.Addr{p2.Addr()}, DNAT: []portMap{{port, p2.Addr()}}})
				e.assertFirewall(t, p2.Addr())
				assertOnlyAddrOnIf(t, newest, p2)
				ping(t, newest, gw)
				e.assertReaches(t, newest, netip.AddrPortFrom(gw, uint16(port)))
			}

			// Postrun: Teardown's DEL on the newest path, then
			// DestroyNetwork.
			if err := nomad.Remove(ctx, alloc, newest.path, nomadDelOpts(port)...); err != nil {
				t.Fatalf("Remove: %v", err)
			}
			e.assertNetworkEmpty(t, e.leaseDir())
			assertNoFirewall(t, p1.Addr())
			enter := newest.enter()
			if out, err := output(enter[0], append(enter[1:], "ip", "link", "show", "dev", ifName)...); err == nil {
				t.Errorf("%s left in %s after DEL: %s", ifName, newest.path, out)
			}
			e.stopDockerSandbox(t, newest, false)
		})
	}
}

// dockerSandbox is a new network namespace the way docker makes a
// container's: bound at <root>/var/run/docker/netns/<key>, key 12 random
// hex digits, lo up. root is the test's own directory, never the host's
// /var/run/docker. Cleanup unbinds and removes it if the test has not.
func (e *testEnv) dockerSandbox(t *testing.T, root, cid string) netns {
	t.Helper()
	dir := filepath.Join(root, "var", "run", "docker", "netns")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	key := hex.EncodeToString(b)
	ns := netns{name: "docker-" + key, path: filepath.Join(dir, key), cid: cid}
	if err := os.WriteFile(ns.path, nil, 0o444); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if mounted, _ := isMountPoint(ns.path); mounted {
			if err := run("umount", ns.path); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		}
		if err := os.Remove(ns.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("cleanup: %v", err)
		}
	})
	if err := run("unshare", "--net="+ns.path, "ip", "link", "set", "lo", "up"); err != nil {
		t.Fatalf("namespace at %s: %v", ns.path, err)
	}
	return ns
}

// stopDockerSandbox is docker ending the container whose namespace is at
// ns.path: it unbinds and removes the path. The namespace dies with it,
// and its veth with it (deleted here first, as killNetns does), unless
// held: then a process in it keeps it, and its eth0, alive.
func (e *testEnv) stopDockerSandbox(t *testing.T, ns netns, held bool) {
	t.Helper()
	if !held {
		if err := e.deleteHostVeth(ns); err != nil {
			t.Fatal(err)
		}
	}
	if err := run("umount", ns.path); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(ns.path); err != nil {
		t.Fatal(err)
	}
}
