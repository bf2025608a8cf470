package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
)

// Helpers for the runtime tests: container IDs and namespace paths
// the way each runtime makes them, running a plugin with CNI_ARGS, kernel
// state the runtime conflists ask for (promiscuous bridge, hairpin ports,
// MTU, routes), and a line-by-line reproduction of what flannel's CNI
// plugin hands its delegate.

// ---------------------------------------------------------------------------
// Container IDs and namespaces

// sandboxID is a container ID as containerd, CRI-O and nerdctl make them: 64
// hex digits.
func sandboxID(t *testing.T) string {
	t.Helper()
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatalf("random id: %v", err)
	}
	return hex.EncodeToString(b)
}

// podUID is a Kubernetes pod UID (a UUID).
func podUID(t *testing.T) string {
	t.Helper()
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatalf("random uid: %v", err)
	}
	h := hex.EncodeToString(b)
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

// track registers a container ID the test uses, so that cleanup and the
// leftover checks know the per-container chains named after it.
func (e *testEnv) track(cid string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !slices.Contains(e.cids, cid) {
		e.cids = append(e.cids, cid)
	}
}

// podNetns creates a named namespace and gives it the container ID cid
// instead of cnitool's.
func (e *testEnv) podNetns(t *testing.T, suffix, cid string) netns {
	t.Helper()
	ns := e.addNetns(t, suffix)
	ns.cid = cid
	e.track(cid)
	return ns
}

// container is a process running inside a namespace the test created, the
// way nerdctl and Apptainer hand the plugins /proc/<pid>/ns/net rather than a
// bind-mounted path.
type container struct {
	cmd  *exec.Cmd
	pid  int
	ns   netns // ns.path is /proc/<pid>/ns/net, ns.name the named namespace
	proc string
}

// startContainer runs `sleep` inside ns (ip netns exec execs sh, which
// execs sleep, so the pid stays the one started) and waits for the line sh
// prints once it runs there, then checks that /proc/<pid>/ns/net is that
// namespace. Cleanup kills it if the test has not.
func (e *testEnv) startContainer(t *testing.T, ns netns) *container {
	t.Helper()
	cmd := exec.Command("ip", "netns", "exec", ns.name, "sh", "-c", "echo ready; exec sleep 600")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start container process in %s: %v", ns.name, err)
	}
	e.mu.Lock()
	e.listeners = append(e.listeners, cmd)
	e.mu.Unlock()
	c := &container{cmd: cmd, pid: cmd.Process.Pid}
	c.proc = fmt.Sprintf("/proc/%d/ns/net", c.pid)
	c.ns = netns{name: ns.name, path: c.proc, cid: ns.cid}
	if line, err := waitLine(bufio.NewReader(stdout), 10*time.Second); err != nil || line != "ready" {
		t.Fatalf("container process in %s: got %q, %v; want its ready line", ns.name, line, err)
	}
	var want, got syscall.Stat_t
	if err := syscall.Stat(ns.path, &want); err != nil {
		t.Fatalf("stat %s: %v", ns.path, err)
	}
	if err := syscall.Stat(c.proc, &got); err != nil || got.Ino != want.Ino || got.Dev != want.Dev {
		t.Fatalf("%s is not %s (%v)", c.proc, ns.path, err)
	}
	return c
}

// startContainerAtPID starts the container process with the given PID when
// it can, the way the kernel hands a new Apptainer container the PID of a
// dead one (PIDs are reused, and start over at every boot): it sets
// ns_last_pid to pid-1 right before the fork. Any other fork on the host may
// take the PID first, so it retries; it reports whether it got the PID.
func (e *testEnv) startContainerAtPID(t *testing.T, ns netns, pid int) (*container, bool) {
	t.Helper()
	const lastPID = "/proc/sys/kernel/ns_last_pid"
	for range 50 {
		if err := os.WriteFile(lastPID, []byte(strconv.Itoa(pid-1)), 0o644); err != nil {
			t.Logf("cannot steer the next PID (%v)", err)
			break
		}
		c := e.startContainer(t, ns)
		if c.pid == pid {
			return c, true
		}
		c.stop()
	}
	return e.startContainer(t, ns), false
}

