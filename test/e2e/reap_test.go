package e2e

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/iptstate"
)

// A run killed from outside (kill -9 of go test, a CI timeout, a power cut)
// runs no cleanup. So that what it created does not stay on the host for
// ever, every testEnv records itself in a run file, runDir/<id>.json, and
// holds a shared flock on it while it lives: the kernel drops the lock when
// the process dies, however it dies, so a pid reused or a pid namespace
// apart cannot make a live run look dead. Before the tests, TestMain reaps
// every run file nobody holds: remove, cleanup's own code, deletes what the
// environment created, then the file goes, last, so that a reaper killed
// half-way is finished by the next one. The directory is on disk, not in
// /run: cnitool's cache in /var/lib/cni outlives a reboot.
const runDir = "/var/lib/nbc-e2e"

// runLine is a line of a run file: the first names the environment, each
// later one a namespace or container ID, written before the test makes
// anything of it. Lines are appended, never rewritten: TestStorm records
// thousands.
type runLine struct {
	PID        int          `json:"pid,omitempty"` // for the reaper's message
	ID         string       `json:"id,omitempty"`
	NetName    string       `json:"netName,omitempty"`
	Bridge     string       `json:"bridge,omitempty"`
	AdminChain string       `json:"adminChain,omitempty"`
	DataDir    string       `json:"dataDir,omitempty"`
	Subnet4    netip.Prefix `json:"subnet4,omitzero"`
	Subnet6    netip.Prefix `json:"subnet6,omitzero"`
	Netns      string       `json:"netns,omitempty"`
	CID        string       `json:"cid,omitempty"`
}

func (e *testEnv) runPath() string { return filepath.Join(runDir, e.id+".json") }

var runID = regexp.MustCompile(`^[0-9a-f]{8}$`)

// ours reports whether h names an environment the way newEnv names them:
// remove acts on those names, so a reaper misled by a bad file cannot
// touch anything else.
func (h runLine) ours() bool {
	return runID.MatchString(h.ID) && h.NetName == "nbc-e2e-"+h.ID && h.Bridge == "nbc"+h.ID &&
		h.AdminChain == "NBC-ADM-"+h.ID && filepath.IsAbs(h.DataDir) && filepath.Base(h.DataDir) == "tmpfs" &&
		h.Subnet4.Bits() == 24 && h.Subnet6.Bits() == 64
}

// lockRunDir flocks runDir: shared while a run file is made, so that a
// reaper, which holds it exclusively, only sees run files that are locked
// and complete, or whose maker died.
func lockRunDir(how int) (*os.File, error) {
	if err := os.MkdirAll(runDir, 0o755); err != nil {
		return nil, err
	}
	d, err := os.Open(runDir)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(d.Fd()), how); err != nil {
		d.Close()
		return nil, err
	}
	return d, nil
}

// openRunFile makes e's run file, locked, with its first line.
func (e *testEnv) openRunFile() error {
	d, err := lockRunDir(unix.LOCK_SH)
	if err != nil {
		return err
	}
	defer d.Close()
	f, err := os.OpenFile(e.runPath(), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	e.run = f
	if err := unix.Flock(int(f.Fd()), unix.LOCK_SH); err != nil {
		return err
	}
	err = e.record(runLine{PID: os.Getpid(), ID: e.id, NetName: e.netName, Bridge: e.bridge,
		AdminChain: e.adminChain, DataDir: e.dataDir, Subnet4: e.subnet4, Subnet6: e.subnet6})
	if err != nil {
		return err
	}
	return f.Sync() // the network's name must outlive a power cut, as cnitool's cache does
}

// record appends l to e's run file (none: an environment rebuilt by the
// reaper, or a helper's). Its first error is cleanup's.
func (e *testEnv) record(l runLine) error {
	b, err := json.Marshal(l)
	if err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.run == nil {
		return nil
	}
	if _, err := e.run.Write(append(b, '\n')); err != nil {
		err = fmt.Errorf("record %s in %s: %w", b, e.run.Name(), err)
		e.runErr = cmp.Or(e.runErr, err)
		return err
	}
	return nil
}

// dropRunFile removes e's run file, then unlocks it: the end of cleanup.
func (e *testEnv) dropRunFile() error {
	if e.run == nil {
		return nil
	}
	err := os.Remove(e.run.Name())
	return errors.Join(e.runErr, err, e.run.Close())
}

// reapDeadRuns reaps the run files of environments whose process is gone
// (see runDir), saying so on w. Its error is the state it could not
// remove; those run files stay for the next run.
func reapDeadRuns(w io.Writer) error {
	if _, err := os.Stat(runDir); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	d, err := lockRunDir(unix.LOCK_EX) // another reaper finishes first
	if err != nil {
		return fmt.Errorf("reaper: %w", err)
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("reaper: %w", err)
	}
	var errs []error
	for _, name := range names {
		if !strings.HasSuffix(name, ".json") {
			continue
		}
		path := filepath.Join(runDir, name)
		msg, err := reapRun(path)
		if err != nil {
			err = fmt.Errorf("reaping %s: %w", path, err)
			fmt.Fprintf(w, "e2e: %v\n", err)
			errs = append(errs, err)
		} else if msg != "" {
			fmt.Fprintf(w, "e2e: reaped %s: %s\n", path, msg)
		}
	}
	return errors.Join(errs...)
}

// reapRun reaps the run file at path if its process is gone, and says
// what it reaped; nothing when it lives.
func reapRun(path string) (string, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil // its cleanup just removed it
	}
	if err != nil {
		return "", err
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); errors.Is(err, unix.EWOULDBLOCK) {
		return "", nil // alive
	} else if err != nil {
		return "", err
	}
	// Unlocked since this opened it: a cleanup that was removing it.
	if opened, err := f.Stat(); err != nil {
		return "", err
	} else if now, err := os.Stat(path); err != nil || !os.SameFile(opened, now) {
		return "", nil
	}
	e, pid, err := readRun(f)
	if err != nil {
		return "", err
	}
	msg := "its process died while it made the file, before anything else"
	if e != nil {
		if err := e.remove(); err != nil {
			return "", err
		}
		msg = fmt.Sprintf("network %s of pid %d, which died: removed", e.netName, pid)
	}
	return msg, os.Remove(path)
}

