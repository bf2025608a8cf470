package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// portmapPause is an `iptables` that stands first in PATH for the plugins
// of one DEL: it runs the real one, except that the second `-X` of a
// CNI-DN- chain (portmap's teardown deletes its chain, fails while the jump
// to it is there, deletes the jump, then checks the chain exists, flushes
// it and deletes it again) first says so on the FIFO paused and waits for
// a line on the FIFO resume. A sweep that runs then finds portmap between
// its check and its delete, the window in which a CHECK's sweep once
// deleted the chain and made the runtime's DEL fail ("CHAIN_DEL failed (No
// such file or directory)").
const portmapPause = `#!/bin/sh
case " $* " in
*" -X CNI-DN-"*)
	if mkdir "$PAUSE_DIR/first" 2>/dev/null; then :
	elif mkdir "$PAUSE_DIR/second" 2>/dev/null; then
		echo paused > "$PAUSE_DIR/paused"
		read -r line < "$PAUSE_DIR/resume"
	fi ;;
esac
exec "$REAL_TOOL" "$@"
`

// portmapNFTPause is an `nft` that pauses portmap's nftables teardown the
// same way: between its listing of the container's rules and the
// transaction that deletes them by handle (knftables runs `nft -f -`),
// which fails if a rule went in between.
const portmapNFTPause = `#!/bin/sh
if [ "$1" = "-f" ] && [ "$2" = "-" ] && mkdir "$PAUSE_DIR/first" 2>/dev/null; then
	echo paused > "$PAUSE_DIR/paused"
	read -r line < "$PAUSE_DIR/resume"
fi
exec "$REAL_TOOL" "$@"
`

// pausedDEL is a runtime's DEL of ns held inside portmap's teardown
// (portmapPause).
type pausedDEL struct {
	cmd    *exec.Cmd
	dir    string
	done   chan error
	stderr strings.Builder
}

