//go:build linux && amd64

package main

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/testhost"
)

// The test binary is the runner too (runnerEnv: runMain on its arguments)
// and the traced Go programs (helperEnv), so nothing is built.
const (
	runnerEnv = "NBC_SYSKILL_TEST_RUNNER"
	helperEnv = "NBC_SYSKILL_TEST_HELPER"
)

func TestMain(m *testing.M) {
	if os.Getenv(runnerEnv) != "" {
		os.Unsetenv(runnerEnv) // the traced program is no runner
		os.Exit(runMain(os.Args[1:]))
	}
	switch os.Getenv(helperEnv) {
	case "threads":
		os.Exit(threadsHelper())
	case "misc":
		os.Exit(miscHelper())
	}
	os.Exit(m.Run())
}

// threadsHelper creates files f0..f5, each from a goroutine locked to a
// thread of its own, one after the other: each thread makes exactly one
// counted call, so only a count over all threads reaches K ≥ 2.
func threadsHelper() int {
	const n = 6
	turn := make([]chan struct{}, n+1)
	for i := range turn {
		turn[i] = make(chan struct{})
	}
	tids := make(chan int, n)
	for i := range n {
		go func() {
			runtime.LockOSThread() // never unlocked: the thread is this goroutine's alone
			tids <- unix.Gettid()
			<-turn[i]
			if f, err := os.Create(fmt.Sprintf("f%d", i)); err == nil {
				f.Close()
			}
			close(turn[i+1])
		}()
	}
	seen := map[int]bool{}
	for range n {
		seen[<-tids] = true
	}
	if len(seen) != n {
		fmt.Fprintf(os.Stderr, "want %d threads, got %v\n", n, seen)
		return 1
	}
	close(turn[0])
	<-turn[n]
	return 0
}

// miscHelper makes calls that must count (a netlink send, flock, fcntl
// F_SETLK) and look-alikes that must not (a UDP send, fcntl F_GETFL, an
// open without O_CREAT).
func miscHelper() int {
	err := func() error {
		udp, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
		if err != nil {
			return err
		}
		defer unix.Close(udp)
		if err := unix.Sendto(udp, []byte("x"), 0, &unix.SockaddrInet4{Port: 9, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
			return err
		}
		nl, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_ROUTE)
		if err != nil {
			return err
		}
		defer unix.Close(nl)
		// RTM_GETLINK, NLM_F_REQUEST|NLM_F_DUMP, and an ifinfomsg.
		req := make([]byte, unix.SizeofNlMsghdr+unix.SizeofIfInfomsg)
		binary.NativeEndian.PutUint32(req[0:], uint32(len(req)))
		binary.NativeEndian.PutUint16(req[4:], unix.RTM_GETLINK)
		binary.NativeEndian.PutUint16(req[6:], unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
		if err := unix.Sendto(nl, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
			return err
		}
		f, err := os.Open("lockfile") // exists: no O_CREAT
		if err != nil {
			return err
		}
		defer f.Close()
		if err := unix.Flock(int(f.Fd()), unix.LOCK_SH); err != nil {
			return err
		}
		if _, err := unix.FcntlInt(f.Fd(), unix.F_GETFL, 0); err != nil {
			return err
		}
		return unix.FcntlFlock(f.Fd(), unix.F_SETLK, &unix.Flock_t{Type: unix.F_RDLCK})
	}()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

func requireRoot(t *testing.T) {
	t.Helper()
	if missing := testhost.MissingTools("sh", "touch", "mv", "rm"); len(missing) > 0 {
		testhost.SkipOrFail(t, "syskill tests need "+strings.Join(missing, ", ")+" (they trace real processes)")
	}
}

// syskill runs the runner in dir with args and returns its exit status
// and report.
func syskill(t *testing.T, dir string, env []string, args ...string) (int, report) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	reportPath := filepath.Join(t.TempDir(), "report.json")
	cmd := exec.Command(exe, append([]string{"-report", reportPath}, args...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), append(env, runnerEnv+"=1")...)
	out, err := cmd.CombinedOutput()
	code := 0
	if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("run syskill: %v", err)
	}
	raw, err := os.ReadFile(reportPath)
	if err != nil {
		t.Fatalf("no report (exit %d, output %s): %v", code, out, err)
	}
	var rep report
	if err := json.Unmarshal(raw, &rep); err != nil {
		t.Fatalf("report %s: %v", raw, err)
	}
	t.Logf("syskill %s: exit %d, report %s", strings.Join(args, " "), code, raw)
	return code, rep
}