// readRun is the environment a run file records, as remove needs it; nil
// when its first line is incomplete (its process died while writing it).
func readRun(r io.Reader) (*testEnv, int, error) {
	dec := json.NewDecoder(r)
	var h runLine
	if err := dec.Decode(&h); errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return nil, 0, nil
	} else if err != nil || !h.ours() {
		return nil, 0, fmt.Errorf("not a run file: %v %+v", err, h)
	}
	e := &testEnv{id: h.ID, netName: h.NetName, bridge: h.Bridge, adminChain: h.AdminChain,
		dataDir: h.DataDir, subnet4: h.Subnet4, subnet6: h.Subnet6}
	for {
		var l runLine
		err := dec.Decode(&l)
		// A torn last line is a thing recorded and not made yet.
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return e, h.PID, nil
		}
		switch {
		case err != nil:
			return nil, 0, err
		case l.Netns != "" && (!strings.HasPrefix(l.Netns, "nbc-e2e-"+h.ID+"-") || strings.Contains(l.Netns, "/")):
			return nil, 0, fmt.Errorf("namespace %q is not the run's", l.Netns)
		case l.Netns != "":
			e.knowNetns(l.Netns)
		case l.CID != "":
			e.knowCID(l.CID)
		}
	}
}

// deadRunEnv makes the test binary TestReapDeadRun's run to kill (TestMain).
const deadRunEnv = "NBC_E2E_DEAD_RUN"

// deadRun is what the run to kill made, as it reports it.
type deadRun struct {
	RunFile, Bridge, DataDir, TempRoot string
	Netns, Cache, Rules, Chains        []string // Rules, Chains: "FAMILY TABLE ..."
}

