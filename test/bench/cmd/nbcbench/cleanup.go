package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containernetworking/plugins/pkg/utils"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/iptstate"
)

// The approach is the e2e suite's (test/e2e/harness_test.go,
// iptables_test.go, main_test.go; the iptables reader is shared with it,
// internal/iptstate): delete what is named after the
// run's networks, containers and subnets, then the shared chains the run
// created if nothing else uses them, then check that nothing is left.

var snapshotSysctls = []string{
	"/proc/sys/net/ipv4/ip_forward",
	"/proc/sys/net/ipv6/conf/all/forwarding",
}

// snapshotHost records which shared chains and sysctl values existed before
// the run, so cleanup removes only what the run created.
func snapshotHost(e *Env) {
	iptstate.EachTable(func(fam, table string, tb iptstate.Table) []error {
		for _, c := range iptstate.SharedChains {
			if tb.Chains[c] {
				e.note("chain-before", fam, table, c)
			}
		}
		return nil
	})
	for _, p := range snapshotSysctls {
		if raw, err := os.ReadFile(p); err == nil {
			e.note("sysctl", p, strings.TrimSpace(string(raw)))
		}
	}
	e.note("snapshot-done")
}

// runState is the state file read back.
type runState struct {
	id          string
	mounts      []string
	networks    []string
	bridges     []string
	subnets     []netip.Prefix
	adminChains []string
	netns       []string
	cids        map[string][]string // network -> container IDs
	chainBefore map[string]bool     // "fam/table/chain"
	sysctls     map[string]string
	snapshotted bool
}

