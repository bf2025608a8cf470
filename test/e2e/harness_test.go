package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha512"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/hostcmd"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/iptstate"
	kitns "github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/netns"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/testhost"
)

const (
	pluginType = "nomad-bridge-cni"
	ifName     = "eth0"

	// hostLocalDefaultDir is where host-local keeps leases when nobody sets
	// ipam.dataDir: the persistent store the plugin exists to move away from.
	hostLocalDefaultDir = "/var/lib/cni/networks"
	// pluginDefaultDataDir is the plugin's default dataDir. Tests always
	// point dataDir at their own tmpfs, so nothing may appear here either.
	pluginDefaultDataDir = "/var/run/cni"
	// cnitoolCacheDir is libcni's default cache, which cnitool always uses.
	cnitoolCacheDir = "/var/lib/cni"

	// cmdTimeout bounds every external command so that a hung plugin fails
	// the test instead of hanging the whole run.
	cmdTimeout = 60 * time.Second
)

// referenceBinaries are the binaries `make plugins` puts in bin/.
var referenceBinaries = []string{"cnitool", "bridge", "host-local", "loopback", "firewall", "portmap"}

// ---------------------------------------------------------------------------
// Prerequisites

// hostPrereqs: not root, tools missing, iptables unusable.
var hostPrereqs = testhost.Prereqs{What: "e2e prerequisites", Check: missingHostPrereqs}

// requireHost skips the test, saying why, when the host cannot run e2e
// tests; with CI set it fails.
func requireHost(t *testing.T) {
	t.Helper()
	hostPrereqs.Require(t)
}

// requireTool skips the test when a tool is missing (fails with CI set),
// like requireHost does for the tools every e2e test needs.
func requireTool(t *testing.T, name string) {
	t.Helper()
	if _, err := exec.LookPath(name); err != nil {
		testhost.SkipOrFail(t, fmt.Sprintf("e2e prerequisite missing: %s in PATH", name))
	}
}

func missingHostPrereqs() []string {
	missing := testhost.MissingTools("ip", "iptables", "ip6tables", "mount", "umount", "ping", "nsenter")
	if len(missing) > 0 {
		return missing
	}
	// Being root with the binaries is not enough inside a container without
	// CAP_NET_ADMIN, or without the nat table: try the real thing.
	for _, ipt := range []string{"iptables", "ip6tables"} {
		if out, err := exec.Command(ipt, "-w", "-t", "nat", "-S", "POSTROUTING").CombinedOutput(); err != nil {
			missing = append(missing, fmt.Sprintf("a working %s nat table (%v: %s)", ipt, err, bytes.TrimSpace(out)))
		}
	}
	return missing
}

// ---------------------------------------------------------------------------
// The per-test environment

// netns is a named network namespace the test created, and the container ID
// cnitool derives for it.
type netns struct {
	name string
	path string
	cid  string
}

// testEnv owns everything one test creates: names, subnets, a tmpfs used as
// the plugin's dataDir, a NETCONFPATH, namespaces. Its cleanup removes all of
// it and then verifies that nothing is left.
type testEnv struct {
	bin        string
	id         string
	netName    string
	bridge     string
	adminChain string
	subnet4    netip.Prefix
	subnet6    netip.Prefix

	dataDir    string // tmpfs mount point, the plugin's dataDir
	stateDir   string // the plugin's leases and records: dataDir, or pluginDefaultDataDir (Nomad's own bridge conflist, no dataDir key)
	persistDir string // plain directory: the bare-bridge control's ipam.dataDir
	confDir    string // NETCONFPATH
	cacheDir   string // libcni cache for the Go harness (cnitool uses /var/lib/cni)
	tmpfsSrc   string // the tmpfs "device" name, unique so leftovers are visible in `mount`

	mu        sync.Mutex
	netnses   []netns
	cids      []string
	listeners []*exec.Cmd
	run       *os.File // the run file (reap_test.go), locked while the test lives
	runErr    error    // the first failed write to it
}

