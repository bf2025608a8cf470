package sysinfo

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/invoke"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/cniexec"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/dirstate"
)

// startCat starts a process that waits on its stdin (closed at the test's
// end) with the CNI environment args and env make.
func startCat(t *testing.T, args invoke.Args, env ...string) *exec.Cmd {
	t.Helper()
	cmd := cniexec.Command("cat", args, nil, env...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		cmd.Wait()
	})
	return cmd
}

// writeEnviron makes a process pid with environment environ in the /proc
// at root.
func writeEnviron(t *testing.T, root, pid, environ string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(root, pid), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, pid, "environ"), []byte(environ), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestCNIProcessesFindsARuntimesPlugin: a process whose environment names
// a container is found by that ID, with its pid; IDs no process names, and
// IDs that only appear in another variable or as a prefix, are not.
func TestCNIProcessesFindsARuntimesPlugin(t *testing.T) {
	id := fmt.Sprintf("nbc-test-%x", rand.Uint64())
	other := id + "-other"
	plugin := startCat(t, invoke.Args{Command: "DEL", ContainerID: id, IfName: "eth0"})
	startCat(t, invoke.Args{}, "NOT_CNI_CONTAINERID="+other, "X=CNI_CONTAINERID="+other)

	found, err := (&Real{}).CNIProcesses([]string{id, other, id + "-none"})
	if err != nil {
		t.Fatal(err)
	}
	if len(found) != 1 || found[id] != plugin.Process.Pid {
		t.Fatalf("found %v, want only %s -> pid %d", found, id, plugin.Process.Pid)
	}
	if found, err := (&Real{}).CNIProcesses(nil); err != nil || len(found) != 0 {
		t.Fatalf("no IDs asked: %v, %v", found, err)
	}
}

// TestCNIProcessesSkipsThisProcessAndOtherUsers: the scan never counts the
// process that asks (a sweep runs inside a runtime's CHECK, with its own
// CNI_CONTAINERID), nor a process of another user.
func TestCNIProcessesSkipsThisProcessAndOtherUsers(t *testing.T) {
	root := t.TempDir()
	id := "cid-1"
	write := func(pid, environ string) { writeEnviron(t, root, pid, environ) }
	write(fmt.Sprint(os.Getpid()), "CNI_CONTAINERID="+id+"\x00")
	write("self", "CNI_CONTAINERID="+id+"\x00")
	found, err := (&Real{ProcRoot: root}).CNIProcesses([]string{id})
	if err != nil || len(found) != 0 {
		t.Fatalf("this process counted: %v, %v", found, err)
	}
	write("4242", "A=1\x00CNI_CONTAINERID="+id+"\x00B=2")
	if os.Geteuid() == 0 {
		if err := os.Chown(filepath.Join(root, "4242"), 4242, 4242); err != nil {
			t.Fatal(err)
		}
		if found, err := (&Real{ProcRoot: root}).CNIProcesses([]string{id}); err != nil || len(found) != 0 {
			t.Fatalf("another user's process counted: %v, %v", found, err)
		}
		if err := os.Chown(filepath.Join(root, "4242"), 0, 0); err != nil {
			t.Fatal(err)
		}
	}
	if found, err := (&Real{ProcRoot: root}).CNIProcesses([]string{id}); err != nil || found[id] != 4242 {
		t.Fatalf("this user's process not found: %v, %v", found, err)
	}
}

func TestCNIContainerIDParsesAnEnvironmentBlock(t *testing.T) {
	for _, tc := range []struct {
		environ string
		want    string
		ok      bool
	}{
		{"CNI_CONTAINERID=abc", "abc", true},
		{"A=1\x00CNI_CONTAINERID=abc\x00", "abc", true},
		{"A=1\x00CNI_CONTAINERID=first\x00CNI_CONTAINERID=second\x00", "first", true},
		{"XCNI_CONTAINERID=abc\x00", "", false},
		{"A=CNI_CONTAINERID=abc", "", false},
		{"", "", false},
		{strings.Repeat("A", 1<<16) + "\x00CNI_CONTAINERID=big", "big", true},
	} {
		got, ok := cniContainerID([]byte(tc.environ))
		if got != tc.want || ok != tc.ok {
			t.Errorf("%.40q: got %q %v, want %q %v", tc.environ, got, ok, tc.want, tc.ok)
		}
	}
}

// TestCNIProcessesPassesOverAProcessThatCannotBeRead: a process whose
// environment cannot be read (a FIFO stands for one stuck in the kernel)
// is passed over after cniPidBound and the scan goes on; a scan stuck on
// more of them than its own bound allows fails.
func TestCNIProcessesPassesOverAProcessThatCannotBeRead(t *testing.T) {
	root := t.TempDir()
	write := func(pid, environ string) { writeEnviron(t, root, pid, environ) }
	stuck := func(pid string) {
		t.Helper()
		// Whatever the test's outcome, the stuck reads end with it.
		dirstate.PlantFIFO(t, filepath.Join(root, pid, "environ"))
	}
	stuck("100")
	write("200", "CNI_CONTAINERID=after-the-stuck-one\x00")
	stuck("300")
	write("400", "CNI_CONTAINERID=last\x00")
	found, err := (&Real{ProcRoot: root}).CNIProcesses([]string{"after-the-stuck-one", "last"})
	if err != nil || found["after-the-stuck-one"] != 200 || found["last"] != 400 {
		t.Fatalf("found %v, %v; want both, past the two stuck processes", found, err)
	}

	for pid := 500; pid < 500+int(cniScanBound/cniPidBound)+2; pid++ {
		stuck(strconv.Itoa(pid))
	}
	if found, err := (&Real{ProcRoot: root}).CNIProcesses([]string{"last"}); err == nil {
		t.Fatalf("a scan stuck past its bound: found %v, want an error", found)
	}
}
