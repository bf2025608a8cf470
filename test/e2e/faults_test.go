package e2e

import (
	"errors"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/cniexec"
)

// Faults. A full tmpfs, a delegate that crashes, a
// delegate that hangs: each ADD must fail with a clear error and leave no
// half-written record, no temp file after a sweep, no lease; DEL must
// succeed whatever part of an attachment is already gone.

// tmpfsPageSize is tmpfs's unit of space.
var tmpfsPageSize = os.Getpagesize()

// mountTinyTmpfs stacks a small tmpfs on the test's dataDir (the harness
// unmounts stacked mounts at cleanup).
func (e *testEnv) mountTinyTmpfs(t *testing.T, size string) {
	t.Helper()
	if err := run("mount", "-t", "tmpfs", "-o", "size="+size+",mode=0755", e.tmpfsSrc+"-tiny", e.dataDir); err != nil {
		t.Fatalf("mount tiny tmpfs: %v", err)
	}
}

// fillTmpfs writes a filler file until the tmpfs is full, then frees
// leave pages of it again, and checks statfs agrees.
func fillTmpfs(t *testing.T, dir string, leave int) string {
	t.Helper()
	filler := filepath.Join(dir, "filler")
	f, err := os.OpenFile(filler, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		t.Fatalf("create filler: %v", err)
	}
	page := make([]byte, tmpfsPageSize)
	var size int64
	for {
		n, err := f.Write(page)
		size += int64(n)
		if errors.Is(err, syscall.ENOSPC) {
			break
		}
		if err != nil {
			t.Fatalf("fill %s: %v", dir, err)
		}
	}
	size -= size % int64(tmpfsPageSize)
	size -= int64(leave * tmpfsPageSize)
	if err := f.Truncate(size); err != nil {
		t.Fatalf("truncate filler: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Fatalf("close filler: %v", err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatalf("statfs: %v", err)
	}
	if int(st.Bavail) != leave {
		t.Fatalf("%s has %d free blocks after filling, want %d", dir, st.Bavail, leave)
	}
	return filler
}

// assertNoTrace checks that cid left no record, no temp file in the
// record directory, no lease and no NAT state.
func (e *testEnv) assertNoTrace(t *testing.T, cid string) {
	t.Helper()
	e.assertNoRecord(t, cid)
	for _, n := range e.recordNames(t) {
		if strings.HasPrefix(n, ".tmp-") {
			t.Errorf("temp file %s left in %s", n, e.recordDir())
		}
	}
	e.assertNoLeaseOf(t, cid)
	e.assertNAT(t, cid, natWant{})
}

// operatorSweep runs the operator's gc on the test's dataDir, the sweep a CHECK
// would run, and fails the test if it fails.
func (e *testEnv) operatorSweep(t *testing.T) string {
	t.Helper()
	stdout, stderr, err := e.operator(t, "gc", "--data-dir", e.dataDir)
	if err != nil {
		t.Fatalf("gc --data-dir %s: %v\nstdout: %s\nstderr: %s", e.dataDir, err, stdout, stderr)
	}
	return stdout + stderr
}

// TestFullTmpfs makes the dataDir a tmpfs of 256 KiB and fills it: from
// the start (the network's first marker cannot be written), after a first ADD and DEL
// (the pending record cannot be written), and with exactly one page left
// (the pending record is written, host-local cannot write the lease).
// Each ADD must fail with an error that says the disk is full and leave no
// record, no temp file (also after a sweep), no lease and no NAT rule; the
// runtime's DEL after it must succeed on the still full disk; once space
// is freed, ADD and DEL work again.
func TestFullTmpfs(t *testing.T) {
	for _, tc := range []struct {
		name     string
		warmUp   bool // one ADD and DEL before filling
		leave    int  // pages left free
		wantCode []int
	}{
		{name: "full-from-the-start", wantCode: []int{codeIOFailure}},
		{name: "full-after-first-use", warmUp: true, wantCode: []int{codeIOFailure}},
		// The error is host-local's, passed on through bridge.
		{name: "one-page-left", warmUp: true, leave: 1, wantCode: []int{codeIOFailure, codeInternal}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.requirePlugin(t)
			e.mountTinyTmpfs(t, "256k")
			conf := e.reclaimConf(t, "minimal.conflist")
			e.writeConflist(t, conf)
			stdin := entryConfig(t, conf, pluginType)
			run := func(verb string, ns netns) cniexec.Result {
				return cniexec.Run(t, e.binary(pluginType), e.cniArgs(verb, ns), cniexec.Opts{Stdin: stdin})
			}
			if tc.warmUp {
				first := e.addNetns(t, "first")
				if r := run("ADD", first); r.Err != nil {
					t.Fatalf("ADD before filling: %v", r.Err)
				}
				if r := run("DEL", first); r.Err != nil {
					t.Fatalf("DEL before filling: %v", r.Err)
				}
			}
			filler := fillTmpfs(t, e.dataDir, tc.leave)

			ns := e.addNetns(t, "a")
			r := run("ADD", ns)
			ce := assertCNIFailure(t, r, tc.wantCode...)
			t.Logf("ADD on a full tmpfs: code %d: %s (%s)\nstderr: %s", ce.code(), ce.Msg, ce.Details, r.Stderr)
			if !strings.Contains(ce.Msg+" "+ce.Details, "no space left on device") {
				t.Errorf("the error does not say the disk is full: msg %q details %q", ce.Msg, ce.Details)
			}
			e.assertNoTrace(t, ns.cid)
			if tc.warmUp {
				t.Logf("sweep: %s", e.operatorSweep(t))
				e.assertNoTrace(t, ns.cid)
			} else if entries, _ := os.ReadDir(e.dataDir); len(entries) != 1 {
				// A network the plugin never served: the failed ADD left
				// nothing, beside the filler; a sweep would
				// find no data dir there.
				t.Errorf("the failed ADD on a new network left %v", entries)
			}
			// A runtime DELs after a failed ADD (bridge leaves its veth in
			// the namespace when host-local fails); with the disk still
			// full, that must work too.
			if r := run("DEL", ns); r.Err != nil {
				t.Fatalf("DEL after the failed ADD, disk still full: %v", r.Err)
			}
			e.assertNoTrace(t, ns.cid)
			if linkExistsIn(ns, ifName) {
				t.Errorf("%s left in %s after DEL", ifName, ns.name)
			}

			// Space again: the same container can be added and deleted.
			if err := os.Remove(filler); err != nil {
				t.Fatalf("remove filler: %v", err)
			}
			r = run("ADD", ns)
			if r.Err != nil {
				t.Fatalf("ADD after freeing space: %v", r.Err)
			}
			p, _ := parseResult(t, r.Stdout).addrIn(t, e.subnet4)
			assertLease(t, e.leaseDir(), p.Addr(), ns.cid)
			e.assertRecord(t, ns, p.Addr())
			if r := run("DEL", ns); r.Err != nil {
				t.Fatalf("DEL after freeing space: %v", r.Err)
			}
			e.assertNoTrace(t, ns.cid)
		})
	}
}

