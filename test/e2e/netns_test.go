package e2e

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	kitns "github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/netns"
)

// netnsIdentity is the device and inode of the namespace mounted at path.
func netnsIdentity(t *testing.T, path string) (dev, ino uint64) {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatalf("stat %s: %v", path, err)
	}
	return st.Dev, st.Ino
}

// newNetns is addNetns for any goroutine: it returns an error instead of
// failing the test.
func (e *testEnv) newNetns(suffix string) (netns, error) {
	ns := e.knowNetns("nbc-e2e-" + e.id + "-" + suffix)
	if err := e.record(runLine{Netns: ns.name}); err != nil {
		return ns, err
	}
	return ns, ns.named().Add()
}

// knowNetns makes the named namespace, and the container ID cnitool
// derives from its path, the test's: cleanup's to remove.
func (e *testEnv) knowNetns(name string) netns {
	ns := netns{name: name, path: kitns.Named(name).Path}
	ns.cid = containerIDFor(ns.path)
	e.mu.Lock()
	if !slices.Contains(e.netnses, ns) {
		e.netnses = append(e.netnses, ns)
	}
	e.mu.Unlock()
	e.knowCID(ns.cid)
	return ns
}

// named is ns's named namespace (ns.path may be a container's
// /proc/<pid>/ns/net).
func (ns netns) named() kitns.NS { return kitns.Named(ns.name) }

// restoreNetns is Nomad's restore of an allocation whose namespace was
// lost: ns deleted without any DEL (killNetns), a new one at its path.
func (e *testEnv) restoreNetns(t *testing.T, ns netns) {
	t.Helper()
	e.mustKillNetns(t, ns)
	if err := ns.named().Add(); err != nil {
		t.Fatal(err)
	}
}

// killNetns deletes one namespace without any DEL, the way a crashed
// runtime or a lost namespace leaves a container. Unlike destroyNetns it
// only deletes that container's own host veth (deleteHostVeth), so the
// other containers on the bridge keep working.
func (e *testEnv) killNetns(ns netns) error {
	if err := e.deleteHostVeth(ns); err != nil {
		return err
	}
	return ns.named().Delete()
}

// deleteHostVeth deletes the host end of the veth whose other end is eth0
// in ns (see netns.enter), if there is one on the test's bridge: the
// kernel deletes a veth with its namespace, but asynchronously, and
// deleting it first makes its end settled before the next step runs.
func (e *testEnv) deleteHostVeth(ns netns) error {
	enter := ns.enter()
	out, err := output(enter[0], append(enter[1:], "ip", "-j", "link", "show", "dev", ifName)...)
	if err != nil {
		return nil // no eth0 there
	}
	var links []struct {
		LinkIndex int `json:"link_index"`
	}
	if err := json.Unmarshal([]byte(out), &links); err != nil {
		return fmt.Errorf("parse ip link in %s: %w", ns.name, err)
	}
	if len(links) != 1 || links[0].LinkIndex <= 0 {
		return nil
	}
	host, err := output("ip", "-j", "link", "show")
	if err != nil {
		return err
	}
	var all []struct {
		Ifindex int    `json:"ifindex"`
		Ifname  string `json:"ifname"`
		Master  string `json:"master"`
	}
	if err := json.Unmarshal([]byte(host), &all); err != nil {
		return fmt.Errorf("parse ip link: %w", err)
	}
	for _, l := range all {
		if l.Ifindex == links[0].LinkIndex && l.Master == e.bridge {
			if err := run("ip", "link", "delete", l.Ifname); err != nil {
				return err
			}
		}
	}
	return nil
}

func (e *testEnv) mustKillNetns(t *testing.T, ns netns) {
	t.Helper()
	if err := e.killNetns(ns); err != nil {
		t.Fatalf("kill netns %s: %v", ns.name, err)
	}
}

// sandboxID is a container ID as containerd, CRI-O and nerdctl make them: 64
// hex digits.
func sandboxID(t *testing.T) string {
	t.Helper()
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatalf("random id: %v", err)
	}
	return hex.EncodeToString(b)
}

// podUID is a Kubernetes pod UID (a UUID).
func podUID(t *testing.T) string {
	t.Helper()
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatalf("random uid: %v", err)
	}
	h := hex.EncodeToString(b)
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

// track registers a container ID the test uses, so that cleanup and the
// leftover checks know the per-container chains named after it; before
// they are made, so that a reaper knows them too.
func (e *testEnv) track(cid string) {
	e.knowCID(cid)
	_ = e.record(runLine{CID: cid}) // cleanup reports a failure
}