// startPausedDEL starts `cnitool del` of ns with script first in PATH as
// tool (portmapPause as iptables, portmapNFTPause as nft) and waits until
// portmap is paused in its teardown. The DEL's processes are a process
// group of their own.
func (e *testEnv) startPausedDEL(t *testing.T, ns netns, capArgs, tool, script string) *pausedDEL {
	t.Helper()
	real, err := exec.LookPath(tool)
	if err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	p := &pausedDEL{dir: t.TempDir(), done: make(chan error, 1)}
	bin := filepath.Join(p.dir, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bin, tool), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, fifo := range []string{"paused", "resume"} {
		if err := syscall.Mkfifo(filepath.Join(p.dir, fifo), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	p.cmd = e.cnitoolCmd(context.Background(), "del", ns, "CAP_ARGS="+capArgs,
		"PATH="+bin+":"+os.Getenv("PATH"), "PAUSE_DIR="+p.dir, "REAL_TOOL="+real)
	p.cmd.Stderr = &p.stderr
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() {
		// However the test ends, nothing of the DEL stays behind.
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
		p.done <- nil
	})

	// The FIFO's open returns once the script opened it to write: portmap
	// is then paused. A DEL that ends first never pauses.
	paused := make(chan error, 1)
	go func() {
		b, err := os.ReadFile(filepath.Join(p.dir, "paused"))
		if err == nil && strings.TrimSpace(string(b)) != "paused" {
			err = fmt.Errorf("read %q", b)
		}
		paused <- err
	}()
	select {
	case err := <-paused:
		if err != nil {
			t.Fatalf("wait for portmap to pause: %v", err)
		}
	case err := <-p.done:
		// Unblock the reader: nobody will write now.
		if f, ferr := os.OpenFile(filepath.Join(p.dir, "paused"), os.O_WRONLY, 0); ferr == nil {
			f.Close()
		}
		p.done <- err
		t.Fatalf("the DEL ended (%v) before portmap reached the step %s pauses at: the test no longer holds portmap where it must\nstderr: %s", err, tool, p.stderr.String())
	case <-time.After(cmdTimeout):
		t.Fatalf("portmap did not reach the step %s pauses at within %v\nstderr: %s", tool, cmdTimeout, p.stderr.String())
	}
	return p
}

// resume lets portmap go on and returns the DEL's outcome.
func (p *pausedDEL) resume(t *testing.T) error {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(p.dir, "resume"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, werr := f.WriteString("go\n")
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		t.Fatal(werr)
	}
	select {
	case err := <-p.done:
		p.done <- err
		if err != nil {
			return fmt.Errorf("%w: %s", err, cnitoolError(p.stderr.String()))
		}
		return nil
	case <-time.After(cmdTimeout):
		t.Fatalf("the DEL did not end within %v of resuming", cmdTimeout)
		return nil
	}
}

// kill SIGKILLs the DEL's process group, as a runtime's death does.
func (p *pausedDEL) kill(t *testing.T) {
	t.Helper()
	if err := syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err := <-p.done
	p.done <- err
	if err == nil {
		t.Fatal("the paused DEL was killed, yet exited 0")
	}
}

// TestSweepDuringRuntimeDEL: a container's namespace is gone and its
// runtime's DEL is under way when a sweep finds the attachment stale. The
// DEL runs portmap first; a sweep that deleted portmap's CNI-DN chain while
// portmap was between its check of the chain and its delete made that DEL
// fail (seen in the storm; it fails so without the fix). The sweep must
// leave the container whole to the DEL that runs, and say so:
//   - the DEL then succeeds and leaves nothing;
//   - if the DEL is killed instead, the next sweep releases it all.
func TestSweepDuringRuntimeDEL(t *testing.T) {
	for _, tc := range []struct {
		name   string
		killed bool
	}{{"del-finishes", false}, {"del-killed", true}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.requirePlugin(t)
			e.writeConflist(t, e.confFor(t, "nomad.conflist"))
			a, b := e.addNetns(t, "a"), e.addNetns(t, "b")
			port := randomHostPort()
			capA := portMappings(port)
			pa, _ := parseResult(t, e.mustCNI(t, "add", a, capA)).addrIn(t, e.subnet4)
			pb, gw := parseResult(t, e.mustCNI(t, "add", b, portMappings(port+1))).addrIn(t, e.subnet4)
			e.assertNAT(t, a.cid, natWant{Masq: []netip.Addr{pa.Addr()}, DNAT: []portMap{{port, pa.Addr()}}})
			leaseB := readLeases(t, e.leaseDir())[pb.Addr()]

			e.mustKillNetns(t, a)
			del := e.startPausedDEL(t, a, capA, "iptables", portmapPause)

			// The sweep finds A stale and portmap's DEL of it running: it
			// leaves A whole to that DEL (portmap's chain, which portmap
			// has emptied and will delete, bridge's rules, the lease and
			// the record that names them) and says so.
			leaseA := readLeases(t, e.leaseDir())[pa.Addr()]
			natA := e.readNAT(t, a.cid).String()
			out := e.operatorSweep(t)
			if want := fmt.Sprintf("kept %s/%s for now", a.cid, ifName); !strings.Contains(out, want) || !strings.Contains(out, "a CNI command of "+a.cid+" runs (pid ") {
				t.Errorf("the sweep does not say it left A to the DEL that runs (%q):\n%s", want, out)
			}
			chain := e.dnatChain(a.cid)
			if st := e.readNAT(t, a.cid); !st["iptables"].hasDNAT || st.String() != natA {
				t.Fatalf("the sweep changed A's NAT rules while portmap's DEL of A was between its check and its delete of %s:\nbefore:\n%s\nafter:\n%s\nsweep:\n%s", chain, natA, st, out)
			}
			assertLeases(t, e.leaseDir(), map[netip.Addr]string{pa.Addr(): leaseA, pb.Addr(): leaseB})
			if _, err := os.Stat(e.recordPath(a.cid)); err != nil {
				t.Fatalf("A's record is gone, though a DEL of A runs: %v", err)
			}

			if tc.killed {
				del.kill(t)
				again := e.operatorSweep(t)
				if !strings.Contains(again, "released "+e.netName+" "+a.cid) || !strings.Contains(again, "chain "+chain) {
					t.Errorf("the sweep after the killed DEL did not release A and %s:\n%s", chain, again)
				}
			} else if err := del.resume(t); err != nil {
				t.Fatalf("the runtime's DEL of A failed after a sweep ran during it: %v", err)
			}
			e.assertNoRecord(t, a.cid)
			e.assertNAT(t, a.cid, natWant{})
			assertLeases(t, e.leaseDir(), map[netip.Addr]string{pb.Addr(): leaseB})
			e.assertNAT(t, b.cid, natWant{Masq: []netip.Addr{pb.Addr()}, DNAT: []portMap{{port + 1, pb.Addr()}}})
			ping(t, b, gw)
			if lines := e.releaseLines(e.operatorSweep(t)); len(lines) != 0 {
				t.Errorf("a sweep after the DEL still released: %q", lines)
			}

			e.mustCNI(t, "del", b, portMappings(port+1))
			e.assertNetworkEmpty(t, e.leaseDir())
		})
	}
}

