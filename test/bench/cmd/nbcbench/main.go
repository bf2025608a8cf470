// Command nbcbench runs the benchmarks of `make bench` (test/bench/run.sh):
// the wrapper against bare bridge, interleaved A B A B, and the sweep's cost
// against lease count. Everything it creates is named after a run ID and
// written to a state file first, so `nbcbench cleanup` (run by the driver
// itself and again by run.sh's trap) can remove it after any failure.
//
//	nbcbench run     --bin BIN --repo REPO --work DIR --id ID --out results.json
//	nbcbench cleanup --work DIR
//	nbcbench render  --in results.json        (prints the Markdown block)
//	nbcbench svg     --in results.json --out-dir docs  (the pictures)
//	nbcbench synth   --data-dir D --network N --leases 4094 --stale 50 --live-netns /var/run/netns/X
//	                                          (writes one synthetic network, for profiling by hand)
//	nbcbench node-live ...                    (the node cell's live network, run by run itself
//	                                          under unshare --net: nodenat.go)
package main

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/bench/internal/synth"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: nbcbench run|cleanup|render|svg [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "run":
		err = cmdRun(os.Args[2:])
	case "cleanup":
		err = cmdCleanup(os.Args[2:])
	case "render":
		err = cmdRender(os.Args[2:])
	case "svg":
		err = cmdSVG(os.Args[2:])
	case "synth":
		err = cmdSynth(os.Args[2:])
	case "node-live":
		err = cmdNodeLive(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "nbcbench:", err)
		os.Exit(1)
	}
}

func cmdRun(args []string) error {
	fs := flag.NewFlagSet("run", flag.ExitOnError)
	o := options{}
	fs.StringVar(&o.bin, "bin", "", "directory with nomad-bridge-cni and the reference plugins")
	fs.StringVar(&o.repo, "repo", ".", "repository root (for conflist/nomad.conflist)")
	fs.StringVar(&o.work, "work", "", "scratch directory (tmpfs mounts, state file, caches)")
	fs.StringVar(&o.id, "id", "", "run ID: 8 hex digits, names everything created")
	fs.StringVar(&o.out, "out", "", "write the results as JSON here")
	fs.StringVar(&o.command, "command", "make bench", "the command line to report as having produced the numbers")
	fs.IntVar(&o.pairs, "pairs", 40, "latency pairs (A and B each, and C with --floor)")
	fs.IntVar(&o.rounds, "rounds", 3, "concurrent-ADD rounds (A and B each)")
	fs.IntVar(&o.parallel, "parallel", 32, "containers started at once in the throughput benchmark")
	fs.IntVar(&o.coldPairs, "cold-pairs", 200, "VERSION cold-start rounds (each runs the plugin, bridge, and the --minimal and --floor binaries)")
	fs.StringVar(&o.minimal, "minimal", "", "a minimal static Go binary answering VERSION (test/bench/cmd/minimal): the cold-start floor")
	fs.StringVar(&o.floor, "floor", "", "the floor plugin (test/bench/cmd/floor): its file name is its CNI type, its directory goes on the plugin path after --bin; adds variant C (bridge behind it) to latency and restore, and a binary to cold")
	fs.IntVar(&o.releaseReps, "release-reps", 5, "reps of the 254-stale-leases release comparison")
	fs.IntVar(&o.nodeReps, "node-reps", 9, "reps of the sweeps at a node's sizes (1023 live leases; one gc of 3000 stale)")
	fs.StringVar(&o.sizes, "sizes", "254,4094,65534", "lease counts of the sweep benchmark")
	fs.StringVar(&o.reps, "sweep-reps", "7,5,3", "reps per lease count of the sweep benchmark")
	fs.StringVar(&o.restoreSizes, "restore-sizes", "50,250", "containers restored (one CHECK each) in the restore benchmark; at most 253")
	fs.StringVar(&o.restoreReps, "restore-reps", "2,1", "reps per restore size")
	fs.DurationVar(&o.budget, "budget", 8*time.Minute, "after this much time, the sweep benchmark stops adding rounds (it always runs one)")
	fs.StringVar(&o.only, "only", "", "comma-separated subset of latency,restore,sweep,release,node,concurrent,cold")
	fs.Parse(args)
	if o.bin == "" || o.work == "" || len(o.id) != 8 {
		return fmt.Errorf("run needs --bin, --work and an 8-hex-digit --id")
	}
	var err error
	if o.bin, err = filepath.Abs(o.bin); err != nil {
		return err
	}
	if o.repo, err = filepath.Abs(o.repo); err != nil {
		return err
	}
	if o.work, err = filepath.Abs(o.work); err != nil {
		return err
	}
	if o.floor != "" {
		// Its directory goes on libcni's plugin path.
		if o.floor, err = filepath.Abs(o.floor); err != nil {
			return err
		}
	}

	env, err := newEnv(o)
	if err != nil {
		return err
	}
	// Clean up on SIGINT/SIGTERM too: the benchmarks stop at their next
	// step, then the deferred cleanup runs.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	env.ctx = ctx

	start := time.Now()
	env.deadline = start.Add(o.budget)
	res, runErr := env.runAll()
	cleanErr := cleanup(o.work)
	if res != nil {
		res.Elapsed = time.Since(start).Seconds()
		if o.out != "" {
			if err := writeJSON(o.out, res); err != nil {
				return err
			}
		}
		printTable(os.Stdout, res)
	}
	if runErr != nil {
		return runErr
	}
	return cleanErr
}

func cmdCleanup(args []string) error {
	fs := flag.NewFlagSet("cleanup", flag.ExitOnError)
	work := fs.String("work", "", "the scratch directory of the run")
	fs.Parse(args)
	if *work == "" {
		return fmt.Errorf("cleanup needs --work")
	}
	return cleanup(*work)
}

func cmdRender(args []string) error {
	fs := flag.NewFlagSet("render", flag.ExitOnError)
	in := fs.String("in", "", "results JSON written by run")
	fs.Parse(args)
	res, err := readJSON(*in)
	if err != nil {
		return err
	}
	renderMarkdown(os.Stdout, res)
	return nil
}

func cmdSynth(args []string) error {
	fs := flag.NewFlagSet("synth", flag.ExitOnError)
	var s synth.Spec
	base := fs.String("base", "10.0.0.0", "leases take base+1 .. base+N")
	fs.StringVar(&s.DataDir, "data-dir", "", "the plugin's dataDir")
	fs.StringVar(&s.Network, "network", "", "network name")
	fs.IntVar(&s.Leases, "leases", 254, "leases (and records) to write")
	fs.IntVar(&s.StalePercent, "stale", 0, "percentage of stale attachments (namespace gone)")
	fs.StringVar(&s.LiveNetns, "live-netns", "/proc/self/ns/net", "netns path of the live records")
	fs.StringVar(&s.GonePrefix, "gone-prefix", "/var/run/netns/nbc-synth-gone", "netns path prefix of the stale records (must not exist)")
	fs.StringVar(&s.Seed, "seed", "synth", "container ID seed")
	fs.Parse(args)
	if s.DataDir == "" || s.Network == "" {
		return fmt.Errorf("synth needs --data-dir and --network")
	}
	var err error
	if s.Base, err = netip.ParseAddr(*base); err != nil {
		return err
	}
	r, err := synth.Build(s)
	if err != nil {
		return err
	}
	fmt.Printf("%d live, %d stale\n", r.Live, r.Stale)
	return nil
}
