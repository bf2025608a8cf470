package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	gocni "github.com/containerd/go-cni"
	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/internal/testhost"
)

// The runtime conflists: each runtime's shipped default with the
// plugin in bridge's place, driven the way that runtime drives it (same
// cniVersion, capabilities, CNI_ARGS, container IDs and namespace paths).
//
// Upstream files reproduced, verbatim, in testdata/upstream/ under our
// conflist's file name:
//   - containerd script/setup/install-cni, 10-containerd-net.conflist
//     (containerd v1.7 / v2.x, cniVersion 1.0.0);
//   - CRI-O contrib/cni/11-crio-ipv4-bridge.conflist (CRI-O >= 1.27,
//     cniVersion 1.0.0; 1.26 and older ship the same file at 0.3.1);
//   - Apptainer etc/network/00_bridge.conflist (Apptainer 1.x, cniVersion
//     1.0.0; Singularity 3.x shipped it at 0.4.0);
//   - k3s pkg/agent/flannel/setup_linux.go cniConf, written to
//     10-flannel.conflist (k3s v1.2x, cniVersion 1.0.0), and what flannel's
//     CNI plugin (flannel-io/cni-plugin v1.x) hands its delegate.

// k3sSubnetEnv is the /run/flannel/subnet.env k3s writes on its first node
// with the default cluster CIDR and the vxlan backend.
const k3sSubnetEnv = `FLANNEL_NETWORK=10.42.0.0/16
FLANNEL_SUBNET=10.42.0.1/24
FLANNEL_MTU=1450
FLANNEL_IPMASQ=true
`

// TestRuntimeConflistsAreOneWordChanges: each runtime conflist in conflist/
// is the runtime's file with "type": "bridge" replaced by
// "type": "nomad-bridge-cni" and nothing else; for k3s, whose file names no
// type (flannel defaults its delegate to bridge), the only change is
// "type": "nomad-bridge-cni" added to flannel's delegate.
func TestRuntimeConflistsAreOneWordChanges(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "upstream", "*"))
	if err != nil || len(files) != 4 {
		t.Fatalf("testdata/upstream: %v, %v; want the four runtimes' files", files, err)
	}
	for _, path := range files {
		file := filepath.Base(path)
		upstream, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		t.Run(file, func(t *testing.T) {
			ours := loadConflist(t, file)
			var want map[string]any
			if err := json.Unmarshal(upstream, &want); err != nil {
				t.Fatalf("upstream %s: %v", file, err)
			}
			changed := 0
			for _, p := range pluginEntries(t, ours) {
				if p["type"] == pluginType {
					p["type"] = "bridge"
					changed++
				}
				if d, ok := p["delegate"].(map[string]any); ok && d["type"] == pluginType {
					delete(d, "type")
					changed++
				}
			}
			if changed != 1 {
				t.Fatalf("%s names %s %d times, want once", file, pluginType, changed)
			}
			if !jsonEqual(t, ours, want) {
				t.Fatalf("%s is not the upstream file with one word changed:\nours (reverted): %s\nupstream: %s", file, mustJSON(t, ours), mustJSON(t, want))
			}
		})
	}
}

// ---------------------------------------------------------------------------
// containerd

// goCNI is containerd's (and nerdctl's) CNI library loaded with one conflist.
func (e *testEnv) goCNI(t *testing.T, opts ...gocni.Opt) gocni.CNI {
	t.Helper()
	c, err := gocni.New(append([]gocni.Opt{gocni.WithPluginDir([]string{e.bin})}, opts...)...)
	if err != nil {
		t.Fatalf("go-cni: %v", err)
	}
	return c
}

// criOpts are the namespace options containerd's CRI plugin passes for a pod
// sandbox (internal/cri/server cniNamespaceOpts): the K8S_* labels with
// IgnoreUnknown as CNI_ARGS, the pod annotations capability and, when the pod
// has host ports, the portMappings capability.
func criOpts(t *testing.T, cid string, hostPort int) []gocni.NamespaceOpts {
	labels := map[string]string{}
	for _, kv := range k8sArgs(t, cid) {
		labels[kv[0]] = kv[1]
	}
	opts := []gocni.NamespaceOpts{
		gocni.WithLabels(labels),
		gocni.WithCapability("io.kubernetes.cri.pod-annotations", map[string]string{"kubernetes.io/config.source": "api"}),
	}
	if hostPort > 0 {
		opts = append(opts, gocni.WithCapabilityPortMap([]gocni.PortMapping{{HostPort: int32(hostPort), ContainerPort: 80, Protocol: "tcp"}}))
	}
	return opts
}

// goCNIResult is the one network's result of a go-cni Setup in the shape
// the other tests use.
func goCNIResult(t *testing.T, res *gocni.Result) cniResult {
	t.Helper()
	if res == nil || len(res.Raw()) != 1 {
		t.Fatalf("go-cni result: want one network's result, got %+v", res)
	}
	if cfg, ok := res.Interfaces["eth0"]; !ok || len(cfg.IPConfigs) == 0 {
		t.Fatalf("go-cni result has no IPs on eth0: %+v", res.Interfaces)
	}
	return parseResult(t, string(mustJSON(t, res.Raw()[0])))
}

// libcniResult converts a libcni result to the shape the other tests use.
func libcniResult(t *testing.T, r types.Result) cniResult {
	t.Helper()
	return parseResult(t, string(mustJSON(t, r)))
}

