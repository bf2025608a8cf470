package sysinfo

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/testhost"
)

// fakeProc builds a /proc of processes whose ns/net links point at files
// standing in for namespaces (stat follows the link, as it does into nsfs),
// with a comm each and a mountinfo.
type fakeProc struct {
	t    *testing.T
	root string
	nses string
}

func newFakeProc(t *testing.T, mountinfo string) *fakeProc {
	t.Helper()
	p := &fakeProc{t: t, root: t.TempDir(), nses: t.TempDir()}
	if err := os.MkdirAll(filepath.Join(p.root, "self"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(p.root, "self", "mountinfo"), []byte(mountinfo), 0o644); err != nil {
		t.Fatal(err)
	}
	// Entries that are not processes are skipped.
	for _, name := range []string{"sys", "net", "0"} {
		if err := os.MkdirAll(filepath.Join(p.root, name, "ns"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// namespace creates a stand-in namespace file and returns its identity.
func (p *fakeProc) namespace(name string) NetnsID {
	p.t.Helper()
	path := filepath.Join(p.nses, name)
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		p.t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		p.t.Fatal(err)
	}
	return NetnsID{Dev: st.Dev, Ino: st.Ino}
}

func (p *fakeProc) process(pid int, comm, ns string) {
	p.t.Helper()
	dir := filepath.Join(p.root, strconv.Itoa(pid))
	if err := os.MkdirAll(filepath.Join(dir, "ns"), 0o755); err != nil {
		p.t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(p.nses, ns), filepath.Join(dir, "ns", "net")); err != nil {
		p.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "comm"), []byte(comm+"\n"), 0o644); err != nil {
		p.t.Fatal(err)
	}
}

const fakeMountinfo = `22 1 0:21 / /proc rw,nosuid - proc proc rw
46 45 0:4 net:[4026532178] /run/netns/alloc-1 rw shared:2 - nsfs nsfs rw
47 45 0:4 net:[4026532999] /run/my\040netns rw shared:2 - nsfs nsfs rw
48 45 0:4 mnt:[4026532500] /run/mntns rw shared:2 - nsfs nsfs rw
49 45 0:4 net:[bogus] /run/netns/bad rw - nsfs nsfs rw
`

func TestNetnsHoldersFindsProcessesAndMounts(t *testing.T) {
	p := newFakeProc(t, fakeMountinfo)
	old, host := p.namespace("old"), p.namespace("host")
	p.process(20420, "python3", "old")
	p.process(20421, "python3", "old")
	p.process(1, "systemd", "host")
	p.process(31337, "gone", "missing") // its namespace link is dangling: exited mid-scan
	r := &Real{ProcRoot: p.root}

	holders, err := r.NetnsHolders()
	if err != nil {
		t.Fatal(err)
	}
	if got := holders[old]; len(got) != 2 || got[0].PID+got[1].PID != 20420+20421 {
		t.Errorf("holders of the old namespace = %+v", got)
	}
	if got := holders[host]; len(got) != 1 || got[0].PID != 1 {
		t.Errorf("holders of the host namespace = %+v", got)
	}
	nsfs := unix.Mkdev(0, 4)
	if got := holders[NetnsID{Dev: nsfs, Ino: 4026532178}]; len(got) != 1 || got[0].Mount != "/run/netns/alloc-1" {
		t.Errorf("mount holder = %+v", got)
	}
	if got := holders[NetnsID{Dev: nsfs, Ino: 4026532999}]; len(got) != 1 || got[0].Mount != "/run/my netns" {
		t.Errorf("escaped mount point = %+v", got)
	}
	if got := holders[NetnsID{Dev: nsfs, Ino: 4026532500}]; len(got) != 0 {
		t.Errorf("a mount namespace counted as a network namespace holder: %+v", got)
	}
	if n := len(holders); n != 4 {
		t.Errorf("%d namespaces found, want 4: %+v", n, holders)
	}

	h, ok, err := r.ConfirmHolder(Holder{PID: 20420}, old, 0)
	if !ok || err != nil || h.Command != "python3" || h.String() != "pid 20420 (python3)" {
		t.Errorf("ConfirmHolder(20420) = %+v, %v, %v", h, ok, err)
	}
	// Moved to another namespace, or exited, since the scan.
	if _, ok, err := r.ConfirmHolder(Holder{PID: 1}, old, 0); ok || err != nil {
		t.Error("confirmed a process in another namespace")
	}
	if err := os.RemoveAll(filepath.Join(p.root, "20421")); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := r.ConfirmHolder(Holder{PID: 20421}, old, 0); ok || err != nil {
		t.Error("confirmed a process that exited")
	}
	// A cookie is read by entering the namespace: a stand-in file is not
	// one, so whether it holds the namespace cannot be told.
	if _, ok, err := r.ConfirmHolder(Holder{PID: 20420}, old, 6108); ok || err == nil {
		t.Errorf("a cookie that could not be read: confirmed %v, error %v; want neither a yes nor a no", ok, err)
	}
}

func TestParseNsfsMount(t *testing.T) {
	for _, tc := range []struct {
		line  string
		ok    bool
		ino   uint64
		mount string
	}{
		{line: "46 45 0:4 net:[4026532178] /run/netns/a rw shared:2 - nsfs nsfs rw", ok: true, ino: 4026532178, mount: "/run/netns/a"},
		{line: "46 45 0:4 net:[4026532178] /run/netns/a rw - nsfs nsfs rw", ok: true, ino: 4026532178, mount: "/run/netns/a"},
		{line: "46 45 0:4 net:[4026532178] /run/a\\134b rw - nsfs nsfs rw", ok: true, ino: 4026532178, mount: `/run/a\b`},
		{line: "46 45 0:4 uts:[4026532178] /run/a rw - nsfs nsfs rw"},
		{line: "46 45 0:4 net:[4026532178] /run/a rw - tmpfs tmpfs rw"},
		{line: "46 45 0:x net:[4026532178] /run/a rw - nsfs nsfs rw"},
		{line: "46 45 0:4 net:[4026532178]"},
		{line: ""},
	} {
		id, mount, ok := parseNsfsMount(tc.line)
		if ok != tc.ok || (ok && (id.Ino != tc.ino || id.Dev != unix.Mkdev(0, 4) || mount != tc.mount)) {
			t.Errorf("parseNsfsMount(%q) = %+v, %q, %v", tc.line, id, mount, ok)
		}
	}
}

// The real /proc: this process is found in its own namespace, and the
// device in mountinfo is the device stat reports.
func TestNetnsHoldersOnThisHost(t *testing.T) {
	r := &Real{}
	own, err := r.Netns("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	holders, err := r.NetnsHolders()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, h := range holders[own] {
		if h.PID == os.Getpid() {
			found = true
		}
	}
	if !found {
		t.Fatalf("this process (pid %d) is not among the holders of its own namespace %+v", os.Getpid(), own)
	}
	h, ok, err := r.ConfirmHolder(Holder{PID: os.Getpid()}, own, 0)
	if !ok || err != nil || h.Command == "" {
		t.Errorf("ConfirmHolder(self) = %+v, %v, %v", h, ok, err)
	}
}

// A holder's command is what the process named itself (prctl
// PR_SET_NAME: any process in a container can): it reaches the ADD's
// refusal, which runtimes show their operator, and `leases`, so a
// terminal's escape sequences in it are written as Go escapes
// (regression: they were passed on raw).
func TestConfirmHolderEscapesTheCommand(t *testing.T) {
	p := newFakeProc(t, "")
	ns := p.namespace("tenant")
	p.process(4242, "\x1b]2;x\x07\u009b", "tenant")
	h, ok, err := (&Real{ProcRoot: p.root}).ConfirmHolder(Holder{PID: 4242}, ns, 0)
	if !ok || err != nil {
		t.Fatalf("ConfirmHolder = %+v, %v, %v", h, ok, err)
	}
	if want := `pid 4242 (\x1b]2;x\a\u009b)`; h.String() != want {
		t.Errorf("holder %q, want %q", h.String(), want)
	}
}

// A namespace is held by a thread in it as much as by a process: the
// kernel keeps it while any task is in it. A thread of a process whose
// other threads are elsewhere (a Go program's locked thread that entered
// it, or a process whose main thread exited) is found, and confirmed
// (regression: only each process's main thread was looked at, and such a
// namespace was judged unheld, its address released).
func TestNetnsHoldersFindsAThreadInANamespace(t *testing.T) {
	type entered struct {
		id  NetnsID
		tid int
		err error
	}
	in, leave := make(chan entered, 1), make(chan struct{})
	defer close(leave)
	onAThreadOfItsOwn(func() {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			in <- entered{err: err}
			return
		}
		id, err := (&Real{}).Netns("/proc/thread-self/ns/net")
		in <- entered{id: id, tid: unix.Gettid(), err: err}
		<-leave
	})
	e := <-in
	if errors.Is(e.err, unix.EPERM) {
		testhost.SkipOrFail(t, fmt.Sprintf("cannot make a network namespace here: %v", e.err))
	}
	if e.err != nil {
		t.Fatal(e.err)
	}
	r := &Real{}
	holders, err := r.NetnsHolders()
	if err != nil {
		t.Fatal(err)
	}
	var found *Holder
	for _, h := range holders[e.id] {
		if h.PID == os.Getpid() {
			found = &h
		}
	}
	if found == nil {
		t.Fatalf("the thread %d of this process (pid %d) in namespace %+v is not among its holders %+v", e.tid, os.Getpid(), e.id, holders[e.id])
	}
	cookie, err := r.NetnsCookie(fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), e.tid))
	if err != nil {
		testhost.SkipOrFail(t, fmt.Sprintf("no namespace cookie here: %v", err))
	}
	if h, ok, err := r.ConfirmHolder(*found, e.id, cookie); !ok || err != nil {
		t.Errorf("ConfirmHolder(%+v) = %+v, %v, %v", *found, h, ok, err)
	}
	// The process's main thread is not in it.
	own, err := r.Netns("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	if own == e.id {
		t.Fatal("the thread did not leave the process's namespace")
	}
}