// crash kills the container's process and deletes its namespace without
// any CNI DEL: what a SIGKILLed runtime, a bounced containerd or a reboot
// leaves. Afterwards /proc/<pid>/ns/net no longer exists.
func (e *testEnv) crash(t *testing.T, c *container) {
	t.Helper()
	if c.cmd.ProcessState == nil {
		_ = c.cmd.Process.Kill()
		_ = c.cmd.Wait()
	}
	named := netns{name: c.ns.name, path: filepath.Join(netnsDir, c.ns.name), cid: c.ns.cid}
	e.mustKillNetns(t, named)
	if _, err := os.Stat(c.proc); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("%s still exists after the container died (stat: %v)", c.proc, err)
	}
}

// stop ends the container's process (its namespace stays: it is named).
func (c *container) stop() {
	if c.cmd.ProcessState == nil {
		_ = c.cmd.Process.Kill()
		_ = c.cmd.Wait()
	}
}

// ---------------------------------------------------------------------------
// Running a plugin the way a delegating plugin does

// execPlugin runs a plugin binary with stdin and the CNI_* variables a
// runtime sets, including CNI_ARGS.
func (e *testEnv) execPlugin(plugin, command, cid, nsPath, cniArgs string, stdin []byte) (string, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	cmd := e.pluginCmd(ctx, plugin, command, cid, nsPath, stdin)
	if cniArgs != "" {
		cmd.Env = append(cmd.Env, "CNI_ARGS="+cniArgs)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), errb.String(), fmt.Errorf("%s %s %s: %w\nstdout: %s\nstderr: %s", plugin, command, cid, err, out.String(), errb.String())
	}
	return out.String(), errb.String(), nil
}

// k8sArgs are the CNI_ARGS containerd's CRI plugin (and CRI-O's ocicni)
// pass for a pod sandbox.
func k8sArgs(t *testing.T, cid string) [][2]string {
	return [][2]string{
		{"IgnoreUnknown", "1"},
		{"K8S_POD_NAMESPACE", "default"},
		{"K8S_POD_NAME", "web-" + cid[:8]},
		{"K8S_POD_INFRA_CONTAINER_ID", cid},
		{"K8S_POD_UID", podUID(t)},
	}
}

func joinArgs(args [][2]string) string {
	var parts []string
	for _, kv := range args {
		parts = append(parts, kv[0]+"="+kv[1])
	}
	return strings.Join(parts, ";")
}

// ---------------------------------------------------------------------------
// Kernel state

// bridgePorts lists the links enslaved to the test's bridge.
func (e *testEnv) bridgePorts(t *testing.T) []string {
	t.Helper()
	out, err := output("ip", "-j", "link", "show", "master", e.bridge)
	if err != nil {
		t.Fatalf("%v", err)
	}
	var links []struct {
		Ifname string `json:"ifname"`
	}
	if err := json.Unmarshal([]byte(out), &links); err != nil {
		t.Fatalf("parse ports of %s: %v", e.bridge, err)
	}
	var names []string
	for _, l := range links {
		names = append(names, l.Ifname)
	}
	return names
}

// assertHairpin checks that every port of the bridge has hairpin mode on
// (bridge's hairpinMode), as the kernel reports it.
func (e *testEnv) assertHairpin(t *testing.T, want bool) {
	t.Helper()
	ports := e.bridgePorts(t)
	if len(ports) == 0 {
		t.Fatalf("bridge %s has no ports", e.bridge)
	}
	for _, p := range ports {
		raw, err := os.ReadFile(filepath.Join("/sys/class/net", p, "brport", "hairpin_mode"))
		if err != nil {
			t.Fatalf("hairpin mode of %s: %v", p, err)
		}
		if got := strings.TrimSpace(string(raw)) == "1"; got != want {
			t.Errorf("port %s of %s: hairpin_mode %q, want on=%v", p, e.bridge, strings.TrimSpace(string(raw)), want)
		}
	}
}

// linkFlags returns the flags and MTU of a link (in ns when nsName is set).
func linkInfo(t *testing.T, nsName, link string) (flags []string, mtu int) {
	t.Helper()
	args := []string{"-j"}
	if nsName != "" {
		args = append(args, "-n", nsName)
	}
	out, err := output("ip", append(args, "link", "show", "dev", link)...)
	if err != nil {
		t.Fatalf("%v", err)
	}
	var links []struct {
		Flags []string `json:"flags"`
		MTU   int      `json:"mtu"`
	}
	if err := json.Unmarshal([]byte(out), &links); err != nil || len(links) != 1 {
		t.Fatalf("parse ip link: %v: %s", err, out)
	}
	return links[0].Flags, links[0].MTU
}