// assertPortForward connects to hostPort on the host address gw and must
// reach a listener on port 80 inside ns: portmap DNATs to the address the
// plugin returned.
func (e *testEnv) assertPortForward(t *testing.T, ns netns, gw netip.Addr, hostPort int) {
	t.Helper()
	token := fmt.Sprintf("nbc-e2e-%s-%d", e.id, hostPort)
	listener := e.startListener(t, ns, 80, token)
	conn, err := net.DialTimeout("tcp", netip.AddrPortFrom(gw, uint16(hostPort)).String(), 5*time.Second)
	if err != nil {
		t.Fatalf("dial host port %d: %v", hostPort, err)
	}
	if err := conn.SetDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatalf("set deadline: %v", err)
	}
	got, err := io.ReadAll(conn)
	conn.Close()
	if err != nil || string(got) != token {
		t.Fatalf("through host port %d got %q (%v), want %q from the container", hostPort, got, err, token)
	}
	if err := listener.Wait(); err != nil {
		t.Fatalf("listener: %v", err)
	}
}

// cachedResult is libcni's cache file of one attachment in the default
// cache directory (containerd, nerdctl, CRI-O and Apptainer all use it).
func (e *testEnv) cachedResult(cacheDir, cid string) string {
	return filepath.Join(cacheDir, "results", e.netName+"-"+cid+"-"+ifName)
}

func runtimeCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	t.Cleanup(cancel)
	return ctx
}

// containerdSandbox is one pod sandbox set up through go-cni with
// conf/10-containerd-net.conflist, the way containerd's CRI plugin does.
type containerdSandbox struct {
	cid       string
	ns        netns
	netPlugin gocni.CNI
	hostPort  int
	opts      []gocni.NamespaceOpts
	ctx       context.Context
	result    cniResult
}

func (e *testEnv) containerdSandbox(t *testing.T) containerdSandbox {
	t.Helper()
	e.requirePlugin(t)
	path := e.writeConflist(t, e.reclaimConf(t, "10-containerd-net.conflist"))
	sb := containerdSandbox{cid: sandboxID(t), hostPort: randomHostPort(), ctx: runtimeCtx(t)}
	sb.ns = e.podNetns(t, "pod", sb.cid)
	sb.netPlugin = e.goCNI(t, gocni.WithConfListFile(path))
	sb.opts = criOpts(t, sb.cid, sb.hostPort)
	res, err := sb.netPlugin.Setup(sb.ctx, sb.cid, sb.ns.path, sb.opts...)
	if err != nil {
		t.Fatalf("Setup: %v", err)
	}
	sb.result = goCNIResult(t, res)
	return sb
}

// TestContainerdConflist drives conflist/10-containerd-net.conflist
// (containerd script/setup/install-cni, containerd v1.7/v2.x: bridge +
// portmap, cniVersion 1.0.0, dual-stack, promiscMode) through
// github.com/containerd/go-cni as containerd's CRI plugin does: a 64-hex
// sandbox ID, the K8S_* CNI_ARGS with IgnoreUnknown, the pod-annotations and
// portMappings capabilities, libcni's default cache.
func TestContainerdConflist(t *testing.T) {
	t.Run("setup-check-remove", func(t *testing.T) {
		e := newEnv(t)
		sb := e.containerdSandbox(t)
		cid, ns, netPlugin, hostPort, opts, ctx, r := sb.cid, sb.ns, sb.netPlugin, sb.hostPort, sb.opts, sb.ctx, sb.result
		addr4, gw4 := r.addrIn(t, e.subnet4)
		addr6, gw6 := r.addrIn(t, e.subnet6)
		assertLeases(t, e.leaseDir(), map[netip.Addr]string{addr4.Addr(): leaseContent(cid), addr6.Addr(): leaseContent(cid)})
		assertLeases(t, filepath.Join(e.persistDir, e.netName), nil)
		e.assertDefaultDirsUntouched(t)
		e.assertRecord(t, ns, addr4.Addr())
		assertAddrOnIf(t, ns, addr4)
		assertAddrOnIf(t, ns, addr6)
		if flags, _ := linkInfo(t, "", e.bridge); !slices.Contains(flags, "PROMISC") {
			t.Errorf("promiscMode: bridge %s is not promiscuous: %v", e.bridge, flags)
		}
		ping(t, ns, gw4)
		waitAddrSettled(t, gw6)
		ping(t, ns, gw6)
		e.assertNAT(t, cid, natWant{Masq: []netip.Addr{addr4.Addr(), addr6.Addr()}, DNAT: []portMap{{hostPort, addr4.Addr()}, {hostPort, addr6.Addr()}}})
		e.assertPortForward(t, ns, gw4, hostPort)
		if _, err := os.Stat(e.cachedResult(cnitoolCacheDir, cid)); err != nil {
			t.Errorf("libcni cached no result for the sandbox: %v", err)
		}

		if err := netPlugin.Check(ctx, cid, ns.path, opts...); err != nil {
			t.Fatalf("Check: %v", err)
		}

		if err := netPlugin.Remove(ctx, cid, ns.path, opts...); err != nil {
			t.Fatalf("Remove: %v", err)
		}
		assertLeases(t, e.leaseDir(), nil)
		e.assertNAT(t, cid, natWant{})
		e.assertNoRecord(t, cid)
		if linkExistsIn(ns, ifName) {
			t.Errorf("%s still exists in %s after Remove", ifName, ns.name)
		}
		if _, err := os.Stat(e.cachedResult(cnitoolCacheDir, cid)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("libcni cache of the sandbox left after Remove (stat: %v)", err)
		}
		// StopPodSandbox is retried until it succeeds: Remove is idempotent.
		if err := netPlugin.Remove(ctx, cid, ns.path, opts...); err != nil {
			t.Fatalf("second Remove: %v", err)
		}
		e.assertNetworkNATEmpty(t)
	})

	// StopPodSandbox after the sandbox's namespace is gone (reboot, killed
	// shim): containerd finds the netns closed and calls Remove with an
	// empty path. bridge then releases the leases but skips its ipMasq
	// teardown; every rule of the sandbox, IPv4 and IPv6, must still go.
	t.Run("remove-after-netns-lost", func(t *testing.T) {
		e := newEnv(t)
		sb := e.containerdSandbox(t)
		cid, ns, netPlugin, hostPort, opts, ctx, r := sb.cid, sb.ns, sb.netPlugin, sb.hostPort, sb.opts, sb.ctx, sb.result
		addr4, _ := r.addrIn(t, e.subnet4)
		addr6, _ := r.addrIn(t, e.subnet6)
		e.assertNAT(t, cid, natWant{Masq: []netip.Addr{addr4.Addr(), addr6.Addr()}, DNAT: []portMap{{hostPort, addr4.Addr()}, {hostPort, addr6.Addr()}}})

		e.mustKillNetns(t, ns)
		if err := netPlugin.Remove(ctx, cid, "", opts...); err != nil {
			t.Fatalf("Remove with an empty netns path: %v", err)
		}
		assertLeases(t, e.leaseDir(), nil)
		e.assertNAT(t, cid, natWant{})
		e.assertNoRecord(t, cid)
		e.assertNetworkNATEmpty(t)
	})
}