// onAThreadOfItsOwn runs fn on a thread that is not the process's main
// one, locked to it, and ends the thread with fn: what fn changes of its
// thread (its namespace) dies with it.
func onAThreadOfItsOwn(fn func()) {
	go func() {
		runtime.LockOSThread()
		if unix.Gettid() != unix.Getpid() {
			fn() // never unlocked: the thread ends with the goroutine
			return
		}
		// The main thread, kept busy here so that fn gets another.
		done := make(chan struct{})
		go func() {
			defer close(done)
			runtime.LockOSThread()
			fn()
		}()
		<-done
		runtime.UnlockOSThread()
	}()
}

// A process whose main thread has exited (its ns/net link is gone) holds
// the namespace its other threads are in.
func TestNetnsHoldersFindsTheThreadsOfAnExitedLeader(t *testing.T) {
	p := newFakeProc(t, "")
	ns := p.namespace("tenant")
	p.process(700, "worker", "missing") // the leader exited: its link dangles
	for _, tid := range []string{"700", "701"} {
		dir := filepath.Join(p.root, "700", "task", tid)
		if err := os.MkdirAll(filepath.Join(dir, "ns"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join(p.nses, "tenant"), filepath.Join(dir, "ns", "net")); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "comm"), []byte("worker-"+tid+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	r := &Real{ProcRoot: p.root}
	holders, err := r.NetnsHolders()
	if err != nil {
		t.Fatal(err)
	}
	got := holders[ns]
	if len(got) != 1 || got[0].PID != 700 || got[0].TID != 701 {
		t.Fatalf("holders of the namespace = %+v, want thread 701 of pid 700", got)
	}
	h, ok, err := r.ConfirmHolder(got[0], ns, 0)
	if !ok || err != nil || h.String() != "pid 700 thread 701 (worker-701)" {
		t.Errorf("ConfirmHolder(%+v) = %+v, %v, %v", got[0], h, ok, err)
	}
}

// A namespace that processes keep by forking the next and exiting (a
// daemon's double fork, a supervisor's restarts) is held all along: the
// scan must not lose it to a holder that exits after the listing named it
// and before it was looked at, while its child, not listed, runs on
// (regression: such a namespace was found held by nothing, one scan in
// seven here).
func TestNetnsHoldersFollowsAHolderThatForksAndExits(t *testing.T) {
	type started struct {
		id  NetnsID
		cmd *exec.Cmd
		err error
	}
	in := make(chan started, 1)
	onAThreadOfItsOwn(func() {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			in <- started{err: err}
			return
		}
		id, err := (&Real{}).Netns("/proc/thread-self/ns/net")
		if err != nil {
			in <- started{err: err}
			return
		}
		// Forked from this thread: in its namespace. Each hop sleeps,
		// starts the next and exits; 2000 hops end it in any case.
		cmd := exec.Command("sh", "-c", `hop() { [ "$1" -gt 0 ] || exit 0; sleep 0.005; hop $(($1 - 1)) & }; hop 2000`)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		err = cmd.Start()
		in <- started{id: id, cmd: cmd, err: err}
		// The thread ends here: the hops alone hold the namespace.
	})
	s := <-in
	if errors.Is(s.err, unix.EPERM) {
		testhost.SkipOrFail(t, fmt.Sprintf("cannot make a network namespace here: %v", s.err))
	}
	if s.err != nil {
		t.Fatal(s.err)
	}
	pgid := s.cmd.Process.Pid
	t.Cleanup(func() { _ = unix.Kill(-pgid, unix.SIGKILL) })
	go s.cmd.Wait() // the first hop's shell exits at once

	r := &Real{}
	misses, scans := 0, 200
	for range scans {
		holders, err := r.NetnsHolders()
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(holders[s.id], func(h Holder) bool { return h.PID > 0 }) {
			misses++
		}
		time.Sleep(time.Millisecond)
	}
	if misses > 0 {
		t.Errorf("the namespace its processes held all along was found held by nothing in %d of %d scans", misses, scans)
	}
}
