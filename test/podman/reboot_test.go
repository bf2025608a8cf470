package podman

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/hostcmd"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/procwait"
)

// reboot plays a host reboot for the env's podman, in the order a reboot
// takes things away: every process of every container, without podman's
// cleanup (nothing sends DEL); then what the kernel forgets (mounts,
// namespaces, bridges, NAT rules: only the test's own); then /run, which is
// a tmpfs: podman's runroot and tmpdir (its alive file and locks, so the
// next podman command refreshes its state as after a boot) and the plugin's
// dataDir. The control's leases, in a plain directory, stay, as
// /var/lib/cni/networks does; so does libcni's cache in /var/lib/cni.
func (e *env) reboot(t *testing.T) {
	t.Helper()
	ids, err := e.podmanContainerIDs()
	if err != nil {
		t.Fatalf("reboot: %v", err)
	}
	for _, id := range ids {
		if err := e.killWithoutCleanup(id); err != nil {
			t.Fatalf("reboot: %v", err)
		}
	}
	steps := []struct {
		what string
		do   func() error
	}{
		{"unmount", e.unmountAll},
		{"delete namespaces", e.deleteNetnses},
		{"delete bridges", e.deleteBridges},
		{"flush NAT rules", func() error { return errors.Join(e.removeRules()...) }},
		{"wipe /run", e.wipeRun},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			t.Fatalf("reboot: %s: %v", s.what, err)
		}
	}
	if e.adoption == oneWord {
		e.mountTmpfs(t)
	}
}

// killWithoutCleanup kills container id as a power cut would: conmon first,
// so that it cannot run podman's cleanup when the container exits, then
// the container's processes, through runc.
func (e *env) killWithoutCleanup(id string) error {
	ins, err := e.inspect(id)
	if err != nil {
		return err
	}
	if ins.State.ConmonPid > 0 && isConmonOf(ins.State.ConmonPid, id) {
		if err := killAndWait(ins.State.ConmonPid); err != nil {
			return fmt.Errorf("conmon of %s: %w", id, err)
		}
	}
	if _, err := os.Stat(filepath.Join(runcStateDir, id)); err == nil {
		if err := hostcmd.Run(cmdTimeout, "runc", "delete", "--force", id); err != nil {
			return err
		}
	}
	if ins.State.Pid > 0 {
		if running, err := procwait.Exit([]int{ins.State.Pid}, time.Now().Add(cmdTimeout)); err != nil || len(running) > 0 {
			return fmt.Errorf("container %s (pid %d) still running after runc delete: %v", id, ins.State.Pid, err)
		}
	}
	return nil
}

// runcStateDir is runc's default state root for root, where podman's
// containers live while they run.
const runcStateDir = "/run/runc"

// isConmonOf reports whether pid is the conmon that monitors container id
// (a pid podman reported may have been reused since).
func isConmonOf(pid int, id string) bool {
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if err != nil || strings.TrimSpace(string(comm)) != "conmon" {
		return false
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && strings.Contains(string(cmdline), id)
}

// killAndWait sends SIGKILL to pid and waits, on its pidfd, until it has
// exited.
func killAndWait(pid int) error {
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return err
	}
	running, err := procwait.Exit([]int{pid}, time.Now().Add(cmdTimeout))
	if err == nil && len(running) > 0 {
		err = fmt.Errorf("pid %d still running after SIGKILL", pid)
	}
	return err
}

// wipeRun empties podman's runroot and tmpdir and, installed as `bridge`,
// the plugin's state of the test's networks under /var/run/cni (on a host
// whose /run is a tmpfs, the reboot does that; here /run may be a disk).
func (e *env) wipeRun() error {
	var errs []error
	for _, d := range []string{e.runroot, e.tmpdir} {
		if err := os.RemoveAll(d); err != nil {
			errs = append(errs, err)
		}
		if err := os.MkdirAll(d, 0o755); err != nil {
			errs = append(errs, err)
		}
	}
	if e.adoption == asBridge {
		errs = append(errs, e.removePluginDefaultDirs())
	}
	return errors.Join(errs...)
}

// loseNetns deletes the namespace path of running container c, as a
// crashed runtime or a cleaned-up /run/netns would: the container's
// processes keep the namespace, podman's path to it is gone.
func (e *env) loseNetns(t *testing.T, c *container) string {
	t.Helper()
	path := e.mustInspect(t, c.id).NetworkSettings.SandboxKey
	if err := deleteNetns(path); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("netns %s still present after delete (stat: %v)", path, err)
	}
	return path
}
