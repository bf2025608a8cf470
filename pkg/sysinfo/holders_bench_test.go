package sysinfo

import (
	"fmt"
	"os"
	"os/exec"
	"testing"
)

// BenchmarkNetnsHolders measures the holder scan a sweep makes once when
// some namespace path fails its check: with this many processes running
// besides the machine's own (each a `sleep`, started before the timer).
// Run: go test ./pkg/sysinfo -run '^$' -bench NetnsHolders
func BenchmarkNetnsHolders(b *testing.B) {
	for _, extra := range []int{1000, 5000} {
		b.Run(fmt.Sprintf("procs=+%d", extra), func(b *testing.B) {
			startSleepers(b, extra)
			r := &Real{}
			own, err := r.Netns("/proc/self/ns/net")
			if err != nil {
				b.Fatal(err)
			}
			var n int
			for b.Loop() {
				holders, err := r.NetnsHolders()
				if err != nil {
					b.Fatal(err)
				}
				n = len(holders[own])
			}
			b.ReportMetric(float64(n), "procs-in-ns")
		})
	}
	// What confirming one holder costs on top: a stat, entering the
	// namespace for its cookie, a read of comm.
	b.Run("confirm-with-cookie", func(b *testing.B) {
		r := &Real{}
		own, err := r.Netns("/proc/self/ns/net")
		if err != nil {
			b.Fatal(err)
		}
		cookie, err := r.NetnsCookie("/proc/self/ns/net")
		if err != nil {
			b.Skipf("no namespace cookie here: %v", err)
		}
		for b.Loop() {
			if _, ok, err := r.ConfirmHolder(Holder{PID: os.Getpid()}, own, cookie); !ok || err != nil {
				b.Fatal("own namespace not confirmed")
			}
		}
	})
}

func startSleepers(b *testing.B, n int) {
	b.Helper()
	cmds := make([]*exec.Cmd, 0, n)
	b.Cleanup(func() {
		for _, c := range cmds {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
	})
	for range n {
		c := exec.Command("sleep", "3600")
		if err := c.Start(); err != nil {
			b.Fatalf("start process %d of %d: %v", len(cmds)+1, n, err)
		}
		cmds = append(cmds, c)
	}
}
