// Package sweep benchmarks reclaim.Sweep in-process over synthetic
// host-local directories (see test/bench/internal/synth), for profiling:
//
//	go test ./test/bench/sweep -run '^$' -bench 'Sweep/leases=65534/stale=0' \
//	    -benchtime 5x -cpuprofile cpu.out -memprofile mem.out
//	go tool pprof -top test/bench/sweep/sweep.test cpu.out
//
// The sweeper is the one CHECK uses (real host, real netfilter): a sweep
// that finds stale attachments lists the NAT rules, which needs root and
// iptables. "Live" records name NBC_BENCH_NETNS (a network namespace
// path), default /proc/self/ns/net, which is nsfs like /var/run/netns/X.
// NBC_BENCH_NONAT=1 sweeps without the NAT cleanup, to separate its cost.
// The directories go under NBC_BENCH_DIR (default /dev/shm, a tmpfs like
// the plugin's dataDir; else a temp dir).
package sweep

import (
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/netfilter"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/reclaim"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/sysinfo"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/bench/internal/synth"
)

func liveNetns() string {
	if p := os.Getenv("NBC_BENCH_NETNS"); p != "" {
		return p
	}
	return "/proc/self/ns/net"
}

func benchDir(b *testing.B) string {
	d := os.Getenv("NBC_BENCH_DIR")
	if d == "" {
		// tmpfs, like the plugin's dataDir; a disk-backed temp dir makes
		// the build of 65534 leases (and the releases) I/O-bound.
		if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
			d = "/dev/shm"
		}
	}
	if d != "" {
		dir, err := os.MkdirTemp(d, "nbc-sweep-bench-")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { os.RemoveAll(dir) })
		return dir
	}
	return b.TempDir()
}

func BenchmarkSweep(b *testing.B) {
	for _, n := range []int{254, 1000, 4094, 65534} {
		for _, pct := range []int{0, 50, 100} {
			b.Run(fmt.Sprintf("leases=%d/stale=%d", n, pct), func(b *testing.B) {
				benchSweep(b, n, pct)
			})
		}
	}
}

// BenchmarkSweepNode is make bench's cell 2b in-process, for profiling:
// a CHECK's sweep of a network the plugin owns (its NAT rules are listed
// for orphans) holding bridge's maximum of 1023 other live attachments.
func BenchmarkSweepNode(b *testing.B) {
	benchSweepOwned(b, 1023, 0, true)
}

func benchSweep(b *testing.B, n, pct int) {
	benchSweepOwned(b, n, pct, false)
}

func benchSweepOwned(b *testing.B, n, pct int, owned bool) {
	dataDir := benchDir(b)
	const network = "bench"
	spec := synth.Spec{
		DataDir: dataDir, Network: network, Leases: n, StalePercent: pct, Owned: owned,
		Base: netip.MustParseAddr("10.0.0.0"), LiveNetns: liveNetns(),
		GonePrefix: "/var/run/netns/nbc-bench-gone", Seed: "bench",
	}
	build := func() {
		if err := synth.Remove(dataDir, network); err != nil {
			b.Fatal(err)
		}
		if _, err := synth.Build(spec); err != nil {
			b.Fatal(err)
		}
	}
	build()
	b.ReportAllocs()
	var liveBytes uint64
	var cpu time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if pct > 0 && i > 0 {
			b.StopTimer()
			build()
			b.StartTimer()
		}
		// A fresh sweeper per sweep, as each CHECK process has.
		s := &reclaim.Sweeper{Env: reclaim.Env{Host: &sysinfo.Real{}, Netfilter: netfilter.New()}}
		if os.Getenv("NBC_BENCH_NONAT") != "" {
			s.Netfilter = nil // what the NAT lookup costs: compare with and without
		}
		c0 := cpuTime()
		rep, err := s.Sweep(reclaim.Request{Dir: ipamdir.New(dataDir, network), SkipUnchangedNAT: true})
		cpu += cpuTime() - c0
		if err != nil {
			b.Fatal(err)
		}
		if want := n * pct / 100; rep.Released != want {
			b.Fatalf("released %d, want %d", rep.Released, want)
		}
		if i == 0 {
			// What the sweep's result keeps alive: the floor of its
			// peak heap (the report holds every lease and record).
			b.StopTimer()
			var before, after runtime.MemStats
			rep2 := rep
			rep = nil
			runtime.GC()
			runtime.ReadMemStats(&after)
			runtime.KeepAlive(rep2)
			rep2 = nil
			runtime.GC()
			runtime.ReadMemStats(&before)
			liveBytes = after.HeapAlloc - min(after.HeapAlloc, before.HeapAlloc)
			b.StartTimer()
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(liveBytes)/float64(n), "report-B/lease")
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/lease")
}

// cpuTime is the process's user + system time, and its waited-for
// children's (iptables, nft): less distorted by a busy machine than wall
// time.
func cpuTime() time.Duration {
	var self, kids syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &self)
	syscall.Getrusage(syscall.RUSAGE_CHILDREN, &kids)
	return time.Duration(self.Utime.Nano() + self.Stime.Nano() + kids.Utime.Nano() + kids.Stime.Nano())
}

// BenchmarkRestoreCheckSweeps is the sweeping part of a Nomad client
// restart: N restored allocations on one network, then N CHECKs one after
// another, each asking whether to sweep (checkSweepInterval) and sweeping
// when due, as the plugin's CHECK (plugin.Plugin's check) does. With an
// interval of 0s every CHECK sweeps all N attachments (O(N²)); with the
// default 10s the CHECKs of one restore share a sweep (O(N)). One op is
// the whole restore.
//
//	go test ./test/bench/sweep -run '^$' -bench RestoreCheckSweeps -benchtime 3x
func BenchmarkRestoreCheckSweeps(b *testing.B) {
	for _, n := range []int{50, 250, 1000} {
		for _, interval := range []time.Duration{0, 10 * time.Second} {
			b.Run(fmt.Sprintf("allocs=%d/interval=%s", n, interval), func(b *testing.B) {
				dataDir := benchDir(b)
				const network = "restore"
				if _, err := synth.Build(synth.Spec{
					DataDir: dataDir, Network: network, Leases: n,
					Base: netip.MustParseAddr("10.0.0.0"), LiveNetns: liveNetns(),
					GonePrefix: "/var/run/netns/nbc-bench-gone", Seed: "restore",
				}); err != nil {
					b.Fatal(err)
				}
				d := ipamdir.New(dataDir, network)
				sweeps := 0
				for b.Loop() {
					// A restart: the last sweep was long ago.
					if err := os.Remove(d.Marker(ipamdir.LastSweepMarker)); err != nil && !os.IsNotExist(err) {
						b.Fatal(err)
					}
					for range n {
						// A fresh sweeper per CHECK, as each CHECK process has.
						s := &reclaim.Sweeper{Env: reclaim.Env{Host: &sysinfo.Real{}}}
						rep, err := s.CheckSweep(reclaim.Request{Dir: d, SkipUnchangedNAT: true}, interval)
						if err != nil {
							b.Fatal(err)
						}
						if rep != nil {
							sweeps++
						}
					}
				}
				b.ReportMetric(float64(sweeps)/float64(b.N), "sweeps/restore")
			})
		}
	}
}