// ---------------------------------------------------------------------------
// CRI-O

// crioRT is the runtime config CRI-O's ocicni builds for a pod sandbox: the
// sandbox ID, its namespace path, eth0 and the K8S_* CNI_ARGS with
// IgnoreUnknown.
func crioRT(t *testing.T, ns netns) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{
		ContainerID:    ns.cid,
		NetNS:          ns.path,
		IfName:         ifName,
		Args:           k8sArgs(t, ns.cid),
		CapabilityArgs: map[string]any{},
	}
}

// TestCRIOConflist drives conflist/11-crio-ipv4-bridge.conflist (CRI-O
// contrib/cni/11-crio-ipv4-bridge.conflist, CRI-O >= 1.27: cniVersion
// 1.0.0, hairpinMode) through libcni as CRI-O's ocicni does, including
// CRI-O's garbage collection at start-up.
func TestCRIOConflist(t *testing.T) {
	t.Run("add-check-del", func(t *testing.T) {
		e := newEnv(t)
		e.requirePlugin(t)
		list := e.loadConfList(t, e.reclaimConf(t, "11-crio-ipv4-bridge.conflist"))
		cfg := e.libcniConfig()
		ctx := runtimeCtx(t)
		ns := e.podNetns(t, "pod", sandboxID(t))
		rt := crioRT(t, ns)

		r, err := cfg.AddNetworkList(ctx, list, rt)
		if err != nil {
			t.Fatalf("ADD: %v", err)
		}
		res := libcniResult(t, r)
		if res.CNIVersion != "1.0.0" {
			t.Errorf("result cniVersion %q, want 1.0.0", res.CNIVersion)
		}
		addr, gw := res.addrIn(t, e.subnet4)
		assertLeases(t, e.leaseDir(), map[netip.Addr]string{addr.Addr(): leaseContent(ns.cid)})
		e.assertDefaultDirsUntouched(t)
		e.assertRecord(t, ns, addr.Addr())
		assertAddrOnIf(t, ns, addr)
		ping(t, ns, gw)
		e.assertNAT(t, ns.cid, natWant{Masq: []netip.Addr{addr.Addr()}})
		e.assertHairpin(t, true)

		if err := cfg.CheckNetworkList(ctx, list, rt); err != nil {
			t.Fatalf("CHECK: %v", err)
		}
		if err := cfg.DelNetworkList(ctx, list, rt); err != nil {
			t.Fatalf("DEL: %v", err)
		}
		assertLeases(t, e.leaseDir(), nil)
		e.assertNAT(t, ns.cid, natWant{})
		e.assertNoRecord(t, ns.cid)
	})

	// CRI-O's start-up garbage collection (ocicni GC -> libcni
	// GCNetworkList with the pods it still knows as the valid list): first a
	// DEL replayed from libcni's cache for every cached attachment not in the
	// list, with the namespace path recorded at ADD, which no longer exists;
	// then, at cniVersion 1.1.0, the GC verb itself. Pod "kept" is valid and
	// must keep everything; "gone1" and "gone2" died while CRI-O was down;
	// at 1.1.0 "uncached" also died and lost its cache entry, so only the GC
	// verb can release it. The control runs bare bridge: its replayed DEL
	// releases the lease but leaves the ipMasq rules, which proves the
	// assertion can fail.
	for _, tc := range []struct {
		name, version string
		bare          bool
	}{
		{name: "startup-gc-1.0.0", version: "1.0.0"},
		{name: "startup-gc-1.1.0", version: "1.1.0"},
		{name: "control-bare-bridge-startup-gc-1.0.0", version: "1.0.0", bare: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			conf := e.reclaimConf(t, "11-crio-ipv4-bridge.conflist")
			conf["cniVersion"] = tc.version
			leaseDir := e.chooseChain(t, conf, tc.bare)
			list := e.loadConfList(t, conf)
			cfg := e.libcniConfig()
			ctx := runtimeCtx(t)

			names := []string{"kept", "gone1", "gone2"}
			if tc.version == "1.1.0" {
				names = append(names, "uncached")
			}
			pods := map[string]netns{}
			addrs := map[string]netip.Addr{}
			for _, name := range names {
				ns := e.podNetns(t, name, sandboxID(t))
				r, err := cfg.AddNetworkList(ctx, list, crioRT(t, ns))
				if err != nil {
					t.Fatalf("ADD %s: %v", name, err)
				}
				a, _ := libcniResult(t, r).addrIn(t, e.subnet4)
				pods[name], addrs[name] = ns, a.Addr()
				e.assertNAT(t, ns.cid, natWant{Masq: []netip.Addr{a.Addr()}})
			}
			for _, name := range names[1:] {
				e.mustKillNetns(t, pods[name])
			}
			if tc.version == "1.1.0" {
				cache := e.cachedResult(e.cacheDir, pods["uncached"].cid)
				if err := os.Remove(cache); err != nil {
					t.Fatalf("drop the cache entry of uncached: %v", err)
				}
			}

			kept := pods["kept"]
			err := cfg.GCNetworkList(ctx, list, &libcni.GCArgs{ValidAttachments: []types.GCAttachment{{ContainerID: kept.cid, IfName: ifName}}})
			if err != nil {
				t.Fatalf("GC with the valid list [kept]: %v", err)
			}
			for _, name := range []string{"gone1", "gone2"} {
				if _, err := os.Stat(e.cachedResult(e.cacheDir, pods[name].cid)); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("libcni did not replay a successful DEL for %s: its cache entry is still there (stat: %v)", name, err)
				}
			}
			if tc.bare {
				assertLeases(t, leaseDir, map[netip.Addr]string{addrs["kept"]: leaseContent(kept.cid)})
				if len(e.readNAT(t, pods["gone1"].cid)["iptables"].masqJumps) == 0 {
					t.Fatalf("control: bare bridge removed the ipMasq rules of a DEL replayed with a dead netns path; the test no longer shows the gap")
				}
				t.Logf("control: bare bridge's replayed DELs left the ipMasq rules of gone1 and gone2, as upstream does")
				return
			}

			assertLeases(t, leaseDir, map[netip.Addr]string{addrs["kept"]: leaseContent(kept.cid)})
			for _, name := range names[1:] {
				e.assertNAT(t, pods[name].cid, natWant{})
				e.assertNoRecord(t, pods[name].cid)
			}
			e.assertRecordsExactly(t, kept.cid)
			e.assertRecord(t, kept, addrs["kept"])
			e.assertNAT(t, kept.cid, natWant{Masq: []netip.Addr{addrs["kept"]}})
			if _, err := os.Stat(e.cachedResult(e.cacheDir, kept.cid)); err != nil {
				t.Errorf("the valid pod lost its cache entry: %v", err)
			}
			if tc.version == "1.1.0" {
				if err := cfg.GetStatusNetworkList(ctx, list); err != nil {
					t.Errorf("STATUS after GC: %v", err)
				}
			}

			// The kept pod still works, and goes cleanly.
			ping(t, kept, e.hostAddr(1))
			rt := crioRT(t, kept)
			if err := cfg.CheckNetworkList(ctx, list, rt); err != nil {
				t.Fatalf("CHECK of the kept pod after GC: %v", err)
			}
			if err := cfg.DelNetworkList(ctx, list, rt); err != nil {
				t.Fatalf("DEL of the kept pod: %v", err)
			}
			assertLeases(t, leaseDir, nil)
			e.assertNetworkNATEmpty(t)
			e.assertRecordsExactly(t)
		})
	}
}