// hostAddrs returns the addresses of a host link in the given family.
func hostAddrs(t *testing.T, link, fam string) []netip.Addr {
	t.Helper()
	out, err := output("ip", "-j", fam, "addr", "show", "dev", link)
	if err != nil {
		t.Fatalf("%v", err)
	}
	var links []struct {
		AddrInfo []struct {
			Local string `json:"local"`
		} `json:"addr_info"`
	}
	if err := json.Unmarshal([]byte(out), &links); err != nil {
		t.Fatalf("parse ip addr: %v", err)
	}
	var addrs []netip.Addr
	for _, l := range links {
		for _, a := range l.AddrInfo {
			if p, err := netip.ParseAddr(a.Local); err == nil {
				addrs = append(addrs, p)
			}
		}
	}
	return addrs
}

// nsRoutes returns the IPv4 routes inside a namespace as dst -> gateway
// ("" for on-link routes).
func nsRoutes(t *testing.T, ns netns) map[string]string {
	t.Helper()
	out, err := output("ip", "-j", "-4", "-n", ns.name, "route", "show")
	if err != nil {
		t.Fatalf("%v", err)
	}
	var routes []struct {
		Dst     string `json:"dst"`
		Gateway string `json:"gateway"`
	}
	if err := json.Unmarshal([]byte(out), &routes); err != nil {
		t.Fatalf("parse ip route: %v", err)
	}
	m := map[string]string{}
	for _, r := range routes {
		m[r.Dst] = r.Gateway
	}
	return m
}

// ---------------------------------------------------------------------------
// flannel

// flannelSubnetEnv is /run/flannel/subnet.env as flannel's CNI plugin reads
// it (flannel-io/cni-plugin flannel.go loadFlannelSubnetEnv).
type flannelSubnetEnv struct {
	nws, ip6Nws []*net.IPNet
	sn, ip6Sn   *net.IPNet
	mtu         *uint
	ipmasq      *bool
}

func parseFlannelSubnetEnv(text string) (*flannelSubnetEnv, error) {
	se := &flannelSubnetEnv{}
	s := bufio.NewScanner(strings.NewReader(text))
	for s.Scan() {
		parts := strings.SplitN(s.Text(), "=", 2)
		if len(parts) != 2 {
			continue
		}
		switch parts[0] {
		case "FLANNEL_NETWORK", "FLANNEL_IPV6_NETWORK":
			for _, cidr := range strings.Split(parts[1], ",") {
				_, nw, err := net.ParseCIDR(cidr)
				if err != nil {
					return nil, err
				}
				if parts[0] == "FLANNEL_NETWORK" {
					se.nws = append(se.nws, nw)
				} else {
					se.ip6Nws = append(se.ip6Nws, nw)
				}
			}
		case "FLANNEL_SUBNET":
			// "10.42.0.1/24" (the first address): ParseCIDR masks it.
			_, sn, err := net.ParseCIDR(parts[1])
			if err != nil {
				return nil, err
			}
			se.sn = sn
		case "FLANNEL_IPV6_SUBNET":
			_, sn, err := net.ParseCIDR(parts[1])
			if err != nil {
				return nil, err
			}
			se.ip6Sn = sn
		case "FLANNEL_MTU":
			mtu, err := strconv.ParseUint(parts[1], 10, 32)
			if err != nil {
				return nil, err
			}
			m := uint(mtu)
			se.mtu = &m
		case "FLANNEL_IPMASQ":
			b := parts[1] == "true"
			se.ipmasq = &b
		}
	}
	if err := s.Err(); err != nil {
		return nil, err
	}
	if (se.nws == nil && se.ip6Nws == nil) || (se.sn == nil && se.ip6Sn == nil) || se.mtu == nil || se.ipmasq == nil {
		return nil, fmt.Errorf("subnet.env is missing a variable: %q", text)
	}
	return se, nil
}