// TestReapDeadRun: a run of the package SIGKILLed after its environment
// made a namespace, a bridge, the iptables rules and chains of bridge,
// portmap and firewall and of a tracked container ID, cnitool's cache and a
// tmpfs leaves all of it; the reaper removes it and the run file. It leaves
// live runs alone: that run while it lived, and this test's environment.
func TestReapDeadRun(t *testing.T) {
	if os.Getenv(deadRunEnv) != "" {
		makeDeadRun(t)
		return
	}
	live := newEnv(t)
	live.requirePlugin(t)
	liveNS := live.addNetns(t, "live")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^TestReapDeadRun$", "-test.count=1")
	cmd.Env = append(os.Environ(), deadRunEnv+"=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe() // the run waits on it
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var r deadRun
	t.Cleanup(func() {
		// Failed or not, the run dies and what it made is reaped.
		stdin.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		var out bytes.Buffer
		if err := reapDeadRuns(&out); err != nil {
			t.Errorf("reaping after the test: %v", err)
		}
		t.Logf("reaper after the test: %q", out.String())
		if m, err := isMountPoint(r.DataDir); err == nil && !m && strings.HasPrefix(r.TempRoot, os.TempDir()+"/") {
			_ = os.RemoveAll(r.TempRoot)
		}
	})
	lines := bufio.NewReader(stdout)
	line, err := waitLine(lines, 2*time.Minute)
	if report, ok := strings.CutPrefix(line, "dead-run: "); !ok || json.Unmarshal([]byte(report), &r) != nil {
		stdin.Close()
		rest, _ := io.ReadAll(lines)
		t.Fatalf("the run to kill did not report what it made: %v\n%s\n%s\nstderr: %s", err, line, rest, stderr.String())
	}
	if len(r.Netns) == 0 || len(r.Cache) == 0 || len(r.Rules) == 0 || len(r.Chains) < 4 {
		t.Fatalf("the run to kill made too little: %+v", r)
	}
	all := r.left(t)
	t.Logf("the run to kill made: %q", all)

	var out bytes.Buffer
	if err := reapDeadRuns(&out); err != nil || strings.Contains(out.String(), r.RunFile) {
		t.Fatalf("the reaper, the run alive: %v %q", err, out.String())
	}
	if left := r.left(t); !slices.Equal(left, all) {
		t.Fatalf("the reaper removed state of a live run: %q is left of %q", left, all)
	}

	if err := cmd.Process.Signal(unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("the run: %v, want it killed; stderr: %s", err, stderr.String())
	}
	if left := r.left(t); !slices.Equal(left, all) {
		t.Fatalf("after the kill, %q is left of %q: did a cleanup run?", left, all)
	}

	out.Reset()
	if err := reapDeadRuns(&out); err != nil || !strings.Contains(out.String(), "reaped "+r.RunFile) {
		t.Fatalf("the reaper, the run dead: %v %q", err, out.String())
	}
	t.Logf("reaper: %s", out.String())
	if left := r.left(t); len(left) > 0 {
		t.Errorf("left after the reaper: %q", left)
	}
	if _, err := os.Stat(live.runPath()); err != nil {
		t.Errorf("the reaper took the live environment's run file: %v", err)
	}
	if _, err := os.Stat(liveNS.path); err != nil {
		t.Errorf("the reaper took the live environment's namespace: %v", err)
	}
	if m, err := isMountPoint(live.dataDir); err != nil || !m {
		t.Errorf("the reaper unmounted the live environment's tmpfs: %v", err)
	}
}

// makeDeadRun is TestReapDeadRun in the run to kill: it makes the state,
// reports it on stdout, and waits to be killed. If the test dies instead,
// stdin's end lets the cleanup run.
func makeDeadRun(t *testing.T) {
	e := newEnv(t)
	e.requirePlugin(t)
	e.writeConflist(t, e.confFor(t, "nomad.conflist"))
	ns := e.addNetns(t, "a")
	e.mustCNI(t, "add", ns, portMappings(randomHostPort()))
	e.orphanMasq(t, "dead-run-"+e.id)
	r := deadRun{RunFile: e.runPath(), Bridge: e.bridge, DataDir: e.dataDir, TempRoot: filepath.Dir(t.TempDir()), Netns: []string{ns.path}}
	var err error
	if r.Cache, err = filepath.Glob(filepath.Join(cnitoolCacheDir, "results", e.netName+"-*")); err != nil {
		t.Fatal(err)
	}
	if errs := iptstate.EachTable(func(fam, table string, tb ipTable) []error {
		for _, rule := range tb.Rules {
			if e.ownsRule(rule) {
				r.Rules = append(r.Rules, fam+" "+table+" "+rule.String())
			}
		}
		for _, c := range e.ownedChains() {
			if tb.Chains[c] {
				r.Chains = append(r.Chains, fam+" "+table+" "+c)
			}
		}
		return nil
	}); len(errs) > 0 {
		t.Fatal(errs)
	}
	fmt.Printf("dead-run: %s\n", mustJSON(t, r))
	_, _ = io.Copy(io.Discard, os.Stdin)
}

// left is what of r is still on the host, in a fixed order.
func (r deadRun) left(t *testing.T) []string {
	t.Helper()
	var left []string
	for _, p := range slices.Concat([]string{r.RunFile}, r.Netns, r.Cache) {
		if _, err := os.Lstat(p); err == nil {
			left = append(left, p)
		}
	}
	if linkExists(r.Bridge) {
		left = append(left, "bridge "+r.Bridge)
	}
	if m, err := isMountPoint(r.DataDir); err != nil || m {
		left = append(left, "tmpfs "+r.DataDir)
	}
	if errs := iptstate.EachTable(func(fam, table string, tb ipTable) []error {
		for _, rule := range tb.Rules {
			if s := fam + " " + table + " " + rule.String(); slices.Contains(r.Rules, s) {
				left = append(left, s)
			}
		}
		for _, c := range r.Chains {
			if f := strings.Fields(c); f[0] == fam && f[1] == table && tb.Chains[f[2]] {
				left = append(left, c)
			}
		}
		return nil
	}); len(errs) > 0 {
		t.Fatal(errs)
	}
	return left
}