// ---------------------------------------------------------------------------
// Apptainer

// apptainerPortMap is Apptainer's pkg/network PortMapEntry.
type apptainerPortMap struct {
	HostPort      int    `json:"hostPort"`
	ContainerPort int    `json:"containerPort"`
	Protocol      string `json:"protocol"`
	HostIP        string `json:"hostIP,omitempty"`
}

// apptainerRT is the runtime config Apptainer's pkg/network builds: the
// container ID is the container's PID, the namespace /proc/<pid>/ns/net, the
// interface eth0, CNI_ARGS IgnoreUnknown=1 (SetArgs always adds it) and, for
// --network-args "portmap=H:80/tcp", the portMappings capability.
func apptainerRT(cid, nsPath string, hostPort int) *libcni.RuntimeConf {
	rt := &libcni.RuntimeConf{
		ContainerID:    cid,
		NetNS:          nsPath,
		IfName:         ifName,
		Args:           [][2]string{{"IgnoreUnknown", "1"}},
		CapabilityArgs: map[string]any{},
	}
	if hostPort > 0 {
		rt.CapabilityArgs["portMappings"] = []apptainerPortMap{{HostPort: hostPort, ContainerPort: 80, Protocol: "tcp"}}
	}
	return rt
}

// TestApptainerConflist drives conflist/00_bridge.conflist (Apptainer
// etc/network/00_bridge.conflist: legacy host-local "subnet" form, firewall,
// portmap with snat) through libcni as Apptainer's pkg/network does, at
// Apptainer 1.x's cniVersion 1.0.0 and Singularity 3.x's 0.4.0.
func TestApptainerConflist(t *testing.T) {
	for _, v := range []string{"1.0.0", "0.4.0"} {
		t.Run("add-check-del-"+v, func(t *testing.T) {
			e := newEnv(t)
			e.requirePlugin(t)
			conf := e.reclaimConf(t, "00_bridge.conflist")
			conf["cniVersion"] = v
			list := e.loadConfList(t, conf)
			cfg := e.libcniConfig()
			ctx := runtimeCtx(t)
			c := e.startContainer(t, e.addNetns(t, "c1"))
			cid := strconv.Itoa(c.pid)
			c.ns.cid = cid
			e.track(cid)
			hostPort := randomHostPort()
			rt := apptainerRT(cid, c.proc, hostPort)

			r, err := cfg.AddNetworkList(ctx, list, rt)
			if err != nil {
				t.Fatalf("ADD: %v", err)
			}
			res := libcniResult(t, r)
			if res.CNIVersion != v {
				t.Errorf("result cniVersion %q, want %q", res.CNIVersion, v)
			}
			addr, gw := res.addrIn(t, e.subnet4)
			assertLeases(t, e.leaseDir(), map[netip.Addr]string{addr.Addr(): leaseContent(cid)})
			e.assertDefaultDirsUntouched(t)
			e.assertRecord(t, c.ns, addr.Addr())
			assertAddrOnIf(t, c.ns, addr)
			ping(t, c.ns, gw)
			e.assertNAT(t, cid, natWant{Masq: []netip.Addr{addr.Addr()}, DNAT: []portMap{{hostPort, addr.Addr()}}})
			e.assertFirewall(t, addr.Addr())
			e.assertPortForward(t, c.ns, gw, hostPort)

			if err := cfg.CheckNetworkList(ctx, list, rt); err != nil {
				t.Fatalf("CHECK: %v", err)
			}
			if err := cfg.DelNetworkList(ctx, list, rt); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			assertLeases(t, e.leaseDir(), nil)
			e.assertNAT(t, cid, natWant{})
			assertNoFirewall(t, addr.Addr())
			e.assertNoRecord(t, cid)
			c.stop()
		})
	}

	// Apptainer's container ID is the container's PID. A container killed
	// with SIGKILL never runs its DEL; the next container that gets the same
	// PID (PIDs are reused, and start over at every boot) is ADDed under the
	// same ID and the same path /proc/<pid>/ns/net, which now names another
	// namespace. The test gets the kernel to hand out the dead PID again
	// (ns_last_pid); if another fork on the host takes it first, it reuses
	// the ID with the new PID's path, which exercises the "namespace gone"
	// rule instead of "namespace replaced". Bare bridge refuses with
	// "duplicate allocation"; the plugin releases the dead attachment and
	// succeeds.
	for _, bare := range []bool{false, true} {
		name := "crash-pid-reuse"
		if bare {
			name = "control-bare-bridge-crash-pid-reuse"
		}
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			conf := e.reclaimConf(t, "00_bridge.conflist")
			leaseDir := e.chooseChain(t, conf, bare)
			list := e.loadConfList(t, conf)
			cfg := e.libcniConfig()
			ctx := runtimeCtx(t)
			hostPort := randomHostPort()

			c1 := e.startContainer(t, e.addNetns(t, "c1"))
			cid := strconv.Itoa(c1.pid)
			e.track(cid)
			r, err := cfg.AddNetworkList(ctx, list, apptainerRT(cid, c1.proc, hostPort))
			if err != nil {
				t.Fatalf("ADD of the first container: %v", err)
			}
			addr1, _ := libcniResult(t, r).addrIn(t, e.subnet4)
			assertLeases(t, leaseDir, map[netip.Addr]string{addr1.Addr(): leaseContent(cid)})

			e.crash(t, c1)

			c2, reused := e.startContainerAtPID(t, e.addNetns(t, "c2"), c1.pid)
			c2.ns.cid = cid
			if reused {
				t.Logf("the new container got the dead one's PID %d: same ID, same path %s, another namespace", c1.pid, c2.proc)
			} else {
				t.Logf("PID %d was taken by another fork; the new container (PID %d) reuses the ID with its own path", c1.pid, c2.pid)
			}
			rt2 := apptainerRT(cid, c2.proc, hostPort)
			r, err = cfg.AddNetworkList(ctx, list, rt2)
			if bare {
				if err == nil {
					t.Fatalf("control: bare bridge accepted the reused container ID; the test no longer reproduces the bug")
				}
				if !strings.Contains(err.Error(), duplicateAllocation) {
					t.Fatalf("control: ADD failed, but not with %q: %v", duplicateAllocation, err)
				}
				t.Logf("control failed the upstream way: %v", err)
				return
			}
			if err != nil {
				t.Fatalf("ADD under the reused container ID: %v", err)
			}
			addr2, gw2 := libcniResult(t, r).addrIn(t, e.subnet4)
			assertLeases(t, leaseDir, map[netip.Addr]string{addr2.Addr(): leaseContent(cid)})
			e.assertRecord(t, c2.ns, addr2.Addr())
			ping(t, c2.ns, gw2)
			e.assertNAT(t, cid, natWant{Masq: []netip.Addr{addr2.Addr()}, DNAT: []portMap{{hostPort, addr2.Addr()}}})
			e.assertFirewall(t, addr2.Addr())
			if addr1 != addr2 {
				if rules := firewallRules(t, addr1.Addr()); len(rules) != 0 {
					// The firewall plugin's per-address rules belong to the
					// dead attachment; the plugin does not know them.
					t.Logf("known gap: firewall rules of the dead attachment %s remain after the re-ADD:\n%s", addr1.Addr(), rulesString(rules))
				}
			}

			if err := cfg.DelNetworkList(ctx, list, rt2); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			assertLeases(t, leaseDir, nil)
			e.assertNetworkNATEmpty(t)
			e.assertNoRecord(t, cid)
			c2.stop()
		})
	}
}