// fakeBinDir is a CNI bin directory holding the real binaries (symlinked)
// and the given scripts.
func (e *testEnv) fakeBinDir(t *testing.T, scripts map[string]string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "bin")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatalf("mkdir: %v", err)
	}
	entries, err := os.ReadDir(e.bin)
	if err != nil {
		t.Fatalf("read %s: %v", e.bin, err)
	}
	for _, ent := range entries {
		if err := os.Symlink(filepath.Join(e.bin, ent.Name()), filepath.Join(dir, ent.Name())); err != nil {
			t.Fatalf("symlink: %v", err)
		}
	}
	for name, body := range scripts {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o755); err != nil {
			t.Fatalf("write %s: %v", name, err)
		}
	}
	return dir
}

// crashAfterBridge behaves as bridge, except that its ADD dies without a
// CNI answer after bridge has done all of its work (lease, veth, rules).
const crashAfterBridge = `#!/bin/sh
dir=$(dirname "$0")
if [ "$CNI_COMMAND" = ADD ]; then
	"$dir/bridge" >/dev/null 2>&1
	kill -KILL $$
fi
exec "$dir/bridge"
`

// TestDelegateCrash: a delegate that dies without a CNI error, before doing
// anything or after bridge did all of its work. ADD must fail with code
// 999 saying the delegate crashed and roll back with a DEL: no lease, no
// veth, no NAT rule left. When the rollback works (crash-after-bridge's DEL
// is bridge's) no pending record is left either; when the rollback DEL
// crashes too, the pending record may stay until the next sweep, which
// must remove it.
//
// regression test for a bug: invoke.RawExec turns every failed
// exec into a *types.Error with code 0 (its message says "netplugin failed
// ..."), so the plugin's answered() believes the delegate answered: it
// prints code 0, does not say "crashed", and sends no rollback DEL, so the
// lease (and bridge's veth and NAT rules) of crash-after-bridge leak. See
// the report for the reproduction.
func TestDelegateCrash(t *testing.T) {
	for _, tc := range []struct {
		name, script string
		delWorks     bool // the script's DEL succeeds
	}{
		{"garbage-exit-2", "#!/bin/sh\necho 'garbage{{ not JSON'\necho 'more garbage' >&2\nexit 2\n", false},
		{"silent-exit-1", "#!/bin/sh\nexit 1\n", false},
		{"sigkill", "#!/bin/sh\nkill -KILL $$\n", false},
		{"crash-after-bridge", crashAfterBridge, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.requirePlugin(t)
			bin := e.fakeBinDir(t, map[string]string{"crashy": tc.script})
			conf := e.reclaimConf(t, "minimal.conflist")
			entryOfType(t, conf, pluginType)["delegate"] = "crashy"
			stdin := entryConfig(t, conf, pluginType)
			ns := e.addNetns(t, "a")

			args := e.cniArgs("ADD", ns)
			args.Path = bin
			r := cniexec.Run(t, e.binary(pluginType), args, cniexec.Opts{Stdin: stdin})
			ce := assertCNIFailure(t, r, codeInternal)
			t.Logf("ADD with a crashing delegate: code %d: %s (%s)\nstderr: %s", ce.code(), ce.Msg, ce.Details, r.Stderr)
			if !strings.Contains(ce.Msg, "crashed") {
				t.Errorf("the error does not say the delegate crashed: %q", ce.Msg)
			}
			if tc.delWorks {
				e.assertNoTrace(t, ns.cid)
			} else {
				e.assertNoLeaseOf(t, ns.cid)
				e.assertNAT(t, ns.cid, natWant{})
				t.Logf("records before the sweep: %q", e.recordNames(t))
			}
			if linkExistsIn(ns, ifName) {
				t.Errorf("%s left in %s: the ADD was not rolled back", ifName, ns.name)
			}
			t.Logf("sweep: %s", e.operatorSweep(t))
			e.assertNoTrace(t, ns.cid)

			// DEL through the same delegate is clean whatever was left.
			args.Command = "DEL"
			_ = cniexec.Run(t, e.binary(pluginType), args, cniexec.Opts{Stdin: stdin})
		})
	}
}

