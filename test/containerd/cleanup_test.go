package containerd

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/iptstate"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/testhost"
)

// cleanup removes everything the env created, in whatever state the test
// left it, then checks that nothing is left. It acts only on what is the
// env's by name or path: its daemon, the shims serving its socket and
// their children, the namespaces the CRI plugin reported for its pods,
// its bridge, the rules naming its network, its directory.
func (e *env) cleanup(t *testing.T) {
	t.Helper()
	var errs []error
	e.mu.Lock()
	alive := e.daemon != nil
	e.mu.Unlock()
	if alive {
		// The regular way first: the CRI plugin stops the pods and sends DEL.
		errs = append(errs, e.removePods())
	}
	errs = append(errs, e.stopDaemon())
	errs = append(errs, e.killShims()...)
	errs = append(errs, e.deleteNetnses(), e.unmountAll(), e.deleteBridge())
	errs = append(errs, e.removeRules()...)
	errs = append(errs, e.removeHostFiles())
	if left := e.leftovers(); len(left) > 0 {
		errs = append(errs, left...)
	} else if err := os.RemoveAll(e.base); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		t.Errorf("cleanup of env %s: %v\n%s", e.id, err, e.logTail())
	}
}

// removePods stops and removes every pod of the env's daemon.
func (e *env) removePods() error {
	out, err := e.crictl("pods", "--quiet")
	if err != nil {
		return err
	}
	var errs []error
	for _, id := range strings.Fields(out) {
		e.notePod(id)
		if _, err := e.crictl("stopp", id); err != nil {
			errs = append(errs, err)
		}
		if _, err := e.crictl("rmp", "--force", id); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// shims are the runc shims serving the env's daemon (started with
// -address <its socket>).
func (e *env) shims() []int {
	return testhost.Processes(func(pid int, read func(string) []byte) bool {
		args := strings.Split(string(read("cmdline")), "\x00")
		return len(args) > 0 && filepath.Base(args[0]) == "containerd-shim-runc-v2" && slices.Contains(args, e.sock)
	})
}

// childrenOf lists the processes whose parent is one of pids.
func childrenOf(pids []int) []int {
	return testhost.Processes(func(pid int, read func(string) []byte) bool {
		stat := string(read("stat"))
		// pid (comm) state ppid ...: comm may hold blanks, so after the last ')'.
		i := strings.LastIndexByte(stat, ')')
		if i < 0 {
			return false
		}
		f := strings.Fields(stat[i+1:])
		if len(f) < 2 {
			return false
		}
		ppid, _ := strconv.Atoi(f[1])
		return slices.Contains(pids, ppid)
	})
}

// killShims kills the pods' processes (the shims' children, and the pause
// processes the CRI plugin reported, which a killed shim leaves to init),
// then the shims, waiting for each.
func (e *env) killShims() []error {
	shims := e.shims()
	victims := childrenOf(shims)
	e.mu.Lock()
	for _, pid := range e.pausePIDs {
		if isPause(pid) && !slices.Contains(victims, pid) {
			victims = append(victims, pid)
		}
	}
	e.mu.Unlock()
	var errs []error
	for _, pid := range append(victims, shims...) {
		if err := killAndWait(pid); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// isPause reports whether pid runs the pause program (a pid the CRI plugin
// reported may have been reused since). A zombie does not count: a killed
// pause whose shim was killed too waits for init to reap it.
func isPause(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) state ...
	open, closing := strings.IndexByte(string(stat), '('), strings.LastIndexByte(string(stat), ')')
	if open < 0 || closing < open {
		return false
	}
	f := strings.Fields(string(stat[closing+1:]))
	return string(stat[open+1:closing]) == "pause" && len(f) > 0 && f[0] != "Z" && f[0] != "X"
}

// deleteNetnses unmounts and removes the pods' namespace paths that are
// left.
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

// deleteNetns unmounts and removes a namespace path the CRI plugin made in
// /var/run/netns.
func deleteNetns(path string) error {
	if filepath.Dir(path) != netnsDir && filepath.Dir(path) != "/run/netns" {
		return fmt.Errorf("namespace path %s is not in %s", path, netnsDir)
	}
	return runQuiet("ip", "netns", "delete", filepath.Base(path))
}

func runQuiet(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// unmountAll unmounts what a killed shim or daemon left mounted in the
// env's directory (the pods' rootfs and /dev/shm), stacked mounts included.
func (e *env) unmountAll() error {
	for range 4 {
		mounts, err := testhost.MountsUnder(e.base)
		if err != nil || len(mounts) == 0 {
			return err
		}
		for _, m := range mounts {
			if err := runQuiet("umount", m); err != nil {
				return err
			}
		}
	}
	return nil
}

func linkExists(name string) bool {
	return exec.Command("ip", "link", "show", "dev", name).Run() == nil
}

// deleteBridge deletes the network's bridge and its ports.
func (e *env) deleteBridge() error {
	if !linkExists(e.bridge) {
		return nil
	}
	raw, err := exec.Command("ip", "-j", "link", "show", "master", e.bridge).Output()
	if err != nil {
		return fmt.Errorf("list ports of %s: %w", e.bridge, err)
	}
	var ports []struct {
		Ifname string `json:"ifname"`
	}
	if err := json.Unmarshal(raw, &ports); err != nil {
		return err
	}
	var errs []error
	for _, p := range ports {
		errs = append(errs, runQuiet("ip", "link", "delete", p.Ifname))
	}
	return errors.Join(append(errs, runQuiet("ip", "link", "delete", e.bridge))...)
}

// removeRules deletes the nat rules of the env's network and its pods'
// ipMasq chains.
func (e *env) removeRules() []error {
	var errs []error
	for _, fam := range iptstate.Families {
		tb, err := iptstate.Read(fam, "nat")
		if err != nil {
			errs = append(errs, err)
			continue
		}
		chains := map[string]bool{}
		for _, id := range e.podIDs() {
			if tb.Chains[masqChain(e.net, id)] {
				chains[masqChain(e.net, id)] = true
			}
		}
		for _, r := range tb.Rules {
			if chains[r.Chain] {
				continue // goes with the chain
			}
			if e.ownsRule(r, "") || chains[r.Target()] {
				errs = append(errs, iptstate.DeleteRule(fam, "nat", r))
			}
		}
		for c := range chains {
			errs = append(errs, iptstate.DropChain(fam, "nat", c))
		}
	}
	return slices.DeleteFunc(errs, func(err error) bool { return err == nil })
}

// shimSocket is where containerd 1.6 puts the shim of pod id of the env's
// daemon (runtime/v2/shim SocketAddress: sha256 of the daemon's socket,
// namespace and id, in /run/containerd/s).
func (e *env) shimSocket(id string) string {
	return filepath.Join(shimSocketDir, fmt.Sprintf("%x", sha256.Sum256([]byte(filepath.Join(e.sock, criNamespace, id)))))
}

// removeHostFiles removes what the env's daemon left outside its
// directory: its shims' sockets, go-cni's cached results of its network.
func (e *env) removeHostFiles() error {
	var errs []error
	for _, id := range e.podIDs() {
		errs = append(errs, os.RemoveAll(e.shimSocket(id)))
	}
	for _, c := range e.cachedResults() {
		errs = append(errs, os.RemoveAll(c))
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
		if _, err := os.Lstat(p); err == nil {
			errs = append(errs, fmt.Errorf("namespace %s left", p))
		}
	}
	if linkExists(e.bridge) {
		errs = append(errs, fmt.Errorf("bridge %s left", e.bridge))
	}
	if mounts, _ := testhost.MountsUnder(e.base); len(mounts) > 0 {
		errs = append(errs, fmt.Errorf("mounts left: %v", mounts))
	}
	pids := testhost.Processes(func(pid int, read func(string) []byte) bool {
		return strings.Contains(string(read("cmdline")), e.base+"/")
	})
	if len(pids) > 0 {
		errs = append(errs, fmt.Errorf("processes left: %v", pids))
	}
	for _, id := range e.podIDs() {
		if _, err := os.Lstat(e.shimSocket(id)); err == nil {
			errs = append(errs, fmt.Errorf("shim socket %s left", e.shimSocket(id)))
		}
	}
	for _, fam := range iptstate.Families {
		tb, err := iptstate.Read(fam, "nat")
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, r := range tb.Rules {
			if e.ownsRule(r, "") {
				errs = append(errs, fmt.Errorf("%s nat rule left: %s", fam, r))
			}
		}
	}
	return errs
}