func (e *testEnv) knowCID(cid string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !slices.Contains(e.cids, cid) {
		e.cids = append(e.cids, cid)
	}
}

// podNetns creates a named namespace and gives it the container ID cid
// instead of cnitool's.
func (e *testEnv) podNetns(t *testing.T, suffix, cid string) netns {
	t.Helper()
	ns := e.addNetns(t, suffix)
	ns.cid = cid
	e.track(cid)
	return ns
}

// container is a process running inside a namespace the test created, the
// way nerdctl and Apptainer hand the plugins /proc/<pid>/ns/net rather than a
// bind-mounted path.
type container struct {
	cmd  *exec.Cmd
	pid  int
	ns   netns // ns.path is /proc/<pid>/ns/net, ns.name the named namespace
	proc string
}

// startContainer runs `sleep` inside ns (ip netns exec, or nsenter: see
// netns.enter; it execs sh, which execs sleep, so the pid stays the one
// started) and waits for the line sh prints once it runs there, then
// checks that /proc/<pid>/ns/net is that namespace. Cleanup kills it if
// the test has not.
func (e *testEnv) startContainer(t *testing.T, ns netns) *container {
	t.Helper()
	c, err := e.newContainer(ns)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// newContainer is startContainer for any goroutine: it returns an error
// instead of failing the test.
func (e *testEnv) newContainer(ns netns) (*container, error) {
	enter := ns.enter()
	cmd := exec.Command(enter[0], append(enter[1:], "sh", "-c", "echo ready; exec sleep 600")...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start container process in %s: %w", ns.name, err)
	}
	e.mu.Lock()
	e.listeners = append(e.listeners, cmd)
	e.mu.Unlock()
	c := &container{cmd: cmd, pid: cmd.Process.Pid}
	c.proc = fmt.Sprintf("/proc/%d/ns/net", c.pid)
	c.ns = netns{name: ns.name, path: c.proc, cid: ns.cid}
	if line, err := waitLine(bufio.NewReader(stdout), 10*time.Second); err != nil || line != "ready" {
		return c, fmt.Errorf("container process in %s: got %q, %v; want its ready line", ns.name, line, err)
	}
	var want, got syscall.Stat_t
	if err := syscall.Stat(ns.path, &want); err != nil {
		return c, fmt.Errorf("stat %s: %w", ns.path, err)
	}
	if err := syscall.Stat(c.proc, &got); err != nil || got.Ino != want.Ino || got.Dev != want.Dev {
		return c, fmt.Errorf("%s is not %s (%v)", c.proc, ns.path, err)
	}
	return c, nil
}

// startContainerAtPID starts the container process with the given PID when
// it can, the way the kernel hands a new Apptainer container the PID of a
// dead one (PIDs are reused, and start over at every boot): it sets
// ns_last_pid to pid-1 right before the fork. Any other fork on the host may
// take the PID first, so it retries; it reports whether it got the PID.
func (e *testEnv) startContainerAtPID(t *testing.T, ns netns, pid int) (*container, bool) {
	t.Helper()
	const lastPID = "/proc/sys/kernel/ns_last_pid"
	for range 50 {
		if err := os.WriteFile(lastPID, []byte(strconv.Itoa(pid-1)), 0o644); err != nil {
			t.Logf("cannot steer the next PID (%v)", err)
			break
		}
		c := e.startContainer(t, ns)
		if c.pid == pid {
			return c, true
		}
		c.stop()
	}
	return e.startContainer(t, ns), false
}

// crash kills the container's process and deletes its namespace without
// any CNI DEL: what a SIGKILLed runtime, a bounced containerd or a reboot
// leaves. Afterwards /proc/<pid>/ns/net no longer exists.
func (e *testEnv) crash(t *testing.T, c *container) {
	t.Helper()
	if c.cmd.ProcessState == nil {
		_ = c.cmd.Process.Kill()
		_ = c.cmd.Wait()
	}
	e.mustKillNetns(t, netns{name: c.ns.name, path: kitns.Named(c.ns.name).Path, cid: c.ns.cid})
	if _, err := os.Stat(c.proc); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("%s still exists after the container died (stat: %v)", c.proc, err)
	}
}

// stop ends the container's process (its namespace stays: it is named).
func (c *container) stop() {
	if c.cmd.ProcessState == nil {
		_ = c.cmd.Process.Kill()
		_ = c.cmd.Wait()
	}
}