// ---------------------------------------------------------------------------
// nerdctl

// TestNerdctlDelBeforeAdd reproduces nerdctl's OCI hook (pkg/ocihook
// applyNetworkSettings, nerdctl v2.x) on conflist/10-containerd-net.conflist
// (`nerdctl run --net containerd-net`): go-cni loaded with the conflist's
// bytes, container ID "<namespace>-<id>", the namespace as
// /proc/<pid>/ns/net, CNI_ARGS IgnoreUnknown=1 and
// NERDCTL_CNI_DHCP_HOSTNAME, portMappings; and, since nerdctl#3355, a Remove
// with an empty netns path before every Setup. The scenario is #3355's:
// containerd is bounced, the container's process and namespace die without
// the postStop hook's DEL, and the restarted container goes through
// createRuntime again under the same ID.
func TestNerdctlDelBeforeAdd(t *testing.T) {
	for _, tc := range []struct {
		name      string
		preRemove bool
		bare      bool
	}{
		{name: "nomad-bridge-cni", preRemove: true},
		{name: "without-pre-remove", preRemove: false},
		{name: "control-bare-bridge", preRemove: true, bare: true},
		{name: "control-bare-bridge-without-pre-remove", preRemove: false, bare: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			conf := e.reclaimConf(t, "10-containerd-net.conflist")
			leaseDir := e.chooseChain(t, conf, tc.bare)
			e.writeConflist(t, conf)
			netPlugin := e.goCNI(t, gocni.WithConfListBytes(mustJSON(t, conf)))
			fullID := "default-" + sandboxID(t)
			e.track(fullID)
			hostPort := randomHostPort()
			opts := []gocni.NamespaceOpts{
				gocni.WithCapabilityPortMap([]gocni.PortMapping{{HostPort: int32(hostPort), ContainerPort: 80, Protocol: "tcp"}}),
				gocni.WithLabels(map[string]string{"IgnoreUnknown": "1"}),
				gocni.WithArgs("NERDCTL_CNI_DHCP_HOSTNAME", "web"),
			}
			ctx := runtimeCtx(t)

			// createRuntime of the first start.
			c1 := e.startContainer(t, e.addNetns(t, "c1"))
			c1.ns.cid = fullID
			if tc.preRemove {
				if err := netPlugin.Remove(ctx, fullID, "", opts...); err != nil {
					t.Fatalf("Remove before the first Setup: %v", err)
				}
			}
			res, err := netPlugin.Setup(ctx, fullID, c1.proc, opts...)
			if err != nil {
				t.Fatalf("Setup: %v", err)
			}
			r1 := goCNIResult(t, res)
			a4, _ := r1.addrIn(t, e.subnet4)
			a6, _ := r1.addrIn(t, e.subnet6)
			assertLeases(t, leaseDir, map[netip.Addr]string{a4.Addr(): leaseContent(fullID), a6.Addr(): leaseContent(fullID)})
			e.assertNAT(t, fullID, natWant{Masq: []netip.Addr{a4.Addr(), a6.Addr()}, DNAT: []portMap{{hostPort, a4.Addr()}, {hostPort, a6.Addr()}}})

			// containerd bounced: no postStop, the namespace is gone.
			e.crash(t, c1)

			// createRuntime of the restarted container.
			c2 := e.startContainer(t, e.addNetns(t, "c2"))
			c2.ns.cid = fullID
			if tc.preRemove {
				if err := netPlugin.Remove(ctx, fullID, "", opts...); err != nil {
					t.Fatalf("Remove with an empty netns path: %v", err)
				}
				assertLeases(t, leaseDir, nil)
				if !tc.bare {
					e.assertNAT(t, fullID, natWant{})
					e.assertNoRecord(t, fullID)
				}
			}
			res, err = netPlugin.Setup(ctx, fullID, c2.proc, opts...)
			if tc.bare && !tc.preRemove {
				if err == nil || !strings.Contains(err.Error(), duplicateAllocation) {
					t.Fatalf("control: Setup without the empty DEL: want %q (nerdctl#3355), got %v", duplicateAllocation, err)
				}
				t.Logf("control failed the upstream way: %v", err)
				return
			}
			if err != nil {
				t.Fatalf("Setup of the restarted container: %v", err)
			}
			r2 := goCNIResult(t, res)
			b4, gw4 := r2.addrIn(t, e.subnet4)
			b6, _ := r2.addrIn(t, e.subnet6)
			assertLeases(t, leaseDir, map[netip.Addr]string{b4.Addr(): leaseContent(fullID), b6.Addr(): leaseContent(fullID)})
			if tc.bare {
				if j := e.readNAT(t, fullID)["iptables"].masqJumps; len(j) < 2 {
					t.Fatalf("control: bare bridge left no duplicate ipMasq jump (%d jumps); the test no longer shows the gap:\n%s", len(j), rulesString(j))
				}
				t.Logf("control: bare bridge duplicated the ipMasq jumps of %s, as upstream does", fullID)
				return
			}
			e.assertNAT(t, fullID, natWant{Masq: []netip.Addr{b4.Addr(), b6.Addr()}, DNAT: []portMap{{hostPort, b4.Addr()}, {hostPort, b6.Addr()}}})
			e.assertRecord(t, c2.ns, b4.Addr())
			ping(t, c2.ns, gw4)

			// postStop.
			if err := netPlugin.Remove(ctx, fullID, c2.proc, opts...); err != nil {
				t.Fatalf("Remove: %v", err)
			}
			assertLeases(t, leaseDir, nil)
			e.assertNetworkNATEmpty(t)
			e.assertNoRecord(t, fullID)
			c2.stop()
		})
	}
}

