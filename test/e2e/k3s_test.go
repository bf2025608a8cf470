package e2e

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/cniexec"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/testhost"
)

// k3sSubnetEnv is the /run/flannel/subnet.env k3s writes on its first node
// with the default cluster CIDR and the vxlan backend.
const k3sSubnetEnv = `FLANNEL_NETWORK=10.42.0.0/16
FLANNEL_SUBNET=10.42.0.1/24
FLANNEL_MTU=1450
FLANNEL_IPMASQ=true
`

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

// execAsFlannel runs plugin for the pod in ns as flannel runs its delegate:
// the CNI_ARGS containerd gave flannel, stdin the JSON flannel built.
func (e *testEnv) execAsFlannel(t *testing.T, plugin, verb string, ns netns, stdin []byte) (string, error) {
	t.Helper()
	args := e.cniArgs(verb, ns)
	args.PluginArgs = k8sArgs(t, ns.cid)
	r := cniexec.Run(t, e.binary(plugin), args, cniexec.Opts{Stdin: stdin})
	return r.Stdout, r.Err
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
		ns := e.podNetns(t, "pod", sandboxID(t))
		cid := ns.cid
		out, err := e.execAsFlannel(t, plugin, "ADD", ns, stdin)
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

		if _, err := e.execAsFlannel(t, plugin, "DEL", ns, stdin); err != nil {
			t.Fatalf("DEL: %v", err)
		}
		e.assertNetworkEmpty(t, e.leaseDir())
		if linkExistsIn(ns, ifName) {
			t.Errorf("%s still exists in %s after DEL", ifName, ns.name)
		}
		if _, err := e.execAsFlannel(t, plugin, "DEL", ns, stdin); err != nil {
			t.Fatalf("second DEL: %v", err)
		}
		e.assertNetworkEmpty(t, e.leaseDir())
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
		ns := e.podNetns(t, "pod", sandboxID(t))
		out, err := e.execAsFlannel(t, plugin, "ADD", ns, stdin)
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
		if _, err := e.execAsFlannel(t, plugin, "DEL", ns, stdin); err != nil {
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
			ns := e.podNetns(t, "pod", sandboxID(t))
			out, err := e.execAsFlannel(t, plugin, "ADD", ns, stdin)
			if err != nil {
				t.Fatalf("ADD: %v", err)
			}
			// The node's flannel subnet: the test's /24, or a /30 of it
			// (network, gateway, one pod address, broadcast).
			nodeSubnet := netip.PrefixFrom(e.subnet4.Addr(), tc.bits)
			addr1, gw := parseResult(t, out).addrIn(t, nodeSubnet)
			assertLeases(t, leaseDir, map[netip.Addr]string{addr1.Addr(): leaseContent(ns.cid)})
			ping(t, ns, gw)

			// Reboot: no DEL, the namespace is gone, tmpfs is empty again.
			e.destroyNetns(t, ns)
			if !tc.bare {
				e.remountTmpfs(t)
			}
			again := ns
			if tc.newPod {
				again = e.podNetns(t, "pod2", sandboxID(t))
			} else {
				e.addNetns(t, "pod")
			}
			out, err = e.execAsFlannel(t, plugin, "ADD", again, stdin)
			if tc.bare {
				assertControlFails(t, out, err, tc.want)
				return
			}
			if err != nil {
				t.Fatalf("ADD after the reboot: %v", err)
			}
			addr2, gw2 := parseResult(t, out).addrIn(t, nodeSubnet)
			assertLeases(t, leaseDir, map[netip.Addr]string{addr2.Addr(): leaseContent(again.cid)})
			e.assertRecord(t, again, addr2.Addr())
			ping(t, again, gw2)
			if _, err := e.execAsFlannel(t, plugin, "DEL", again, stdin); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			e.assertNetworkEmpty(t, leaseDir)
		})
	}
}