// flannelDelegate reproduces what flannel's CNI plugin (flannel-io/cni-plugin
// v1.x, flannel.go cmdAdd and flannel_linux.go doCmdAdd/getDelegateIPAM)
// hands its delegate, given its own stdin (the flannel entry of the
// conflist, as libcni passes it) and subnet.env:
//
//   - the delegate map of the entry, which may not hold "name" or "ipam";
//   - "runtimeConfig" copied from the entry when present;
//   - "name" = the network name, "type" defaulted to "bridge";
//   - "ipMasq" defaulted to !FLANNEL_IPMASQ, "mtu" to FLANNEL_MTU;
//   - "isGateway": true added only when the type is "bridge";
//   - "cniVersion" copied from the entry;
//   - "ipam": the entry's own ipam map (every key kept, "type" defaulted to
//     host-local) with "ranges" replaced by the subnet(s) of subnet.env and
//     "routes" = the map's routes plus one per FLANNEL_(IPV6_)NETWORK.
//
// On DEL flannel replays exactly these bytes (saved in its dataDir).
func flannelDelegate(stdin []byte, fenv *flannelSubnetEnv) (map[string]any, error) {
	var n struct {
		types.NetConf
		IPAM          map[string]any `json:"ipam,omitempty"`
		Delegate      map[string]any `json:"delegate"`
		RuntimeConfig map[string]any `json:"runtimeConfig,omitempty"`
	}
	if err := json.Unmarshal(stdin, &n); err != nil {
		return nil, fmt.Errorf("failed to load netconf: %w", err)
	}
	if n.Delegate == nil {
		n.Delegate = map[string]any{}
	} else {
		if typ, ok := n.Delegate["type"]; ok {
			if _, isString := typ.(string); !isString {
				return nil, errors.New("'delegate' dictionary, if present, must have (string) 'type' field")
			}
		}
		if _, ok := n.Delegate["name"]; ok {
			return nil, errors.New("'delegate' dictionary must not have 'name' field, it'll be set by flannel")
		}
		if _, ok := n.Delegate["ipam"]; ok {
			return nil, errors.New("'delegate' dictionary must not have 'ipam' field, it'll be set by flannel")
		}
	}
	if n.RuntimeConfig != nil {
		n.Delegate["runtimeConfig"] = n.RuntimeConfig
	}

	d := n.Delegate
	d["name"] = n.Name
	if _, ok := d["type"]; !ok {
		d["type"] = "bridge"
	}
	if _, ok := d["ipMasq"]; !ok {
		d["ipMasq"] = !*fenv.ipmasq
	}
	if _, ok := d["mtu"]; !ok {
		d["mtu"] = *fenv.mtu
	}
	if d["type"].(string) == "bridge" {
		if _, ok := d["isGateway"]; !ok {
			d["isGateway"] = true
		}
	}
	if n.CNIVersion != "" {
		d["cniVersion"] = n.CNIVersion
	}

	ipam := n.IPAM
	if ipam == nil {
		ipam = map[string]any{}
	}
	if _, ok := ipam["type"]; !ok {
		ipam["type"] = "host-local"
	}
	var ranges [][]map[string]any
	if fenv.sn != nil && fenv.sn.String() != "" {
		ranges = append(ranges, []map[string]any{{"subnet": fenv.sn.String()}})
	}
	if fenv.ip6Sn != nil && fenv.ip6Sn.String() != "" {
		ranges = append(ranges, []map[string]any{{"subnet": fenv.ip6Sn.String()}})
	}
	ipam["ranges"] = ranges
	routes := []types.Route{}
	if r, ok := ipam["routes"]; ok {
		buf, _ := json.Marshal(r)
		if err := json.Unmarshal(buf, &routes); err != nil {
			return nil, fmt.Errorf("failed to read IPAM routes: failed to parse ipam.routes: %w", err)
		}
	}
	for _, nw := range append(slices.Clone(fenv.nws), fenv.ip6Nws...) {
		if nw != nil {
			routes = append(routes, types.Route{Dst: *nw})
		}
	}
	ipam["routes"] = routes
	d["ipam"] = ipam
	return d, nil
}

// flannelStdin is what libcni hands the first plugin of a conflist: the
// entry with the list's name and cniVersion injected.
func flannelStdin(t *testing.T, conf map[string]any) []byte {
	t.Helper()
	return entryConfig(t, conf, "flannel")
}

// canonicalJSON decodes any JSON-marshallable value back into plain maps,
// slices, strings, float64s and bools, so that two documents compare with
// reflect.DeepEqual whatever their key order or Go types were.
func canonicalJSON(t *testing.T, v any) any {
	t.Helper()
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("marshal: %v", err)
	}
	var out any
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("unmarshal: %v", err)
	}
	return out
}

func jsonEqual(t *testing.T, a, b any) bool {
	t.Helper()
	return reflect.DeepEqual(canonicalJSON(t, a), canonicalJSON(t, b))
}