// ---------------------------------------------------------------------------
// k3s / flannel

// k3sDelegate prepares conflist/k3s-flannel.conflist for the test (network
// name, bridge, the plugin's dataDir in the delegate, and the flannel
// entry's own ipam map with dataDir, which flannel passes through to
// host-local as the legacy lease dir) and returns what flannel hands its
// delegate for a subnet.env whose FLANNEL_SUBNET is the test's subnet cut
// to bits. bare makes the delegate "bridge" (k3s's default).
func (e *testEnv) k3sDelegate(t *testing.T, bits int, bare, keepDefaultGW bool) (plugin string, delegate map[string]any, stdin []byte) {
	t.Helper()
	conf := loadConflist(t, "k3s-flannel.conflist")
	conf["name"] = e.netName
	entry := entryOfType(t, conf, "flannel")
	d := entry["delegate"].(map[string]any)
	d["bridge"] = e.bridge
	if bare {
		delete(d, "type")
	} else {
		d["dataDir"] = e.dataDir
	}
	if !keepDefaultGW {
		delete(d, "isDefaultGateway")
	}
	entry["ipam"] = map[string]any{"dataDir": e.persistDir}
	env := fmt.Sprintf("FLANNEL_NETWORK=%s\nFLANNEL_SUBNET=%s/%d\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n",
		netip.PrefixFrom(e.subnet4.Addr(), 16).Masked(), e.subnet4.Addr().Next(), bits)
	fenv, err := parseFlannelSubnetEnv(env)
	if err != nil {
		t.Fatalf("subnet.env: %v", err)
	}
	delegate, err = flannelDelegate(flannelStdin(t, conf), fenv)
	if err != nil {
		t.Fatalf("flannel: %v", err)
	}
	return delegate["type"].(string), delegate, mustJSON(t, delegate)
}

