package procwait

import (
	"os/exec"
	"slices"
	"testing"
	"time"
)

func TestExit(t *testing.T) {
	cmd := exec.Command("sleep", "3600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

	running, err := Exit([]int{pid}, time.Now().Add(50*time.Millisecond))
	if err != nil || !slices.Equal(running, []int{pid}) {
		t.Fatalf("a sleeping process: running %v, %v; want [%d]", running, err, pid)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	// Not reaped yet: a zombie has exited.
	if running, err := Exit([]int{pid}, time.Now().Add(10*time.Second)); err != nil || len(running) != 0 {
		t.Fatalf("a killed process: running %v, %v; want none", running, err)
	}
	_ = cmd.Wait()
	if running, err := Exit([]int{pid}, time.Now().Add(10*time.Second)); err != nil || len(running) != 0 {
		t.Fatalf("a reaped process: running %v, %v; want none", running, err)
	}
}