// TestSweepDuringRuntimeDELOfPortmapNFTables: the same with portmap's
// nftables backend, paused between its listing of the container's rules
// and the transaction that deletes them: the sweep leaves the container to
// the DEL, which then succeeds and leaves nothing; if the DEL is killed
// instead, the next sweep releases it all.
func TestSweepDuringRuntimeDELOfPortmapNFTables(t *testing.T) {
	requireTool(t, "nft")
	for _, tc := range []struct {
		name   string
		killed bool
	}{{"del-finishes", false}, {"del-killed", true}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.requirePlugin(t)
			conf := e.confFor(t, "10-containerd-net.conflist")
			entryOfType(t, conf, "portmap")["backend"] = "nftables"
			e.writeConflist(t, conf)
			a, b := e.addNetns(t, "a"), e.addNetns(t, "b")
			port := randomHostPort()
			capA, capB := portMappings(port), portMappings(port+1)
			e.mustCNI(t, "add", a, capA)
			_, gw := parseResult(t, e.mustCNI(t, "add", b, capB)).addrIn(t, e.subnet4)
			if countOf(portmapNFTRules(t), a.cid) == 0 {
				t.Fatalf("portmap made no nftables rules for A: %q", portmapNFTRules(t))
			}
			e.mustKillNetns(t, a)
			before := countOf(portmapNFTRules(t), a.cid)
			del := e.startPausedDEL(t, a, capA, "nft", portmapNFTPause)

			out := e.operatorSweep(t)
			if want := fmt.Sprintf("kept %s/%s for now", a.cid, ifName); !strings.Contains(out, want) || !strings.Contains(out, "a CNI command of "+a.cid+" runs (pid ") {
				t.Errorf("the sweep does not say it left A to the DEL that runs (%q):\n%s", want, out)
			}
			if n := countOf(portmapNFTRules(t), a.cid); n != before {
				t.Fatalf("the sweep deleted portmap's nftables rules of A (%d of %d left) while portmap's DEL of A was between its listing and its delete:\n%s", n, before, out)
			}
			if _, err := os.Stat(e.recordPath(a.cid)); err != nil {
				t.Fatalf("A's record is gone, though a DEL of A runs: %v", err)
			}

			if tc.killed {
				del.kill(t)
				if again := e.operatorSweep(t); !strings.Contains(again, "released "+e.netName+" "+a.cid) {
					t.Errorf("the sweep after the killed DEL did not release A:\n%s", again)
				}
			} else if err := del.resume(t); err != nil {
				t.Fatalf("the runtime's DEL of A failed after a sweep ran during it: %v", err)
			}
			if n := countOf(portmapNFTRules(t), a.cid); n != 0 {
				t.Errorf("portmap's nftables rules of A left: %d", n)
			}
			e.assertNoRecord(t, a.cid)
			e.assertNAT(t, a.cid, natWant{})
			ping(t, b, gw)
			e.mustCNI(t, "del", b, capB)
			e.assertNetworkEmpty(t, e.leaseDir())
			if n := countOf(portmapNFTRules(t), b.cid); n != 0 {
				t.Errorf("portmap's nftables rules of B left: %d", n)
			}
		})
	}
}