// newEnv sets up a fresh environment and registers its cleanup.
func newEnv(t *testing.T) *testEnv {
	t.Helper()
	requireHost(t)
	bin := testhost.BinDir(t)
	testhost.RequireBinaries(t, bin, referenceBinaries...)

	id := fmt.Sprintf("%08x", rand.Uint32())
	base := t.TempDir()
	e := &testEnv{
		bin:        bin,
		id:         id,
		netName:    "nbc-e2e-" + id,
		bridge:     "nbc" + id, // 11 bytes: Linux allows at most 15
		adminChain: "NBC-ADM-" + id,
		dataDir:    filepath.Join(base, "tmpfs"),
		stateDir:   filepath.Join(base, "tmpfs"),
		persistDir: filepath.Join(base, "persistent"),
		confDir:    filepath.Join(base, "net.d"),
		cacheDir:   filepath.Join(base, "libcni-cache"),
		tmpfsSrc:   "nbc-e2e-" + id,
	}
	for _, d := range []string{e.dataDir, e.persistDir, e.confDir, e.cacheDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatalf("mkdir: %v", err)
		}
	}
	e.subnet4, e.subnet6 = pickSubnets(t)
	t.Logf("env: network %s, bridge %s, subnets %s %s, dataDir %s", e.netName, e.bridge, e.subnet4, e.subnet6, e.dataDir)

	// Registered after t.TempDir, so it runs before the directory is removed
	// (cleanups run last-in first-out) and the tmpfs is unmounted by then.
	t.Cleanup(func() { e.cleanup(t) })

	// Recorded before anything is created, for the reaper of a run killed
	// before its cleanup.
	if err := e.openRunFile(); err != nil {
		t.Fatalf("run file: %v", err)
	}
	e.mountTmpfs(t)
	return e
}

// requirePlugin fails when the plugin under test has not been built.
func (e *testEnv) requirePlugin(t *testing.T) {
	t.Helper()
	testhost.RequireBinaries(t, e.bin, pluginType)
}

// subnets are this package's: IPv4 /24s in 10.100.0.0-10.199.255.0 (the
// podman tests and the benchmarks use 10.200-10.249) and IPv6 /64s in
// fd00::/8, clear of the host's routes (other tests' bridges included) and
// of each other.
var subnets = &testhost.Subnets{Second10: [2]int{100, 200}}

// pickSubnets chooses the test's IPv4 and IPv6 subnets.
func pickSubnets(t *testing.T) (netip.Prefix, netip.Prefix) {
	t.Helper()
	v4, err := subnets.IPv4()
	if err != nil {
		t.Fatalf("pick an IPv4 subnet: %v", err)
	}
	v6, err := subnets.IPv6()
	if err != nil {
		t.Fatalf("pick an IPv6 subnet: %v", err)
	}
	return v4, v6
}

// randomHostPort is a host port for portmap; portmap only writes DNAT rules
// and binds nothing, so a random high port cannot clash with a listener.
func randomHostPort() int { return 20000 + rand.IntN(30000) }

// ---------------------------------------------------------------------------
// tmpfs

func (e *testEnv) mountTmpfs(t *testing.T) {
	t.Helper()
	if err := run("mount", "-t", "tmpfs", "-o", "size=16m,mode=0755", e.tmpfsSrc, e.dataDir); err != nil {
		t.Fatalf("mount tmpfs: %v", err)
	}
}

// remountTmpfs is the tmpfs half of a reboot: everything on it is gone.
func (e *testEnv) remountTmpfs(t *testing.T) {
	t.Helper()
	if err := run("umount", e.dataDir); err != nil {
		t.Fatalf("umount tmpfs: %v", err)
	}
	e.mountTmpfs(t)
	entries, err := os.ReadDir(e.dataDir)
	if err != nil || len(entries) != 0 {
		t.Fatalf("fresh tmpfs at %s is not empty: %v %v", e.dataDir, entries, err)
	}
}

// isMountPoint reports whether dir is a mount point, from mountinfo.
func isMountPoint(dir string) (bool, error) {
	raw, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false, err
	}
	for line := range strings.SplitSeq(string(raw), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && unescapeMountinfo(f[4]) == dir {
			return true, nil
		}
	}
	return false, nil
}

