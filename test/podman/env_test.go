package podman

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/hostcmd"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/testhost"
)

const (
	// cmdTimeout bounds every podman and host command, so that a hung
	// plugin fails the test instead of hanging the run.
	cmdTimeout = 2 * time.Minute

	// pluginDefaultDataDir is the plugin's default dataDir: installed as
	// `bridge`, the network's conflist has no dataDir key.
	pluginDefaultDataDir = "/var/run/cni"
	// recordDirName is the plugin's attachment records directory inside
	// its dataDir.
	recordDirName = ".nomad-bridge-cni"
	// hostLocalDefaultDir is host-local's own default lease directory.
	hostLocalDefaultDir = "/var/lib/cni/networks"
	// libcniCacheDir is where podman's CNI backend caches results (libcni's
	// default).
	libcniCacheDir = "/var/lib/cni/results"
	// tuningDataDir is where tuning, last in podman's bridge networks,
	// backs up what it changes (<container ID>_<ifname>.json).
	tuningDataDir = "/var/run/cni/tuning"
)

// env is one test's podman: its own configuration, storage, runroot,
// tmpdir and network config dir under a temporary directory, an image, the
// networks it created, and what it saw podman create outside that
// directory (namespaces). Its cleanup removes all of it.
type env struct {
	adoption adoption
	bin      string
	id       string
	base     string

	root, runroot, tmpdir, netConfDir string
	containersConf, storageConf       string
	registriesConf                    string
	pluginDirs                        []string

	tmpfs   string // one word: the plugin's dataDir, a tmpfs mounted here (rootless: a directory in xdg)
	persist string // bare bridge: host-local's ipam.dataDir
	token   string // what every container's httpd serves
	image   string

	// user is the throw-away user a rootless env's podman runs as (nil:
	// root), xdg its XDG_RUNTIME_DIR, a tmpfs it owns.
	user *testUser
	xdg  string

	mu         sync.Mutex
	nets       []*network
	ctrIDs     []string
	netnsPaths []string
}

// newEnv sets up a podman of the test's own for adoption a and registers
// its cleanup.
func newEnv(t *testing.T, a adoption) *env {
	t.Helper()
	requireHost(t)
	return newEnvFor(t, a, fmt.Sprintf("%08x", rand.Uint32()), nil)
}

// newEnvFor sets up the env of id for adoption a, run by root (u nil) or,
// rootless, by user u.
func newEnvFor(t *testing.T, a adoption, id string, u *testUser) *env {
	t.Helper()
	bin := testhost.BinDir(t)
	testhost.RequireBinaries(t, bin, append([]string{pluginType}, referencePlugins...)...)
	if a == asBridge {
		requireAsBridge(t, bin)
	}
	base := shortTempDir(t, u != nil)
	e := &env{
		adoption:       a,
		bin:            bin,
		id:             id,
		base:           base,
		root:           filepath.Join(base, "root"),
		runroot:        filepath.Join(base, "runroot"),
		tmpdir:         filepath.Join(base, "tmpdir"),
		netConfDir:     filepath.Join(base, "net.d"),
		containersConf: filepath.Join(base, "containers.conf"),
		storageConf:    filepath.Join(base, "storage.conf"),
		registriesConf: filepath.Join(base, "registries.conf"),
		tmpfs:          filepath.Join(base, "tmpfs"),
		persist:        filepath.Join(base, "leases"),
		token:          "nomad-bridge-cni podman test " + id,
		image:          "localhost/nbp-busybox:" + id,
		pluginDirs:     []string{bin},
		user:           u,
	}
	dirs := []string{e.root, e.runroot, e.tmpdir, e.netConfDir, e.persist, filepath.Join(base, "imgtmp")}
	if u == nil {
		dirs = append(dirs, e.tmpfs)
	} else {
		// Rootless podman keeps its namespaces, runc's state and its
		// rootless network namespace's files under XDG_RUNTIME_DIR (a
		// tmpfs the user owns: /run/user/<uid> on systemd hosts), and the
		// plugin's dataDir goes there too, made by the plugin.
		e.xdg = filepath.Join(base, "xdg")
		e.tmpfs = filepath.Join(e.xdg, "cni")
		dirs = append(dirs, e.xdg, e.home())
	}
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatalf("mkdir: %v", err)
		}
	}
	switch {
	case u != nil:
		e.pluginDirs = []string{e.installPlugins(t)}
	case a == asBridge:
		e.pluginDirs = []string{e.installAsBridge(t), bin}
	}
	// Registered after shortTempDir's: cleanups run last-in first-out, so
	// everything is unmounted before the directory is removed.
	t.Cleanup(func() { e.cleanup(t) })
	e.writeConfig(t)
	if u != nil {
		u.chownTree(t, base)
	}
	if a == oneWord {
		e.mountTmpfs(t)
	}
	e.importImage(t)
	t.Logf("env %s: %s, podman dirs under %s, cni_plugin_dirs %v", id, a, base, e.pluginDirs)
	return e
}

