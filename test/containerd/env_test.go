package containerd

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/procwait"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/testhost"
)

const (
	pluginType = "nomad-bridge-cni"
	// cmdTimeout bounds every command and wait, so that a hung daemon or
	// plugin fails the test instead of hanging the run.
	cmdTimeout = 2 * time.Minute
	// criNamespace is the containerd namespace of the CRI plugin's pods
	// and images.
	criNamespace = "k8s.io"
	// shimSocketDir is where containerd 1.6's runc shims listen, whatever
	// the daemon's state directory (runtime/v2/shim: socketRoot).
	shimSocketDir = "/run/containerd/s"
	// netnsDir is where the CRI plugin mounts the pods' namespaces.
	netnsDir = "/var/run/netns"
	// libcniCacheDir is where go-cni (libcni's default) caches results.
	libcniCacheDir = "/var/lib/cni/results"
	// recordDirName is the plugin's attachment records directory inside
	// its dataDir.
	recordDirName = ".nomad-bridge-cni"
	// conflistFile is containerd's conflist, with the one-word edit, in
	// the repository's conflist/.
	conflistFile = "10-containerd-net.conflist"
)

// env is one test's containerd: its directory (root, state, socket, config,
// CNI conf_dir, the plugin's dataDir), its network, and the pods it ran.
// Its cleanup removes all of it.
type env struct {
	bin, id, base string
	bare          bool

	root, state, sock, config, confDir, dataDir, legacyDir string
	runcRoot, crictlConfig, image                          string

	net, bridge      string
	subnet4, subnet6 netip.Prefix
	daemon           *exec.Cmd
	daemonDone       chan struct{}
	daemonLog        string
	mu               sync.Mutex
	pods             []string
	netnsPaths       []string
	pausePIDs        []int
}

