package podman

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/hostcmd"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/iptstate"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/testhost"
)

// cleanup removes everything the env created, in whatever state the test
// left it, then checks that nothing is left. It acts only on what is the
// env's by name or by path: its podman, its directory, its networks'
// names, bridges and subnets, the namespaces podman reported for its
// containers.
func (e *env) cleanup(t *testing.T) {
	t.Helper()
	var errs []error
	if err := e.removeContainers(); err != nil {
		// podman could not stop or remove them, e.g. after a test failed
		// half-way through a reboot: finish the reboot (kill what is
		// left, forget this boot's state) and ask podman again.
		t.Logf("cleanup of env %s: %v; forcing", e.id, err)
		errs = append(errs, e.forceDown()...)
		if err := e.removeContainers(); err != nil {
			errs = append(errs, err)
		}
	}
	errs = append(errs, e.killLeftovers()...)
	errs = append(errs, e.deleteRuncState(), e.deleteNetnses(), e.unmountAll(), e.deleteBridges())
	errs = append(errs, e.removeRules()...)
	errs = append(errs, e.removeHostState())
	errs = append(errs, e.leftovers()...)
	if err := errors.Join(errs...); err != nil {
		t.Errorf("cleanup of env %s: %v", e.id, err)
	}
}

// removeContainers removes every container of the env the regular way:
// podman stops what runs and sends DEL.
func (e *env) removeContainers() error {
	ids, err := e.podmanContainerIDs()
	if err != nil {
		return err
	}
	for _, id := range ids {
		e.noteContainer(id)
		_, _ = e.inspect(id) // notes its namespace
	}
	// A pod's infra container goes only with its pod.
	if _, err := e.podman("pod", "rm", "--all", "--force", "--time", "0"); err != nil {
		return err
	}
	_, err = e.podman("rm", "--all", "--force", "--time", "0")
	return err
}

// forceDown takes down what podman could not: processes, runc's state,
// namespaces, mounts, podman's state of this boot.
func (e *env) forceDown() []error {
	errs := e.killLeftovers()
	return append(errs, e.deleteRuncState(), e.deleteNetnses(), e.unmountAll(), e.wipeRun())
}

// deleteRuncState deletes (killing what still runs) runc's containers of
// the env.
func (e *env) deleteRuncState() error {
	var errs []error
	for _, id := range e.containerIDs() {
		if _, err := os.Stat(filepath.Join(runcStateDir, id)); err == nil {
			errs = append(errs, hostcmd.Run(cmdTimeout, "runc", "delete", "--force", id))
		}
	}
	return errors.Join(errs...)
}

// podmanContainerIDs lists every container of the env's podman.
func (e *env) podmanContainerIDs() ([]string, error) {
	out, err := e.podman("ps", "--all", "--quiet", "--no-trunc")
	if err != nil {
		return nil, err
	}
	return strings.Fields(out), nil
}

// envProcesses are the processes whose command line names the env's
// directory: conmon, and podman's cleanup that conmon starts; for a
// rootless env, also every process of its throw-away user and of the
// user's subordinate IDs (podman's pause process, slirp4netns,
// rootlessport, the containers).
func (e *env) envProcesses() []int {
	return testhost.Processes(func(pid int, read func(string) []byte) bool {
		return strings.Contains(string(read("cmdline")), e.base+"/") || (e.user != nil && e.user.runs(pid))
	})
}

func (e *env) killLeftovers() []error {
	var errs []error
	for _, pid := range e.envProcesses() {
		if err := killAndWait(pid); err != nil {
			errs = append(errs, fmt.Errorf("leftover process %d: %w", pid, err))
		}
	}
	return errs
}

// deleteNetnses deletes the namespaces podman reported for the env's
// containers that still exist.
func (e *env) deleteNetnses() error {
	e.mu.Lock()
	paths := slices.Clone(e.netnsPaths)
	e.mu.Unlock()
	var errs []error
	for _, p := range paths {
		if _, err := os.Stat(p); err == nil {
			errs = append(errs, deleteNetns(p))
		}
	}
	return errors.Join(errs...)
}