// TestDelegateHang: a delegate that never answers, once as the process
// itself (exec sleep) and once through a child that keeps its stdout open
// (a plain `sleep` in a script, as a stuck helper would). With
// "delegateTimeout": "1s" ADD must fail within a few seconds with code 11
// and leave no process, no lease and (after the next sweep: the rollback
// DEL hangs too, so the pending record may stay until then) no pending
// record behind.
//
// regression test for a bug: the timeout's error is also a code-0
// *types.Error from invoke.RawExec, so it is reported as code 0 (not 11)
// and not rolled back; and with the child holding the pipe, exec's Wait
// blocks until the child exits: the plugin hangs for the child's lifetime
// (here until the test's 20 s guard kills it), leaving its pending record.
func TestDelegateHang(t *testing.T) {
	for _, tc := range []struct {
		name, script string
	}{
		{"delegate-hangs", "#!/bin/sh\nexec sleep 3600\n"},
		{"delegate-child-holds-stdout", "#!/bin/sh\nsleep 3600\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.requirePlugin(t)
			bin := e.fakeBinDir(t, map[string]string{"hangs": tc.script})
			conf := e.reclaimConf(t, "minimal.conflist")
			entryOfType(t, conf, pluginType)["delegate"] = "hangs"
			entryOfType(t, conf, pluginType)["delegateTimeout"] = "1s"
			stdin := entryConfig(t, conf, pluginType)
			ns := e.addNetns(t, "a")
			// Every process the run starts carries the container ID.
			marker := "CNI_CONTAINERID=" + ns.cid
			t.Cleanup(func() { killProcessesWithEnv(t, marker) })

			args := e.cniArgs("ADD", ns)
			args.Path = bin
			r := cniexec.Run(t, e.binary(pluginType), args, cniexec.Opts{Stdin: stdin, Timeout: 20 * time.Second, Group: true})
			t.Logf("ADD with a hanging delegate returned after %v", r.Elapsed.Round(time.Millisecond))
			if r.Elapsed > 10*time.Second {
				t.Errorf("ADD took %v with delegateTimeout 1s", r.Elapsed.Round(time.Millisecond))
			}
			ce := assertCNIFailure(t, r, codeTryAgainLater)
			t.Logf("code %d: %s (%s)\nstderr: %s", ce.code(), ce.Msg, ce.Details, r.Stderr)
			if !strings.Contains(ce.Msg, "did not answer") {
				t.Errorf("the error does not say the delegate did not answer in time: %q", ce.Msg)
			}
			e.assertNoLeaseOf(t, ns.cid)
			e.assertNAT(t, ns.cid, natWant{})
			t.Logf("records before the sweep: %q", e.recordNames(t))
			if left := waitProcessesGone(marker, 5*time.Second); len(left) > 0 {
				t.Errorf("processes of the ADD still running after it returned: %s", processLine(left))
			}
			t.Logf("sweep: %s", e.operatorSweep(t))
			e.assertNoTrace(t, ns.cid)
		})
	}
}