// unescapeMountinfo undoes the kernel's octal escaping of " \t\n\\".
func unescapeMountinfo(s string) string {
	r := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`)
	return r.Replace(s)
}

// ---------------------------------------------------------------------------
// Namespaces

// containerIDFor is the container ID cnitool uses for a namespace path
// (cnitool/cmd/root.go: "cnitool-" + hex of the first 10 bytes of the
// SHA-512 of the absolute path).
func containerIDFor(nsPath string) string {
	s := sha512.Sum512([]byte(nsPath))
	return fmt.Sprintf("cnitool-%x", s[:10])
}

// enter is the command prefix that runs a command in ns: by its name, or,
// for a container's /proc/<pid>/ns/net, in that process's namespace
// whatever the name now points at (Nomad re-creates the path while its
// tasks stay in the old namespace), and for any other path (docker's
// /var/run/docker/netns/<key>), in the namespace mounted there.
func (ns netns) enter() []string {
	if filepath.Dir(ns.path) != kitns.Dir {
		return []string{"nsenter", "--net=" + ns.path}
	}
	return []string{"ip", "netns", "exec", ns.name}
}

// addNetns creates a named network namespace; the same suffix always maps to
// the same path and so to the same container ID.
func (e *testEnv) addNetns(t *testing.T, suffix string) netns {
	t.Helper()
	ns, err := e.newNetns(suffix)
	if err != nil {
		t.Fatal(err)
	}
	return ns
}

// destroyNetns deletes a namespace without any CNI DEL, as a reboot or a
// crashed runtime would. The kernel destroys the container's veth pair with
// the namespace, but asynchronously; deleting the host end first makes the
// outcome settled before the next step runs.
func (e *testEnv) destroyNetns(t *testing.T, ns netns) {
	t.Helper()
	if err := e.deleteBridgePorts(); err != nil {
		t.Fatalf("delete veths: %v", err)
	}
	if err := ns.named().Delete(); err != nil {
		t.Fatal(err)
	}
}

// deleteBridgePorts deletes every link enslaved to the test's bridge (the
// host ends of the containers' veth pairs).
func (e *testEnv) deleteBridgePorts() error {
	if !linkExists(e.bridge) {
		return nil
	}
	raw, err := exec.Command("ip", "-j", "link", "show", "master", e.bridge).Output()
	if err != nil {
		return fmt.Errorf("list ports of %s: %w", e.bridge, err)
	}
	var links []struct {
		Ifname string `json:"ifname"`
	}
	if err := json.Unmarshal(raw, &links); err != nil {
		return fmt.Errorf("parse ports of %s: %w", e.bridge, err)
	}
	var errs []error
	for _, l := range links {
		if err := run("ip", "link", "delete", l.Ifname); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func linkExists(name string) bool {
	return exec.Command("ip", "link", "show", "dev", name).Run() == nil
}

// ---------------------------------------------------------------------------
// Running cnitool, libcni and host commands (the plugin: exec_test.go)

// cnitool runs `cnitool VERB NETWORK NSPATH` with the test's NETCONFPATH and
// bin dir. capArgs, when set, is CAP_ARGS (e.g. portMappings).
func (e *testEnv) cnitool(verb string, ns netns, capArgs string) (stdout, stderr string, err error) {
	if capArgs != "" {
		return e.cnitoolEnv(verb, ns, "CAP_ARGS="+capArgs)
	}
	return e.cnitoolEnv(verb, ns)
}

// cnitoolCmd prepares `cnitool VERB NETWORK NSPATH` with the test's
// NETCONFPATH, bin dir as CNI_PATH and CNI_IFNAME; env comes last, so it
// can override them (a CNI_PATH holding a fake delegate).
func (e *testEnv) cnitoolCmd(ctx context.Context, verb string, ns netns, env ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(e.bin, "cnitool"), verb, e.netName, ns.path)
	cmd.Env = hostcmd.CNIEnv(append([]string{"CNI_PATH=" + e.bin, "NETCONFPATH=" + e.confDir, "CNI_IFNAME=" + ifName}, env...)...)
	return cmd
}

// cnitoolEnv is cnitool with extra environment (see cnitoolCmd).
func (e *testEnv) cnitoolEnv(verb string, ns netns, env ...string) (stdout, stderr string, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	cmd := e.cnitoolCmd(ctx, verb, ns, env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), errb.String(), fmt.Errorf("cnitool %s %s %s: %w: %s", verb, e.netName, ns.path, err, cnitoolError(errb.String()))
	}
	return out.String(), errb.String(), nil
}

// cnitoolError is the error cnitool printed, without the usage text cobra
// appends to it.
func cnitoolError(stderr string) string {
	var msgs []string
	for line := range strings.SplitSeq(stderr, "\n") {
		if msg, ok := strings.CutPrefix(line, "Error: "); ok {
			msgs = append(msgs, msg)
		}
	}
	if len(msgs) == 0 {
		return strings.TrimSpace(stderr)
	}
	return strings.Join(msgs, "; ")
}

// mustCNI runs cnitool and fails the test on error, returning stdout.
func (e *testEnv) mustCNI(t *testing.T, verb string, ns netns, capArgs string) string {
	t.Helper()
	out, _, err := e.cnitool(verb, ns, capArgs)
	if err != nil {
		t.Fatalf("%v\nstdout: %s", err, out)
	}
	return out
}

// libcniConfig is the Go harness: the same binaries, but a per-test cache
// directory, so that libcni never replays cached attachments of other tests
// (or of cnitool) and only the verb under test reaches the plugins.
func (e *testEnv) libcniConfig() *libcni.CNIConfig {
	return libcni.NewCNIConfigWithCacheDir([]string{e.bin}, e.cacheDir, nil)
}

// gcWithValid sends GC for the test's network with the given attachments as
// the valid list, through libcni (cnitool cannot pass a valid list).
func (e *testEnv) gcWithValid(t *testing.T, confPath string, valid ...netns) error {
	t.Helper()
	list, err := libcni.ConfListFromFile(confPath)
	if err != nil {
		t.Fatalf("load conflist: %v", err)
	}
	var cids []string
	for _, ns := range valid {
		cids = append(cids, ns.cid)
	}
	return e.gcList(list, cids)
}

// gcList is gcWithValid's GC of list with the container IDs' eth0 as the
// valid list; a test binary sending GC as a runtime (syskill_test.go) has
// no *testing.T.
func (e *testEnv) gcList(list *libcni.NetworkConfigList, validCIDs []string) error {
	args := &libcni.GCArgs{}
	for _, cid := range validCIDs {
		args.ValidAttachments = append(args.ValidAttachments, types.GCAttachment{ContainerID: cid, IfName: ifName})
	}
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	if err := e.libcniConfig().GCNetworkList(ctx, list, args); err != nil {
		return fmt.Errorf("GC %s: %w", list.Name, err)
	}
	return nil
}

// dropCnitoolCache removes cnitool's cached results for the test's network.
// libcni's GC first DELs every cached attachment that is not in the valid
// list; dropping the cache makes sure that only the plugins' own GC verb can
// release anything, which is what a GC test must observe.
func (e *testEnv) dropCnitoolCache() error {
	matches, err := filepath.Glob(filepath.Join(cnitoolCacheDir, "results", e.netName+"-*"))
	if err != nil {
		return fmt.Errorf("glob cnitool cache: %w", err)
	}
	var errs []error
	for _, m := range matches {
		if err := os.Remove(m); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// run runs a command and returns an error carrying its output.
func run(name string, args ...string) error { return hostcmd.Run(cmdTimeout, name, args...) }

func output(name string, args ...string) (string, error) {
	return hostcmd.Output(cmdTimeout, name, args...)
}

// ---------------------------------------------------------------------------
// Cleanup

// cleanup removes everything the test may have created, then its run
// file. When something is left, the run file stays, and the reaper of a
// later run tries again once this process is gone.
func (e *testEnv) cleanup(t *testing.T) {
	t.Helper()
	if err := e.remove(); err != nil {
		t.Errorf("cleanup of %s: %v", e.netName, err)
		return
	}
	if err := e.dropRunFile(); err != nil {
		t.Errorf("cleanup of %s: %v", e.netName, err)
	}
}

// remove removes everything the test may have created, in dependency
// order, then checks that nothing is left. It never touches what other
// tests or the host own: it only acts on names derived from the test's id.
// The reaper runs it for a test whose process died.
func (e *testEnv) remove() error {
	var errs []error
	e.mu.Lock()
	nses := slices.Clone(e.netnses)
	listeners := slices.Clone(e.listeners)
	e.mu.Unlock()

	// Processes the test started inside its namespaces keep them alive.
	for _, cmd := range listeners {
		if cmd.ProcessState == nil && cmd.Process != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}
	if err := e.deleteBridgePorts(); err != nil {
		errs = append(errs, err)
	}
	if linkExists(e.bridge) {
		if err := run("ip", "link", "delete", e.bridge); err != nil {
			errs = append(errs, err)
		}
	}
	for _, ns := range nses {
		if _, err := os.Stat(ns.path); err == nil {
			if err := ns.named().Delete(); err != nil {
				errs = append(errs, err)
			}
		}
	}
	errs = append(errs, e.cleanupIPTables()...)
	errs = append(errs, e.deleteNFTMasqRules()...)
	if err := e.dropCnitoolCache(); err != nil {
		errs = append(errs, err)
	}
	for _, d := range []string{hostLocalDefaultDir, pluginDefaultDataDir, filepath.Join(pluginDefaultDataDir, recordDirName)} {
		// Unique to this test by name: if the plugin wrote here (a bug the
		// tests report), do not leave it behind.
		if err := os.RemoveAll(filepath.Join(d, e.netName)); err != nil {
			errs = append(errs, err)
		}
	}
	// A tmpfs may be stacked if a remount went wrong half-way: unmount
	// until the directory is a plain directory again.
	for range 4 {
		mounted, err := isMountPoint(e.dataDir)
		if err != nil {
			errs = append(errs, err)
			break
		}
		if !mounted {
			break
		}
		if err := run("umount", e.dataDir); err != nil {
			errs = append(errs, err)
			break
		}
	}
	errs = append(errs, e.leftovers()...)
	return errors.Join(errs...)
}

// leftovers reports anything of this test's that still exists.
func (e *testEnv) leftovers() []error {
	var errs []error
	if out, err := output("ip", "netns", "list"); err != nil {
		errs = append(errs, err)
	} else if strings.Contains(out, e.id) {
		errs = append(errs, fmt.Errorf("netns left: %s", out))
	}
	if linkExists(e.bridge) {
		errs = append(errs, fmt.Errorf("bridge %s left", e.bridge))
	}
	if mounted, _ := isMountPoint(e.dataDir); mounted {
		errs = append(errs, fmt.Errorf("tmpfs %s still mounted", e.dataDir))
	}
	errs = append(errs, iptstate.EachTable(func(fam, table string, tb ipTable) []error {
		var errs []error
		for _, r := range tb.Rules {
			if e.ownsRule(r) {
				errs = append(errs, fmt.Errorf("%s -t %s rule left: %s", fam, table, r))
			}
		}
		for _, c := range e.ownedChains() {
			if tb.Chains[c] {
				errs = append(errs, fmt.Errorf("%s -t %s chain left: %s", fam, table, c))
			}
		}
		return errs
	})...)
	return errs
}

// waitLine reads the first line of r, failing after timeout. It is how the
// tests synchronise with a helper process: the helper prints a line once it
// is ready, so there is nothing to sleep for.
func waitLine(r *bufio.Reader, timeout time.Duration) (string, error) {
	type res struct {
		line string
		err  error
	}
	ch := make(chan res, 1)
	go func() {
		l, err := r.ReadString('\n')
		ch <- res{strings.TrimSpace(l), err}
	}()
	select {
	case got := <-ch:
		return got.line, got.err
	case <-time.After(timeout):
		return "", fmt.Errorf("no line within %v", timeout)
	}
}