// deleteNetns unmounts and removes a namespace path of podman's, which
// rootful podman creates in /run/netns, where `ip netns` works.
func deleteNetns(path string) error {
	dir := filepath.Dir(path)
	if dir != "/run/netns" && dir != "/var/run/netns" {
		return fmt.Errorf("namespace path %s is not in /run/netns", path)
	}
	return hostcmd.Run(cmdTimeout, "ip", "netns", "delete", filepath.Base(path))
}

// unmountAll unmounts everything below the env's directory (containers'
// /dev/shm, the plugin's tmpfs), stacked mounts included.
func (e *env) unmountAll() error {
	for range 4 {
		mounts, err := testhost.MountsUnder(e.base)
		if err != nil || len(mounts) == 0 {
			return err
		}
		for _, m := range mounts {
			if err := hostcmd.Run(cmdTimeout, "umount", m); err != nil {
				return err
			}
		}
	}
	return nil
}

// deleteBridges deletes the networks' bridges and what is enslaved to them
// (the host ends of the containers' veth pairs, which otherwise go with
// their namespace, but asynchronously).
func (e *env) deleteBridges() error {
	var errs []error
	for _, n := range e.networks() {
		if !linkExists(n.bridge) {
			continue
		}
		ports, err := bridgePorts(n.bridge)
		errs = append(errs, err)
		for _, p := range ports {
			errs = append(errs, hostcmd.Run(cmdTimeout, "ip", "link", "delete", p))
		}
		errs = append(errs, hostcmd.Run(cmdTimeout, "ip", "link", "delete", n.bridge))
	}
	return errors.Join(errs...)
}

func bridgePorts(bridge string) ([]string, error) {
	raw, err := exec.Command("ip", "-j", "link", "show", "master", bridge).Output()
	if err != nil {
		return nil, fmt.Errorf("list ports of %s: %w", bridge, err)
	}
	var links []struct {
		Ifname string `json:"ifname"`
	}
	if err := json.Unmarshal(raw, &links); err != nil {
		return nil, fmt.Errorf("parse ports of %s: %w", bridge, err)
	}
	var out []string
	for _, l := range links {
		out = append(out, l.Ifname)
	}
	return out, nil
}

func linkExists(name string) bool {
	return exec.Command("ip", "link", "show", "dev", name).Run() == nil
}

// ---------------------------------------------------------------------------
// iptables

// firewallAdminChain is the firewall plugin's default admin chain, which
// podman's conflists use; like the other shared chains, TestMain removes
// it if the package created it and it is idle.
const firewallAdminChain = "CNI-ADMIN"

// ownedChains are the per-container chains of the env's networks: those
// named after its containers, and those its rules jump to.
func (e *env) ownedChains(tb iptstate.Table) []string {
	var owned []string
	for _, n := range e.networks() {
		for _, id := range e.containerIDs() {
			owned = append(owned, containerChains(n.name, id)...)
		}
	}
	for _, r := range tb.Rules {
		target := r.Target()
		if e.namesNetwork(r) && strings.HasPrefix(target, "CNI-") && !slices.Contains(iptstate.SharedChains, target) && target != firewallAdminChain {
			owned = append(owned, target)
		}
	}
	slices.Sort(owned)
	return slices.Compact(owned)
}

// namesNetwork reports whether the rule's comment is bridge's or portmap's
// for one of the env's networks (`name: "<net>" id: ...`).
func (e *env) namesNetwork(r iptstate.Rule) bool {
	return slices.ContainsFunc(e.networks(), func(n *network) bool {
		return strings.Contains(r.Comment(), fmt.Sprintf("name: %q", n.name))
	})
}

// ownsRule: a rule naming the env's networks, jumping to a chain it owns,
// or the firewall plugin's rule for an address in one of its subnets.
func (e *env) ownsRule(r iptstate.Rule, owned []string) bool {
	if e.namesNetwork(r) || slices.Contains(owned, r.Target()) {
		return true
	}
	if r.Chain != iptstate.FirewallChain {
		return false
	}
	return slices.ContainsFunc(e.networks(), func(n *network) bool {
		return slices.ContainsFunc(r.Addrs(), n.subnet.Overlaps)
	})
}