// TestDelWhenGone: DEL must succeed, and leave nothing, when part of the
// attachment is already gone: its record, its lease, its namespace, its
// NAT chain (and the jump to it), or all of them; and a second DEL too.
func TestDelWhenGone(t *testing.T) {
	for _, tc := range []struct {
		name   string
		remove func(t *testing.T, e *testEnv, ns netns, addr netip.Addr)
	}{
		{"record", func(t *testing.T, e *testEnv, ns netns, _ netip.Addr) {
			removeOrFail(t, e.recordPath(ns.cid))
		}},
		{"lease", func(t *testing.T, e *testEnv, ns netns, addr netip.Addr) {
			removeOrFail(t, filepath.Join(e.leaseDir(), addr.String()))
		}},
		{"namespace", func(t *testing.T, e *testEnv, ns netns, _ netip.Addr) {
			e.mustKillNetns(t, ns)
		}},
		{"chain", func(t *testing.T, e *testEnv, ns netns, _ netip.Addr) {
			e.dropMasq(t, ns.cid)
		}},
		{"everything", func(t *testing.T, e *testEnv, ns netns, addr netip.Addr) {
			removeOrFail(t, e.recordPath(ns.cid))
			removeOrFail(t, filepath.Join(e.leaseDir(), addr.String()))
			e.dropMasq(t, ns.cid)
			e.mustKillNetns(t, ns)
		}},
	} {
		t.Run(tc.name+"-gone", func(t *testing.T) {
			e := newEnv(t)
			e.requirePlugin(t)
			conf := e.reclaimConf(t, "minimal.conflist")
			e.writeConflist(t, conf)
			stdin := entryConfig(t, conf, pluginType)
			ns := e.addNetns(t, "a")
			p, _ := parseResult(t, e.mustCNI(t, "add", ns, "")).addrIn(t, e.subnet4)
			e.assertRecord(t, ns, p.Addr())
			e.assertNAT(t, ns.cid, natWant{Masq: []netip.Addr{p.Addr()}})

			tc.remove(t, e, ns, p.Addr())
			for i, what := range []string{"DEL", "second DEL"} {
				r := cniexec.Run(t, e.binary(pluginType), e.cniArgs("DEL", ns), cniexec.Opts{Stdin: stdin})
				assertNoPanic(t, r)
				if r.ExitCode != 0 || r.Stdout != "" {
					t.Fatalf("%s with the %s gone failed:\n%s", what, tc.name, r)
				}
				if i == 0 {
					t.Logf("DEL stderr: %s", strings.TrimSpace(r.Stderr))
				}
				e.assertNetworkEmpty(t, e.leaseDir())
				if _, err := os.Stat(ns.path); err == nil && linkExistsIn(ns, ifName) {
					t.Errorf("%s still in %s after DEL", ifName, ns.name)
				}
			}
		})
	}
}

func removeOrFail(t *testing.T, p string) {
	t.Helper()
	if err := os.Remove(p); err != nil {
		t.Fatalf("remove: %v", err)
	}
	if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("%s still there", p)
	}
}

// host-local killed between creating a lease (O_CREAT|O_EXCL) and writing
// it leaves an empty file named after the address, which names nobody: no
// DEL releases it. A sweep, which holds host-local's lock (the only lock
// host-local writes leases under), releases it, and the address can be
// had again (regression: every gc skipped it as "empty", and the address was
// lost until the next boot).
func TestEmptyLeaseIsReleasedBySweep(t *testing.T) {
	e := newEnv(t)
	e.requirePlugin(t)
	e.writeConflist(t, e.reclaimConf(t, "nomad.conflist"))
	live := e.addNetns(t, "live")
	e.mustCNI(t, "add", live, "")
	lost := e.hostAddr(200)
	writeLease(t, e.leaseDir(), lost, "", time.Now())

	out := e.operatorSweep(t)
	if !strings.Contains(out, "empty lease") || !strings.Contains(out, lost.String()) {
		t.Errorf("gc does not say it released the empty lease:\n%s", out)
	}
	other := e.addNetns(t, "other")
	if _, _, err := e.cnitoolEnv("add", other, "CNI_ARGS=IgnoreUnknown=1;IP="+lost.String()); err != nil {
		t.Fatalf("ADD asking for the address of the empty lease: %v", err)
	}
	assertLease(t, e.leaseDir(), lost, other.cid)
	e.mustCNI(t, "del", other, "")
	e.mustCNI(t, "del", live, "")
	e.assertNetworkEmpty(t, e.leaseDir())
}