func exists(t *testing.T, path string) bool {
	t.Helper()
	_, err := os.Lstat(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return err == nil
}

// sh's script: three file operations, each in a child process (touch, mv,
// rm; mv in a subshell's child), then one more that must not happen after
// a kill.
const script = "touch a; (mv a b; true); rm b; touch after"

// TestCountsAcrossProcesses: -k 0 counts every chosen call of sh's
// children and lets the program finish.
func TestCountsAcrossProcesses(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	code, rep := syskill(t, dir, nil, "-k", "0", "-calls", "unlink,rename,create", "--", "sh", "-c", script)
	if code != 0 || rep.Killed || rep.Count != 4 {
		t.Fatalf("exit %d, report %+v: want exit 0, 4 calls counted, not killed", code, rep)
	}
	if want := map[string]int{"create": 2, "rename": 1, "unlink": 1}; !maps.Equal(rep.ByClass, want) {
		t.Errorf("by class %v, want %v", rep.ByClass, want)
	}
	if !exists(t, filepath.Join(dir, "after")) || exists(t, filepath.Join(dir, "b")) {
		t.Error("the script did not run to its end")
	}
}

// TestKillsBeforeTheCall: at each K the call is not made, the process
// making it is a child of the program (not the program itself), and the
// program makes no call after it: the whole tree is dead.
func TestKillsBeforeTheCall(t *testing.T) {
	requireRoot(t)
	for _, tc := range []struct {
		k           int
		comm, class string
		left        []string // what exists after the kill
	}{
		{1, "touch", "create", nil},
		{2, "mv", "rename", []string{"a"}},
		{3, "rm", "unlink", []string{"b"}},
	} {
		t.Run(fmt.Sprint("k=", tc.k), func(t *testing.T) {
			dir := t.TempDir()
			code, rep := syskill(t, dir, nil, "-k", fmt.Sprint(tc.k), "-calls", "unlink,rename,create", "--", "sh", "-c", script)
			if code != 137 || !rep.Killed || rep.Count != tc.k || rep.At == nil {
				t.Fatalf("exit %d, report %+v: want exit 137, killed at call %d", code, rep, tc.k)
			}
			if rep.At.Comm != tc.comm || rep.At.Class != tc.class {
				t.Errorf("killed at %+v, want %s's %s", *rep.At, tc.comm, tc.class)
			}
			// Reaped, not a zombie, even mv, whose parent (the subshell)
			// died with it and left it to init.
			if _, err := os.Stat(fmt.Sprintf("/proc/%d", rep.At.PID)); err == nil {
				t.Errorf("pid %d (%s) still exists after syskill returned", rep.At.PID, rep.At.Comm)
			}
			entries, _ := os.ReadDir(dir)
			var got []string
			for _, e := range entries {
				got = append(got, e.Name())
			}
			if !slices.Equal(got, tc.left) {
				t.Errorf("files after the kill: %v, want %v (the K-th call made, or the script went on)", got, tc.left)
			}
		})
	}
}

// TestExitStatus: the program's own status passes through, a signal's as
// 128+signal.
func TestExitStatus(t *testing.T) {
	requireRoot(t)
	for script, want := range map[string]int{"exit 3": 3, "kill -TERM $$": 143, "true": 0} {
		if code, rep := syskill(t, t.TempDir(), nil, "--", "sh", "-c", script); code != want || rep.Killed {
			t.Errorf("sh -c %q: exit %d (killed %v), want %d", script, code, rep.Killed, want)
		}
	}
	if code, _ := syskill(t, t.TempDir(), nil, "-k", "5", "--", "sh", "-c", "exit 3"); code != 3 {
		t.Errorf("a K past the last call: exit %d, want the program's 3", code)
	}
}

// TestThreadsCountedGlobally: six threads of one Go process make one
// create each; the K-th is counted across them, and killed on its thread.
func TestThreadsCountedGlobally(t *testing.T) {
	requireRoot(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	env := []string{helperEnv + "=threads"}
	dir := t.TempDir()
	logPath := filepath.Join(t.TempDir(), "log")
	if code, rep := syskill(t, dir, env, "-calls", "create", "-log", logPath, "--", exe); code != 0 || rep.Count != 6 {
		t.Fatalf("exit %d, %d creates counted, want exit 0 and 6", code, rep.Count)
	}
	raw, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	threads := map[int]bool{}
	for line := range strings.Lines(string(raw)) {
		var h hit
		if err := json.Unmarshal([]byte(line), &h); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		threads[h.TID] = true
	}
	if len(threads) != 6 {
		t.Fatalf("the creates came from %d threads, want 6:\n%s", len(threads), raw)
	}

	dir = t.TempDir()
	code, rep := syskill(t, dir, env, "-k", "4", "-calls", "create", "--", exe)
	if code != 137 || rep.At == nil || rep.At.Detail != filepath.Join(dir, "f3") {
		t.Fatalf("exit %d, report %+v: want killed at the create of f3", code, rep)
	}
	if rep.At.TID == rep.At.PID {
		t.Errorf("the 4th create was made on the main thread %d: the helper's threads are not its own", rep.At.TID)
	}
	for i := range 6 {
		if got, want := exists(t, filepath.Join(dir, fmt.Sprintf("f%d", i))), i < 3; got != want {
			t.Errorf("f%d exists: %v, want %v", i, got, want)
		}
	}
}

// TestWhatCounts: netlink sends count, a UDP send does not; flock and
// fcntl's locks count, fcntl F_GETFL does not; an open without O_CREAT
// does not.
func TestWhatCounts(t *testing.T) {
	requireRoot(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "lockfile"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(t.TempDir(), "log")
	code, rep := syskill(t, dir, []string{helperEnv + "=misc"}, "-calls", "nlsend,flock,create", "-log", logPath, "--", exe)
	raw, _ := os.ReadFile(logPath)
	if want := map[string]int{"nlsend": 1, "flock": 2}; code != 0 || !maps.Equal(rep.ByClass, want) {
		t.Fatalf("exit %d, by class %v, want exit 0 and %v; counted:\n%s", code, rep.ByClass, want, raw)
	}
	if !strings.Contains(string(raw), `"call":"sendto","class":"nlsend","detail":"fd `) || !strings.Contains(string(raw), "netlink protocol 0") {
		t.Errorf("the netlink send is not described as one:\n%s", raw)
	}
}