// TestK3sFlannelDelegate runs the plugin as k3s's flannel runs its delegate
// (flannel-io/cni-plugin v1.x; k3s writes its cniConf to 10-flannel.conflist,
// or copies --flannel-cni-conf there): the plugin is exec'd with the JSON
// flannel builds on stdin and the CNI_* variables containerd gave flannel,
// and DEL gets the same bytes back (flannel replays its saved netconf).
// flannel never forwards CHECK or GC to its delegate.
func TestK3sFlannelDelegate(t *testing.T) {
	// The fixture is what flannel builds from conflist/k3s-flannel.conflist
	// and k3s's subnet.env; flannel adds isGateway only for type bridge.
	t.Run("fixture", func(t *testing.T) {
		fenv, err := parseFlannelSubnetEnv(k3sSubnetEnv)
		if err != nil {
			t.Fatalf("subnet.env: %v", err)
		}
		conf := loadConflist(t, "k3s-flannel.conflist")
		got, err := flannelDelegate(flannelStdin(t, conf), fenv)
		if err != nil {
			t.Fatalf("flannel: %v", err)
		}
		raw, err := os.ReadFile(filepath.Join(testhost.RepoDir(t), "conflist", "k3s-flannel-delegate.json"))
		if err != nil {
			t.Fatalf("read fixture: %v", err)
		}
		var want any
		if err := json.Unmarshal(raw, &want); err != nil {
			t.Fatalf("parse fixture: %v", err)
		}
		if !jsonEqual(t, got, want) {
			t.Fatalf("conflist/k3s-flannel-delegate.json is not what flannel hands the delegate:\nflannel: %s\nfixture: %s", mustJSON(t, got), raw)
		}
		if _, ok := got["isGateway"]; ok {
			t.Errorf("flannel added isGateway for type %v; it only does for bridge", got["type"])
		}
		bare := loadConflist(t, "k3s-flannel.conflist")
		delete(entryOfType(t, bare, "flannel")["delegate"].(map[string]any), "type")
		gotBare, err := flannelDelegate(flannelStdin(t, bare), fenv)
		if err != nil {
			t.Fatalf("flannel: %v", err)
		}
		if gotBare["type"] != "bridge" || gotBare["isGateway"] != true {
			t.Errorf("flannel with k3s's default delegate: want type bridge and isGateway true, got %s", mustJSON(t, gotBare))
		}
		// flannel refuses a delegate that carries ipam: ipam keys go in the
		// flannel entry's own "ipam" map.
		withIPAM := loadConflist(t, "k3s-flannel.conflist")
		entryOfType(t, withIPAM, "flannel")["delegate"].(map[string]any)["ipam"] = map[string]any{"dataDir": "/x"}
		if _, err := flannelDelegate(flannelStdin(t, withIPAM), fenv); err == nil {
			t.Errorf("flannel accepted a delegate with an ipam key")
		}
		// runtimeConfig (what libcni injects for capabilities the flannel
		// entry declares) is copied to the delegate as is.
		withRC := loadConflist(t, "k3s-flannel.conflist")
		rc := map[string]any{"ips": []any{"10.42.0.7/24"}}
		entryOfType(t, withRC, "flannel")["runtimeConfig"] = rc
		gotRC, err := flannelDelegate(flannelStdin(t, withRC), fenv)
		if err != nil || !jsonEqual(t, gotRC["runtimeConfig"], rc) {
			t.Errorf("flannel did not copy runtimeConfig: %v %s", err, mustJSON(t, gotRC))
		}
	})

	t.Run("add-del", func(t *testing.T) {
		e := newEnv(t)
		e.requirePlugin(t)
		plugin, delegate, stdin := e.k3sDelegate(t, 24, false, true)
		if plugin != pluginType {
			t.Fatalf("delegate type %q", plugin)
		}
		cid := sandboxID(t)
		ns := e.podNetns(t, "pod", cid)
		args := joinArgs(k8sArgs(t, cid))

		out, _, err := e.execPlugin(plugin, "ADD", cid, ns.path, args, stdin)
		if err != nil {
			t.Fatalf("ADD: %v", err)
		}
		res := parseResult(t, out)
		if res.CNIVersion != "1.0.0" {
			t.Errorf("result cniVersion %q, want the conflist's 1.0.0", res.CNIVersion)
		}
		addr, gw := res.addrIn(t, e.subnet4)
		assertLeases(t, e.leaseDir(), map[netip.Addr]string{addr.Addr(): leaseContent(cid)})
		assertLeases(t, filepath.Join(e.persistDir, e.netName), nil)
		e.assertDefaultDirsUntouched(t)
		e.assertRecord(t, ns, addr.Addr())
		assertAddrOnIf(t, ns, addr)
		ping(t, ns, gw)
		// isDefaultGateway: the bridge carries the gateway (bridge implies
		// isGateway) and the pod's default route goes through it; flannel's
		// route to the cluster network too.
		if !slices.Contains(hostAddrs(t, e.bridge, "-4"), gw) {
			t.Errorf("bridge %s does not carry the gateway %s", e.bridge, gw)
		}
		routes := nsRoutes(t, ns)
		if routes["default"] != gw.String() {
			t.Errorf("pod's default route via %q, want %s (routes: %v)", routes["default"], gw, routes)
		}
		clusterNet := delegate["ipam"].(map[string]any)["routes"].([]types.Route)[0].Dst.String()
		if routes[clusterNet] != gw.String() {
			t.Errorf("pod's route to the cluster network %s via %q, want %s (routes: %v)", clusterNet, routes[clusterNet], gw, routes)
		}
		if _, mtu := linkInfo(t, ns.name, ifName); mtu != 1450 {
			t.Errorf("pod's %s has MTU %d, want FLANNEL_MTU 1450", ifName, mtu)
		}
		e.assertHairpin(t, true)
		// FLANNEL_IPMASQ=true: flannel masquerades, so the delegate gets
		// ipMasq false and bridge writes no rule.
		e.assertNAT(t, cid, natWant{})

		if _, _, err := e.execPlugin(plugin, "DEL", cid, ns.path, args, stdin); err != nil {
			t.Fatalf("DEL: %v", err)
		}
		assertLeases(t, e.leaseDir(), nil)
		e.assertNoRecord(t, cid)
		if linkExistsIn(ns, ifName) {
			t.Errorf("%s still exists in %s after DEL", ifName, ns.name)
		}
		if _, _, err := e.execPlugin(plugin, "DEL", cid, ns.path, args, stdin); err != nil {
			t.Fatalf("second DEL: %v", err)
		}
		e.assertNetworkNATEmpty(t)
	})

	// Why k3s users must keep isDefaultGateway (or set isGateway) when they
	// name the plugin: flannel only adds isGateway itself for type bridge.
	t.Run("without-isDefaultGateway", func(t *testing.T) {
		e := newEnv(t)
		e.requirePlugin(t)
		plugin, delegate, stdin := e.k3sDelegate(t, 24, false, false)
		if _, ok := delegate["isGateway"]; ok {
			t.Fatalf("flannel added isGateway for type %s", plugin)
		}
		cid := sandboxID(t)
		ns := e.podNetns(t, "pod", cid)
		args := joinArgs(k8sArgs(t, cid))
		out, _, err := e.execPlugin(plugin, "ADD", cid, ns.path, args, stdin)
		if err != nil {
			t.Fatalf("ADD: %v", err)
		}
		addr, gw := parseResult(t, out).addrIn(t, e.subnet4)
		assertAddrOnIf(t, ns, addr)
		if slices.Contains(hostAddrs(t, e.bridge, "-4"), gw) {
			t.Errorf("bridge carries the gateway %s without isGateway/isDefaultGateway", gw)
		}
		if r, ok := nsRoutes(t, ns)["default"]; ok {
			t.Errorf("pod has a default route (via %q) without isDefaultGateway", r)
		}
		t.Logf("without isDefaultGateway the pod gets %s but the bridge has no gateway address and the pod no default route", addr)
		if _, _, err := e.execPlugin(plugin, "DEL", cid, ns.path, args, stdin); err != nil {
			t.Fatalf("DEL: %v", err)
		}
		assertLeases(t, e.leaseDir(), nil)
	})

	// The seed scenario on the k3s delegate: the node reboots (the pod's
	// namespace disappears without DEL, the tmpfs comes back empty) and the
	// pod is ADDed again under the same ID ("same-pod"), or a new pod is
	// ADDed on a node subnet with a single free address ("new-pod-full-range":
	// k3s's "no IP addresses available in range set" after an unclean
	// restart). The controls run k3s's default delegate (bridge, leases in
	// the persistent legacy dir) and must fail the upstream way.
	for _, tc := range []struct {
		name   string
		bits   int
		newPod bool
		bare   bool
		want   string
	}{
		{name: "reboot-same-pod", bits: 24},
		{name: "control-bare-bridge-reboot-same-pod", bits: 24, bare: true, want: duplicateAllocation},
		{name: "reboot-new-pod-full-range", bits: 30, newPod: true},
		{name: "control-bare-bridge-reboot-new-pod-full-range", bits: 30, newPod: true, bare: true, want: "no IP addresses available"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			if !tc.bare {
				e.requirePlugin(t)
			}
			plugin, _, stdin := e.k3sDelegate(t, tc.bits, tc.bare, true)
			leaseDir := e.leaseDir()
			if tc.bare {
				leaseDir = filepath.Join(e.persistDir, e.netName)
			}
			cid := sandboxID(t)
			ns := e.podNetns(t, "pod", cid)
			out, _, err := e.execPlugin(plugin, "ADD", cid, ns.path, joinArgs(k8sArgs(t, cid)), stdin)
			if err != nil {
				t.Fatalf("ADD: %v", err)
			}
			// The node's flannel subnet: the test's /24, or a /30 of it
			// (network, gateway, one pod address, broadcast).
			nodeSubnet := netip.PrefixFrom(e.subnet4.Addr(), tc.bits)
			addr1, gw := parseResult(t, out).addrIn(t, nodeSubnet)
			assertLeases(t, leaseDir, map[netip.Addr]string{addr1.Addr(): leaseContent(cid)})
			ping(t, ns, gw)

			// Reboot: no DEL, the namespace is gone, tmpfs is empty again.
			e.destroyNetns(t, ns)
			if !tc.bare {
				e.remountTmpfs(t)
			}
			again := ns
			if tc.newPod {
				cid = sandboxID(t)
				again = e.podNetns(t, "pod2", cid)
			} else {
				e.addNetns(t, "pod")
			}
			out, _, err = e.execPlugin(plugin, "ADD", cid, again.path, joinArgs(k8sArgs(t, cid)), stdin)
			if tc.bare {
				if err == nil {
					t.Fatalf("control: ADD after the reboot succeeded with k3s's default delegate; the test no longer reproduces the bug\nstdout: %s", out)
				}
				if !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("control: ADD after the reboot failed, but not with %q: %v", tc.want, err)
				}
				t.Logf("control failed the upstream way: %s", lineWith(err.Error(), tc.want))
				return
			}
			if err != nil {
				t.Fatalf("ADD after the reboot: %v", err)
			}
			addr2, gw2 := parseResult(t, out).addrIn(t, nodeSubnet)
			assertLeases(t, leaseDir, map[netip.Addr]string{addr2.Addr(): leaseContent(cid)})
			e.assertRecord(t, again, addr2.Addr())
			ping(t, again, gw2)
			if _, _, err := e.execPlugin(plugin, "DEL", cid, again.path, joinArgs(k8sArgs(t, cid)), stdin); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			assertLeases(t, leaseDir, nil)
			e.assertNoRecord(t, cid)
		})
	}
}

// lineWith is the first line of s that contains sub (the plugin's error
// message inside a long error), or s.
func lineWith(s, sub string) string {
	for line := range strings.SplitSeq(s, "\n") {
		if strings.Contains(line, sub) {
			return strings.TrimSpace(line)
		}
	}
	return s
}