func readState(work string) (*runState, error) {
	f, err := os.Open(filepath.Join(work, "state"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	s := &runState{cids: map[string][]string{}, chainBefore: map[string]bool{}, sysctls: map[string]string{}}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		f := strings.Split(sc.Text(), "\t")
		switch {
		case f[0] == "id" && len(f) == 2:
			s.id = f[1]
		case f[0] == "mount" && len(f) == 2:
			s.mounts = append(s.mounts, f[1])
		case f[0] == "network" && len(f) == 2:
			s.networks = append(s.networks, f[1])
		case f[0] == "bridge" && len(f) == 2:
			s.bridges = append(s.bridges, f[1])
		case f[0] == "subnet" && len(f) == 2:
			if p, err := netip.ParsePrefix(f[1]); err == nil {
				s.subnets = append(s.subnets, p)
			}
		case f[0] == "adminchain" && len(f) == 2:
			s.adminChains = append(s.adminChains, f[1])
		case f[0] == "netns" && len(f) == 2:
			s.netns = append(s.netns, f[1])
		case f[0] == "cid" && len(f) == 3:
			s.cids[f[1]] = append(s.cids[f[1]], f[2])
		case f[0] == "chain-before" && len(f) == 4:
			s.chainBefore[f[1]+"/"+f[2]+"/"+f[3]] = true
		case f[0] == "sysctl" && len(f) == 3:
			s.sysctls[f[1]] = f[2]
		case f[0] == "snapshot-done":
			s.snapshotted = true
		}
	}
	return s, sc.Err()
}

// cleanup undoes everything the state file names. It is idempotent.
func cleanup(work string) error {
	s, err := readState(work)
	if err != nil || s == nil {
		return err
	}
	var errs []error
	add := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	// Bridge ports first: the host ends of the veth pairs.
	for _, br := range s.bridges {
		add(deleteBridgePorts(br))
		if linkExists(br) {
			add(run("ip", "link", "delete", br))
		}
	}
	nsNames := slices.Clone(s.netns)
	if s.id != "" {
		// Also any namespace of the run that was created but, by a crash
		// between note and create, not yet noted (cannot happen) or noted
		// under another tag.
		if out, err := output("ip", "netns", "list"); err == nil {
			for line := range strings.SplitSeq(out, "\n") {
				if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(f[0], "nbcb-"+s.id+"-") {
					nsNames = append(nsNames, f[0])
				}
			}
		}
	}
	slices.Sort(nsNames)
	for _, n := range slices.Compact(nsNames) {
		add(delNetns(n))
	}
	errs = append(errs, cleanupIPTables(s)...)
	if s.snapshotted {
		for _, fam := range iptstate.Families {
			errs = append(errs, restoreSharedChains(s, fam)...)
		}
		for p, v := range s.sysctls {
			raw, err := os.ReadFile(p)
			if err == nil && strings.TrimSpace(string(raw)) != v {
				add(os.WriteFile(p, []byte(v), 0o644))
			}
		}
	}
	for _, n := range s.networks {
		matches, _ := filepath.Glob(filepath.Join("/var/lib/cni/results", n+"-*"))
		for _, m := range matches {
			add(os.Remove(m))
		}
		// The plugin's and host-local's defaults: nothing may be written
		// there (dataDir is always set), but never leave it behind.
		for _, d := range []string{"/var/lib/cni/networks", "/var/run/cni"} {
			add(os.RemoveAll(filepath.Join(d, n)))
			add(os.RemoveAll(filepath.Join(d, ".nomad-bridge-cni", n)))
		}
	}
	for _, m := range s.mounts {
		for range 4 {
			mounted, err := isMountPoint(m)
			if err != nil || !mounted {
				add(err)
				break
			}
			if err := run("umount", m); err != nil {
				add(err)
				break
			}
		}
	}
	errs = append(errs, leftovers(s)...)
	return errors.Join(errs...)
}

func deleteBridgePorts(br string) error {
	if !linkExists(br) {
		return nil
	}
	raw, err := exec.Command("ip", "-j", "link", "show", "master", br).Output()
	if err != nil {
		return fmt.Errorf("list ports of %s: %w", br, err)
	}
	var links []struct {
		Ifname string `json:"ifname"`
	}
	if err := json.Unmarshal(raw, &links); err != nil {
		return err
	}
	var errs []error
	for _, l := range links {
		if err := run("ip", "link", "delete", l.Ifname); err != nil && linkExists(l.Ifname) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func linkExists(name string) bool {
	return exec.Command("ip", "link", "show", "dev", name).Run() == nil
}

func isMountPoint(dir string) (bool, error) {
	raw, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false, err
	}
	r := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`)
	for line := range strings.SplitSeq(string(raw), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && r.Replace(f[4]) == dir {
			return true, nil
		}
	}
	return false, nil
}

// ---------------------------------------------------------------------------
// iptables

// ownedChains are the per-container chains bridge and portmap name after
// the run's networks and containers, plus the firewall admin chains.
func (s *runState) ownedChains() []string {
	chains := slices.Clone(s.adminChains)
	for net, cids := range s.cids {
		for _, cid := range cids {
			chains = append(chains,
				utils.FormatChainName(net, cid),
				utils.MustFormatChainNameWithPrefix(net, cid, "DN-"),
				utils.MustFormatChainNameWithPrefix(net, cid, "SN-"))
		}
	}
	return chains
}

func (s *runState) ownsRule(r iptstate.Rule, owned []string) bool {
	for _, n := range s.networks {
		if strings.Contains(r.Comment(), fmt.Sprintf("name: %q", n)) {
			return true
		}
	}
	if slices.Contains(owned, r.Target()) {
		return true
	}
	if r.Chain == iptstate.FirewallChain {
		for _, p := range r.Addrs() {
			for _, sub := range s.subnets {
				if sub.Overlaps(p) {
					return true
				}
			}
		}
	}
	return false
}

func cleanupIPTables(s *runState) []error {
	owned := s.ownedChains()
	return iptstate.EachTable(func(fam, table string, tb iptstate.Table) []error {
		var errs []error
		// Jumps into chains bridge made for our containers, even when
		// the container ID is not in the state (cannot happen, but a
		// chain is only ever found through its jump).
		for _, r := range tb.Rules {
			if s.ownsRule(r, owned) && strings.HasPrefix(r.Target(), "CNI-") && !slices.Contains(owned, r.Target()) && !slices.Contains(iptstate.SharedChains, r.Target()) {
				owned = append(owned, r.Target())
			}
		}
		for _, r := range tb.Rules {
			if slices.Contains(owned, r.Chain) || !s.ownsRule(r, owned) {
				continue
			}
			if err := iptstate.DeleteRule(fam, table, r); err != nil {
				errs = append(errs, err)
			}
		}
		for _, c := range owned {
			if tb.Chains[c] {
				if err := iptstate.DropChain(fam, table, c); err != nil {
					errs = append(errs, err)
				}
			}
		}
		return errs
	})
}

// restoreSharedChains deletes the shared portmap/firewall chains the run
// created, when nothing per-container is left in them (the e2e suite's
// rule: an idle chain can go, the plugins re-create it on use).
func restoreSharedChains(s *runState, fam string) []error {
	return iptstate.RemoveIdleSharedChains(fam, func(table, chain string) bool {
		return s.chainBefore[fam+"/"+table+"/"+chain]
	}, nil)
}

// leftovers reports anything of the run that still exists.
func leftovers(s *runState) []error {
	var errs []error
	if s.id != "" {
		if out, err := output("ip", "netns", "list"); err == nil && strings.Contains(out, "nbcb-"+s.id) {
			errs = append(errs, fmt.Errorf("netns left: %s", out))
		}
	}
	for _, br := range s.bridges {
		if linkExists(br) {
			errs = append(errs, fmt.Errorf("bridge %s left", br))
		}
	}
	for _, m := range s.mounts {
		if mounted, _ := isMountPoint(m); mounted {
			errs = append(errs, fmt.Errorf("tmpfs %s still mounted", m))
		}
	}
	owned := s.ownedChains()
	errs = append(errs, iptstate.EachTable(func(fam, table string, tb iptstate.Table) []error {
		var errs []error
		for _, r := range tb.Rules {
			if s.ownsRule(r, owned) {
				errs = append(errs, fmt.Errorf("%s -t %s rule left: -A %s %s", fam, table, r.Chain, strings.Join(r.Spec, " ")))
			}
		}
		for _, c := range owned {
			if tb.Chains[c] {
				errs = append(errs, fmt.Errorf("%s -t %s chain left: %s", fam, table, c))
			}
		}
		return errs
	})...)
	return errs
}