// maxRunroot is the longest runroot podman accepts ("the specified runroot
// is longer than 50 characters": conmon's socket paths live under it).
const maxRunroot = 50

// shortTempDir makes a temporary directory for the env whose runroot
// (<dir>/runroot) podman accepts: in $TMPDIR if short enough, else in /tmp
// (t.TempDir's names, made from the test's name, are too long); always in
// /tmp for a rootless env, whose user must reach it. It is removed at the
// end of the test, unless something is still mounted in it.
func shortTempDir(t *testing.T, rootless bool) string {
	t.Helper()
	parent := os.TempDir()
	if rootless || len(filepath.Join(parent, "nbp-1234567890", "runroot")) > maxRunroot {
		parent = "/tmp"
	}
	dir, err := os.MkdirTemp(parent, "nbp-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if mounts, err := testhost.MountsUnder(dir); err != nil || len(mounts) > 0 {
			t.Errorf("not removing %s: still mounted: %v %v", dir, mounts, err)
			return
		}
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("remove %s: %v", dir, err)
		}
	})
	return dir
}

// installAsBridge copies the plugin as `bridge` into a directory of its
// own, which podman searches before the reference plugins'.
func (e *env) installAsBridge(t *testing.T) string {
	t.Helper()
	front := filepath.Join(e.base, "front")
	if err := os.MkdirAll(front, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := hostcmd.Run(cmdTimeout, "install", "-m", "0755", filepath.Join(e.bin, pluginType), filepath.Join(front, "bridge")); err != nil {
		t.Fatal(err)
	}
	return front
}

// installPlugins copies the plugin and the reference plugins into a
// directory of the env's, for a rootless env: its user may not reach
// NBC_BIN_DIR (a checkout under /root, say).
func (e *env) installPlugins(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(e.base, "cni-bin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range append([]string{pluginType}, referencePlugins...) {
		if err := hostcmd.Run(cmdTimeout, "install", "-m", "0755", filepath.Join(e.bin, name), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// writeConfig writes the three files podman reads instead of the host's
// (/etc/containers, /usr/share/containers): runc (crun refuses hybrid
// cgroups), cgroupfs, file events and file locks (the default SHM lock
// /dev/shm/libpod_lock is one per host, whatever the tmpdir), ulimits within
// this process's hard limits, and the CNI backend with the test's plugin
// dirs and network config dir.
func (e *env) writeConfig(t *testing.T) {
	t.Helper()
	dirs := make([]string, len(e.pluginDirs))
	for i, d := range e.pluginDirs {
		dirs[i] = fmt.Sprintf("%q", d)
	}
	containers := fmt.Sprintf(`[containers]
default_ulimits = [%q, %q]

[network]
network_backend = "cni"
cni_plugin_dirs = [%s]
network_config_dir = %q

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
lock_type = "file"
tmp_dir = %q
static_dir = %q
volume_path = %q
image_copy_tmp_dir = %q
`, ulimit(unix.RLIMIT_NOFILE, "nofile", 1024), ulimit(unix.RLIMIT_NPROC, "nproc", 4096),
		strings.Join(dirs, ", "), e.netConfDir,
		e.tmpdir, filepath.Join(e.root, "libpod"), filepath.Join(e.root, "volumes"), filepath.Join(e.base, "imgtmp"))
	storage := fmt.Sprintf("[storage]\ndriver = \"vfs\"\nrunroot = %q\ngraphroot = %q\n", e.runroot, e.root)
	files := map[string]string{
		e.containersConf: containers,
		e.storageConf:    storage,
		// Nothing is pulled: the image is imported under localhost/.
		e.registriesConf: "unqualified-search-registries = []\n",
	}
	for path, content := range files {
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// ulimit is "name=n:n" with n at most the hard limit of resource: podman
// asks for more than an unprivileged container may have by default, and
// runc then fails to set it.
func ulimit(resource int, name string, want uint64) string {
	var lim unix.Rlimit
	if err := unix.Getrlimit(resource, &lim); err == nil && lim.Max < want {
		want = lim.Max
	}
	return fmt.Sprintf("%s=%d:%d", name, want, want)
}

// mountTmpfs mounts the plugin's dataDir for the one-word adoption; for a
// rootless env, its user's XDG_RUNTIME_DIR, which holds the dataDir.
func (e *env) mountTmpfs(t *testing.T) {
	t.Helper()
	target, opts := e.tmpfs, "size=16m,mode=0755"
	if e.user != nil {
		target, opts = e.xdg, fmt.Sprintf("size=32m,mode=0700,uid=%d,gid=%d", e.user.uid, e.user.gid)
	}
	if err := hostcmd.Run(cmdTimeout, "mount", "-t", "tmpfs", "-o", opts, "nbp-"+e.id, target); err != nil {
		t.Fatalf("mount tmpfs: %v", err)
	}
}

// home is a rootless env's HOME (podman keeps caches and configuration
// there).
func (e *env) home() string { return filepath.Join(e.base, "home") }

// globalFlags put everything podman keeps under the test's directory; the
// configuration files say the same, and podman passes these on to the
// cleanup process conmon runs when a container exits.
func (e *env) globalFlags() []string {
	return []string{
		"--root", e.root,
		"--runroot", e.runroot,
		"--tmpdir", e.tmpdir,
		"--network-config-dir", e.netConfDir,
		"--network-backend", "cni",
		"--storage-driver", "vfs",
		"--cgroup-manager", "cgroupfs",
		"--runtime", "runc",
		"--events-backend", "file",
	}
}

func (e *env) environ() []string {
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "CONTAINERS_") })
	env = append(env,
		"CONTAINERS_CONF="+e.containersConf,
		"CONTAINERS_STORAGE_CONF="+e.storageConf,
		"CONTAINERS_REGISTRIES_CONF="+e.registriesConf)
	if e.user == nil {
		return env
	}
	// The user's session, as a login would set it; nothing of root's.
	env = slices.DeleteFunc(env, func(kv string) bool {
		name, _, _ := strings.Cut(kv, "=")
		return slices.Contains([]string{"HOME", "USER", "LOGNAME", "DBUS_SESSION_BUS_ADDRESS"}, name) || strings.HasPrefix(name, "XDG_")
	})
	return append(env,
		"HOME="+e.home(),
		"USER="+e.user.name,
		"LOGNAME="+e.user.name,
		"XDG_RUNTIME_DIR="+e.xdg,
		"XDG_CONFIG_HOME="+filepath.Join(e.home(), ".config"),
		"XDG_DATA_HOME="+filepath.Join(e.home(), ".local", "share"),
		"XDG_CACHE_HOME="+filepath.Join(e.home(), ".cache"))
}

// command prepares `podman <global flags> args...`, as the env's user for
// a rootless env.
func (e *env) command(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "podman", append(e.globalFlags(), args...)...)
	cmd.Env = e.environ()
	if e.user != nil {
		cmd.Dir = e.base
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: e.user.credential()}
	}
	return cmd
}

// podman runs podman and returns its stdout; the error carries stderr,
// where podman prints the plugin's error.
func (e *env) podman(args ...string) (string, error) {
	stdout, _, err := e.podmanOutput(args...)
	return stdout, err
}

// podmanOutput runs podman and returns its stdout and stderr (podman's
// warnings and errors: it drops what a plugin that succeeds prints on
// stderr); the error carries stderr.
func (e *env) podmanOutput(args ...string) (string, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := e.command(ctx, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), stderr.String(), fmt.Errorf("podman %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), stderr.String(), nil
}

// podmanLogged runs podman, fails the test on error, and logs what it
// printed.
func (e *env) podmanLogged(t *testing.T, args ...string) string {
	t.Helper()
	stdout, stderr, err := e.podmanOutput(args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("podman %s printed:\n%s%s", strings.Join(args, " "), stdout, stderr)
	return stdout
}

// mustPodman is podman, failing the test on error.
func (e *env) mustPodman(t *testing.T, args ...string) string {
	t.Helper()
	out, err := e.podman(args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// inspection is the part of `podman inspect` the tests look at.
type inspection struct {
	ID    string `json:"Id"`
	State struct {
		Status    string
		Pid       int
		ConmonPid int
	}
	NetworkSettings struct {
		SandboxKey string
		Networks   map[string]struct {
			IPAddress   string
			IPPrefixLen int
			Gateway     string
		}
	}
}

func (e *env) inspect(ref string) (inspection, error) {
	out, err := e.podman("container", "inspect", ref)
	if err != nil {
		return inspection{}, err
	}
	var list []inspection
	if err := json.Unmarshal([]byte(out), &list); err != nil || len(list) != 1 {
		return inspection{}, fmt.Errorf("podman inspect %s: %d entries, %v: %s", ref, len(list), err, out)
	}
	e.noteNetns(list[0].NetworkSettings.SandboxKey)
	return list[0], nil
}

func (e *env) mustInspect(t *testing.T, ref string) inspection {
	t.Helper()
	ins, err := e.inspect(ref)
	if err != nil {
		t.Fatal(err)
	}
	return ins
}

// noteNetns remembers a namespace podman created for a container (under
// the host's /run/netns), for cleanup. A rootless podman's are bind mounts
// in its own mount namespace (its pause process's), gone with it: on the
// host the path is an empty file in the env's directory.
func (e *env) noteNetns(path string) {
	if path == "" || e.user != nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if !slices.Contains(e.netnsPaths, path) {
		e.netnsPaths = append(e.netnsPaths, path)
	}
}

func (e *env) noteContainer(id string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if id != "" && !slices.Contains(e.ctrIDs, id) {
		e.ctrIDs = append(e.ctrIDs, id)
	}
}

func (e *env) containerIDs() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.ctrIDs)
}

func (e *env) networks() []*network {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.nets)
}