// removeRules deletes the env's rules, then its chains; shared chains lose
// only the env's rules.
func (e *env) removeRules() []error {
	return iptstate.EachTable(func(fam, table string, tb iptstate.Table) []error {
		var errs []error
		owned := e.ownedChains(tb)
		for _, r := range tb.Rules {
			if !slices.Contains(owned, r.Chain) && e.ownsRule(r, owned) {
				errs = append(errs, iptstate.DeleteRule(fam, table, r))
			}
		}
		for _, c := range owned {
			if tb.Chains[c] {
				errs = append(errs, iptstate.DropChain(fam, table, c))
			}
		}
		return slices.DeleteFunc(errs, func(err error) bool { return err == nil })
	})
}

// ---------------------------------------------------------------------------
// State outside the env's directory

// hostDirs are the paths outside the env's directory that hold state of
// its networks or containers, unique to them by name or ID: the plugin's
// default dataDir (installed as `bridge`), host-local's default (where
// nothing may appear), libcni's cached results (podman's CNI backend keeps
// them), tuning's backups.
func (e *env) hostDirs() []string {
	var dirs []string
	for _, id := range e.containerIDs() {
		backups, _ := filepath.Glob(filepath.Join(tuningDataDir, id+"_*"))
		dirs = append(dirs, backups...)
	}
	for _, n := range e.networks() {
		dirs = append(dirs,
			filepath.Join(pluginDefaultDataDir, n.name),
			filepath.Join(pluginDefaultDataDir, recordDirName, n.name),
			filepath.Join(hostLocalDefaultDir, n.name))
		cached, _ := filepath.Glob(filepath.Join(libcniCacheDir, n.name+"-*"))
		dirs = append(dirs, cached...)
	}
	return dirs
}

func (e *env) removeHostState() error {
	var errs []error
	for _, d := range e.hostDirs() {
		errs = append(errs, os.RemoveAll(d))
	}
	return errors.Join(errs...)
}

// removePluginDefaultDirs removes the plugin's leases and records of the
// env's networks under /var/run/cni.
func (e *env) removePluginDefaultDirs() error {
	var errs []error
	for _, n := range e.networks() {
		errs = append(errs,
			os.RemoveAll(filepath.Join(pluginDefaultDataDir, n.name)),
			os.RemoveAll(filepath.Join(pluginDefaultDataDir, recordDirName, n.name)))
	}
	return errors.Join(errs...)
}

// leftovers lists what cleanup should have removed and did not.
func (e *env) leftovers() []error {
	var errs []error
	e.mu.Lock()
	paths := slices.Clone(e.netnsPaths)
	e.mu.Unlock()
	for _, p := range paths {
		if _, err := os.Stat(p); err == nil {
			errs = append(errs, fmt.Errorf("namespace %s left", p))
		}
	}
	for _, n := range e.networks() {
		if linkExists(n.bridge) {
			errs = append(errs, fmt.Errorf("bridge %s left", n.bridge))
		}
	}
	if mounts, _ := testhost.MountsUnder(e.base); len(mounts) > 0 {
		errs = append(errs, fmt.Errorf("mounts left: %v", mounts))
	}
	for _, id := range e.containerIDs() {
		if _, err := os.Stat(filepath.Join(runcStateDir, id)); err == nil {
			errs = append(errs, fmt.Errorf("runc state of %s left", id))
		}
	}
	if pids := e.envProcesses(); len(pids) > 0 {
		errs = append(errs, fmt.Errorf("processes left: %v", pids))
	}
	for _, d := range e.hostDirs() {
		if _, err := os.Lstat(d); !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("%s left", d))
		}
	}
	errs = append(errs, iptstate.EachTable(func(fam, table string, tb iptstate.Table) []error {
		var errs []error
		owned := e.ownedChains(tb)
		for _, r := range tb.Rules {
			if e.ownsRule(r, owned) {
				errs = append(errs, fmt.Errorf("%s -t %s rule left: %s", fam, table, r))
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