// newEnv starts a containerd of the test's own on containerd's conflist,
// with the one-word edit or, bare, as containerd ships it ("type":
// "bridge"), and imports the pause image.
func newEnv(t *testing.T, bare bool) *env {
	t.Helper()
	requireHost(t)
	bin := testhost.BinDir(t)
	testhost.RequireBinaries(t, bin, pluginType, "bridge", "host-local", "portmap", "crictl")
	// A short base: the daemon's socket path must fit a sockaddr_un.
	base, err := os.MkdirTemp("/tmp", "nbcd-")
	if err != nil {
		t.Fatal(err)
	}
	id := fmt.Sprintf("%08x", rand.Uint32())
	e := &env{
		bin: bin, id: id, base: base, bare: bare,
		root:         filepath.Join(base, "root"),
		state:        filepath.Join(base, "state"),
		sock:         filepath.Join(base, "containerd.sock"),
		config:       filepath.Join(base, "config.toml"),
		confDir:      filepath.Join(base, "net.d"),
		dataDir:      filepath.Join(base, "cni-data"),
		legacyDir:    filepath.Join(base, "cni-legacy"),
		runcRoot:     filepath.Join(base, "runc"),
		crictlConfig: filepath.Join(base, "crictl.yaml"),
		daemonLog:    filepath.Join(base, "containerd.log"),
		image:        "localhost/nbcd-pause:" + id,
		net:          "nbcd-" + id,
		bridge:       "nbcd" + id, // 12 bytes, at most 15
		subnet4:      pickSubnet(t, subnets.IPv4),
		subnet6:      pickSubnet(t, subnets.IPv6),
	}
	t.Cleanup(func() { e.cleanup(t) })
	for _, d := range []string{e.root, e.state, e.confDir, e.dataDir, e.legacyDir, e.runcRoot, filepath.Join(base, "logs")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	e.writeConfig(t)
	e.writeConflist(t)
	e.start(t)
	e.importImage(t)
	t.Logf("env %s: containerd in %s, network %s on %s (%s, %s), %s", id, base, e.net, e.bridge, e.subnet4, e.subnet6, map[bool]string{true: "bare bridge", false: "one word"}[bare])
	return e
}

// subnets are this package's: 10.250.0.0-10.255.255.0 (test/e2e uses
// 10.100-10.199, test/podman 10.200-10.249).
var subnets = &testhost.Subnets{Second10: [2]int{250, 256}}

func pickSubnet(t *testing.T, pick func() (netip.Prefix, error)) netip.Prefix {
	t.Helper()
	p, err := pick()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// writeConfig writes the daemon's configuration: everything under the
// env's directory (root, state, sockets, /opt's plugin dir, runc's state),
// no metrics or debug listener, the native snapshotter (no overlay on
// overlay), and the CRI plugin with bin_dir NBC_BIN_DIR, conf_dir the env's,
// the pause image, and the two settings this kind of VM needs (AppArmor
// unavailable to runc, and an oom_score_adj the sandbox may not lower).
func (e *env) writeConfig(t *testing.T) {
	t.Helper()
	cfg := fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.overlayfs"]

[grpc]
  address = %q

[ttrpc]
  address = %q

[debug]
  address = ""

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = %q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  disable_apparmor = true
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false

[plugins."io.containerd.grpc.v1.cri".containerd]
  snapshotter = "native"
  default_runtime_name = "runc"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
  Root = %q

[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = %q
  conf_dir = %q
  max_conf_num = 1
`, e.root, e.state, e.sock, e.sock+".ttrpc", filepath.Join(e.base, "opt"), e.image, e.runcRoot, e.bin, e.confDir)
	crictl := fmt.Sprintf("runtime-endpoint: unix://%s\nimage-endpoint: unix://%s\ntimeout: 60\n", e.sock, e.sock)
	for path, content := range map[string]string{e.config: cfg, e.crictlConfig: crictl} {
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// writeConflist writes the repository's conflist/10-containerd-net.conflist
// (containerd's file with the one-word edit) into conf_dir, made the env's
// own: its network name, bridge, subnets (dual stack, as shipped), the
// plugin's dataDir and host-local's legacy directory in the env's
// directory. Bare, the one word is undone and host-local's leases go to
// the env's directory.
func (e *env) writeConflist(t *testing.T) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(testhost.RepoDir(t), "conflist", conflistFile))
	if err != nil {
		t.Fatal(err)
	}
	var conf map[string]any
	if err := json.Unmarshal(raw, &conf); err != nil {
		t.Fatalf("parse %s: %v", conflistFile, err)
	}
	plugins, _ := conf["plugins"].([]any)
	first, _ := plugins[0].(map[string]any)
	ipam, _ := first["ipam"].(map[string]any)
	ranges, _ := ipam["ranges"].([]any)
	if first["type"] != pluginType || len(ranges) != 2 {
		t.Fatalf("%s: the first plugin is not %s with two ranges:\n%s", conflistFile, pluginType, raw)
	}
	conf["name"] = e.net
	first["bridge"] = e.bridge
	ranges[0] = []any{map[string]any{"subnet": e.subnet4.String()}}
	ranges[1] = []any{map[string]any{"subnet": e.subnet6.String()}}
	if e.bare {
		first["type"] = "bridge"
		ipam["dataDir"] = e.dataDir
	} else {
		first["dataDir"] = e.dataDir
		ipam["dataDir"] = e.legacyDir
	}
	out, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(e.confDir, conflistFile), out, 0o644); err != nil {
		t.Fatal(err)
	}
}

// start starts the daemon and waits until its CRI plugin answers and
// reports the network ready (it loaded the conflist).
func (e *env) start(t *testing.T) {
	t.Helper()
	logf, err := os.OpenFile(e.daemonLog, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command("containerd", "--config", e.config, "--log-level", "info")
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group: the shims it starts are in theirs anyway, and
	// nothing the test does signals the group.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start containerd: %v", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	e.mu.Lock()
	e.daemon, e.daemonDone = cmd, done
	e.mu.Unlock()
	if err := e.waitReady(done); err != nil {
		t.Fatalf("containerd not ready: %v\n%s", err, e.logTail())
	}
}

// waitReady polls `crictl info` until the CRI plugin answers with
// NetworkReady, the daemon exits, or cmdTimeout passes.
func (e *env) waitReady(done <-chan struct{}) error {
	deadline := time.Now().Add(cmdTimeout)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		if _, err := os.Stat(e.sock); err == nil {
			out, err := e.crictl("info")
			last = err
			if err == nil {
				ready, why := networkReady(out)
				if ready {
					return nil
				}
				last = fmt.Errorf("NetworkReady is false: %s", why)
			}
		}
		select {
		case <-done:
			return fmt.Errorf("containerd exited (last: %v)", last)
		case <-tick.C:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %s: %v", cmdTimeout, last)
		}
	}
}

func networkReady(info string) (bool, string) {
	var v struct {
		Status struct {
			Conditions []struct {
				Type    string `json:"type"`
				Status  bool   `json:"status"`
				Message string `json:"message"`
			} `json:"conditions"`
		} `json:"status"`
	}
	if err := json.Unmarshal([]byte(info), &v); err != nil {
		return false, err.Error()
	}
	for _, c := range v.Status.Conditions {
		if c.Type == "NetworkReady" {
			return c.Status, c.Message
		}
	}
	return false, "no NetworkReady condition"
}

// killDaemon SIGKILLs the daemon (its shims survive it) and waits for its
// exit.
func (e *env) killDaemon(t *testing.T) {
	t.Helper()
	if err := e.stopDaemon(); err != nil {
		t.Fatal(err)
	}
}

func (e *env) stopDaemon() error {
	e.mu.Lock()
	cmd, done := e.daemon, e.daemonDone
	e.daemon = nil
	e.mu.Unlock()
	if cmd == nil {
		return nil
	}
	_ = cmd.Process.Kill()
	select {
	case <-done:
		return nil
	case <-time.After(cmdTimeout):
		return fmt.Errorf("containerd (pid %d) still running %s after SIGKILL", cmd.Process.Pid, cmdTimeout)
	}
}

func (e *env) logTail() string {
	raw, _ := os.ReadFile(e.daemonLog)
	if len(raw) > 6000 {
		raw = raw[len(raw)-6000:]
	}
	return "containerd's log (tail):\n" + string(raw)
}

// importImage imports the pause image into the daemon's k8s.io namespace,
// unpacked for the native snapshotter the CRI plugin uses.
func (e *env) importImage(t *testing.T) {
	t.Helper()
	path := filepath.Join(e.base, "pause.tar")
	writePauseImage(t, path, e.image)
	if _, err := e.run("ctr", "--address", e.sock, "--namespace", criNamespace, "images", "import", "--snapshotter", "native", path); err != nil {
		t.Fatalf("import the pause image: %v", err)
	}
	if _, err := e.crictl("inspecti", e.image); err != nil {
		t.Fatalf("the CRI plugin does not see the imported image: %v", err)
	}
}

// crictl runs the env's crictl against the env's daemon and returns its
// stdout.
func (e *env) crictl(args ...string) (string, error) {
	return e.run(filepath.Join(e.bin, "crictl"), append([]string{
		"--config", e.crictlConfig,
		"--runtime-endpoint", "unix://" + e.sock,
		"--image-endpoint", "unix://" + e.sock,
		"--timeout", "60s",
	}, args...)...)
}

func (e *env) mustCrictl(t *testing.T, args ...string) string {
	t.Helper()
	out, err := e.crictl(args...)
	if err != nil {
		t.Fatalf("%v\n%s", err, e.logTail())
	}
	return out
}

// run runs a command bounded by cmdTimeout and returns its stdout; the
// error carries its stderr.
func (e *env) run(name string, args ...string) (string, error) {
	return e.runWithEnv(name, nil, args...)
}

// runWithEnv is run with env added to the process's environment.
func (e *env) runWithEnv(name string, env []string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s %s: %w: %s", filepath.Base(name), strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// killAndWait SIGKILLs pid and waits, on its pidfd, until it has exited.
func killAndWait(pid int) error {
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && err != syscall.ESRCH {
		return err
	}
	running, err := procwait.Exit([]int{pid}, time.Now().Add(cmdTimeout))
	if err == nil && len(running) > 0 {
		err = fmt.Errorf("pid %d still running after SIGKILL", pid)
	}
	return err
}
