package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/containernetworking/plugins/pkg/utils"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/bench/internal/synth"
)

// The node cell's live network is swept as on a real node, where each of
// the 1023 containers has bridge's ipMasq rules: a POSTROUTING jump and a
// chain of two rules, in the listing. The rules live in
// a network namespace of the cell's own (`unshare --net`, gone with the
// process): the host's tables are not touched, and the in-process sweep's
// goroutines and the gc processes all see that namespace.

// nodeLiveResult is what `nbcbench node-live` hands back.
type nodeLiveResult struct {
	In, InCPU, Proc, ProcCPU []float64
	MaxRSSKiB                int64
	NATRules                 int
}

// runNodeLive runs the live cell in a new network namespace.
func (e *Env) runNodeLive(s *synthNet) (*nodeLiveResult, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	out := filepath.Join(e.o.work, "node-live.json")
	cmd := exec.CommandContext(e.ctx, "unshare", "--net", self, "node-live",
		"--bin", e.o.bin, "--data-dir", s.spec.DataDir, "--network", s.spec.Network,
		"--leases", fmt.Sprint(s.spec.Leases), "--seed", s.spec.Seed, "--live-netns", s.spec.LiveNetns,
		"--reps", fmt.Sprint(e.o.nodeReps), "--out", out)
	cmd.Env = append(os.Environ(), "NBCB_EXECRSS="+execRSSPath())
	if b, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("node-live: %w: %s", err, strings.TrimSpace(string(b)))
	}
	b, err := os.ReadFile(out)
	if err != nil {
		return nil, err
	}
	var r nodeLiveResult
	return &r, json.Unmarshal(b, &r)
}

// cmdNodeLive is `nbcbench node-live`, run by runNodeLive in a network
// namespace of its own: it builds the network, gives each live container
// bridge's ipMasq rules, and sweeps it reps times in-process and as gc.
func cmdNodeLive(args []string) error {
	fs := flag.NewFlagSet("node-live", flag.ExitOnError)
	var o options
	var spec synth.Spec
	var reps int
	var out string
	fs.StringVar(&o.bin, "bin", "", "directory with nomad-bridge-cni")
	fs.StringVar(&spec.DataDir, "data-dir", "", "data dir of the synthetic network")
	fs.StringVar(&spec.Network, "network", "", "network name")
	fs.IntVar(&spec.Leases, "leases", nodeLiveLeases, "live leases")
	fs.StringVar(&spec.Seed, "seed", "", "container ID seed")
	fs.StringVar(&spec.LiveNetns, "live-netns", "", "the namespace live records name")
	fs.IntVar(&reps, "reps", 9, "reps")
	fs.StringVar(&out, "out", "", "results JSON")
	fs.Parse(args)
	spec.Base, spec.Owned = netip.MustParseAddr("10.0.0.0"), true
	spec.GonePrefix = filepath.Join(netnsDir, "nbcb-node-live-gone")
	s := &synthNet{spec: spec}
	if err := s.ensure(); err != nil {
		return err
	}
	n, err := plantIPMasqRules(spec, s.liveIDs)
	if err != nil {
		return err
	}
	e := &Env{o: o}
	r := nodeLiveResult{NATRules: n}
	for range reps {
		d, c, err := e.sweepInProc(s)
		if err != nil {
			return err
		}
		r.In, r.InCPU = append(r.In, d), append(r.InCPU, c)
		d, rss, c, err := e.sweepProcess(s)
		if err != nil {
			return err
		}
		r.Proc, r.ProcCPU = append(r.Proc, d), append(r.ProcCPU, c)
		r.MaxRSSKiB = max(r.MaxRSSKiB, rss)
	}
	if left, err := countIPMasqJumps(spec.Network); err != nil || left != len(s.liveIDs) {
		return fmt.Errorf("after the sweeps %d of %d live containers' rules are left (%v)", left, len(s.liveIDs), err)
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return os.WriteFile(out, b, 0o644)
}

// plantIPMasqRules gives each container bridge's ipMasq rules, as
// plugins/pkg/ip.SetupIPMasq makes them, in one iptables-restore; it
// returns how many rules it made.
func plantIPMasqRules(spec synth.Spec, cids []string) (int, error) {
	var b strings.Builder
	b.WriteString("*nat\n")
	for _, cid := range cids {
		fmt.Fprintf(&b, ":%s - [0:0]\n", utils.FormatChainName(spec.Network, cid))
	}
	addr, rules := spec.Base, 0
	for _, cid := range cids {
		addr = addr.Next()
		chain, comment := utils.FormatChainName(spec.Network, cid), fmt.Sprintf("%q", utils.FormatComment(spec.Network, cid))
		fmt.Fprintf(&b, "-A POSTROUTING -s %s/32 -m comment --comment %s -j %s\n", addr, comment, chain)
		fmt.Fprintf(&b, "-A %s -d 10.0.0.0/16 -m comment --comment %s -j ACCEPT\n", chain, comment)
		fmt.Fprintf(&b, "-A %s ! -d 224.0.0.0/4 -m comment --comment %s -j MASQUERADE\n", chain, comment)
		rules += 3
	}
	b.WriteString("COMMIT\n")
	cmd := exec.Command("iptables-restore", "-w")
	cmd.Stdin = strings.NewReader(b.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		return 0, fmt.Errorf("iptables-restore: %w: %s", err, out)
	}
	return rules, nil
}

// countIPMasqJumps counts the POSTROUTING jumps commented for network.
func countIPMasqJumps(network string) (int, error) {
	out, err := exec.Command("iptables", "-w", "-t", "nat", "-S", "POSTROUTING").Output()
	if err != nil {
		return 0, err
	}
	return strings.Count(string(out), `--comment "name: \"`+network+`\" id:`), nil
}
