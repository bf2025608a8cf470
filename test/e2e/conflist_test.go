package e2e

import (
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/containernetworking/cni/libcni"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/testhost"
)

// ---------------------------------------------------------------------------
// Conflists

// loadConflist reads one of the repository's example conflists.
func loadConflist(t *testing.T, file string) map[string]any {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(testhost.RepoDir(t), "conflist", file))
	if err != nil {
		t.Fatalf("read conflist: %v", err)
	}
	var conf map[string]any
	if err := json.Unmarshal(raw, &conf); err != nil {
		t.Fatalf("parse conflist %s: %v", file, err)
	}
	return conf
}

// pluginEntries returns the entries of a conflist's "plugins" array.
func pluginEntries(t *testing.T, conf map[string]any) []map[string]any {
	t.Helper()
	list, ok := conf["plugins"].([]any)
	if !ok {
		t.Fatalf("conflist has no plugins array: %v", conf)
	}
	out := make([]map[string]any, 0, len(list))
	for _, p := range list {
		m, ok := p.(map[string]any)
		if !ok {
			t.Fatalf("plugin entry is not an object: %v", p)
		}
		out = append(out, m)
	}
	return out
}

// entryOfType returns the first plugin entry of the given type.
func entryOfType(t *testing.T, conf map[string]any, typ string) map[string]any {
	t.Helper()
	for _, p := range pluginEntries(t, conf) {
		if p["type"] == typ {
			return p
		}
	}
	t.Fatalf("conflist has no %q entry", typ)
	return nil
}

// confFor loads an example conflist and makes it this test's own: its
// network name, bridge, subnets, firewall admin chain, and the tmpfs as the
// plugin's dataDir. Everything else stays as the example has it.
func (e *testEnv) confFor(t *testing.T, file string) map[string]any {
	t.Helper()
	conf := loadConflist(t, file)
	conf["name"] = e.netName
	for _, p := range pluginEntries(t, conf) {
		switch p["type"] {
		case pluginType, "bridge":
			p["bridge"] = e.bridge
			if p["type"] == pluginType {
				p["dataDir"] = e.dataDir
			}
			ipam, ok := p["ipam"].(map[string]any)
			if !ok {
				t.Fatalf("%s entry has no ipam", p["type"])
			}
			e.patchIPAM(t, ipam)
		case "firewall":
			// The admin chain is shared by everything using the same name;
			// a per-test name lets cleanup delete it without touching
			// anybody else's (Nomad's NOMAD-ADMIN included).
			p["iptablesAdminChainName"] = e.adminChain
		}
	}
	return conf
}

// patchIPAM swaps the example's subnets for the test's random ones.
func (e *testEnv) patchIPAM(t *testing.T, ipam map[string]any) {
	t.Helper()
	if _, ok := ipam["subnet"]; ok {
		ipam["subnet"] = e.subnet4.String()
		delete(ipam, "rangeStart")
		delete(ipam, "rangeEnd")
		delete(ipam, "gateway")
	}
	ranges, _ := ipam["ranges"].([]any)
	for _, set := range ranges {
		rs, _ := set.([]any)
		for _, r := range rs {
			rm, ok := r.(map[string]any)
			if !ok {
				continue
			}
			s, _ := rm["subnet"].(string)
			p, err := netip.ParsePrefix(s)
			if err != nil {
				t.Fatalf("example range subnet %q: %v", s, err)
			}
			if p.Addr().Is4() {
				rm["subnet"] = e.subnet4.String()
			} else {
				rm["subnet"] = e.subnet6.String()
			}
			delete(rm, "rangeStart")
			delete(rm, "rangeEnd")
			delete(rm, "gateway")
		}
	}
}

// bareBridge turns a conflist using the plugin back into what users run
// today: "type": "bridge" with host-local's leases in leaseDir, which the
// "reboot" does not wipe (like /var/lib/cni/networks).
func bareBridge(t *testing.T, conf map[string]any, leaseDir string) {
	t.Helper()
	p := entryOfType(t, conf, pluginType)
	p["type"] = "bridge"
	delete(p, "delegate")
	delete(p, "dataDir")
	p["ipam"].(map[string]any)["dataDir"] = leaseDir
}

// chooseChain makes conf the control when bare (bare bridge, leases in
// host-local's persistent dir) and otherwise requires the plugin; it
// returns where the network's leases go.
func (e *testEnv) chooseChain(t *testing.T, conf map[string]any, bare bool) string {
	t.Helper()
	if bare {
		bareBridge(t, conf, e.persistDir)
		return filepath.Join(e.persistDir, e.netName)
	}
	e.requirePlugin(t)
	return e.leaseDir()
}

// loadConfList writes conf as the test's only network and loads it back
// the way libcni-based runtimes read their conflist.
func (e *testEnv) loadConfList(t *testing.T, conf map[string]any) *libcni.NetworkConfigList {
	t.Helper()
	list, err := libcni.ConfListFromFile(e.writeConflist(t, conf))
	if err != nil {
		t.Fatalf("load conflist: %v", err)
	}
	return list
}

// writeConflist makes conf the only network in the test's NETCONFPATH.
func (e *testEnv) writeConflist(t *testing.T, conf map[string]any) string {
	t.Helper()
	raw, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		t.Fatalf("marshal conflist: %v", err)
	}
	p := filepath.Join(e.confDir, e.netName+".conflist")
	if err := os.WriteFile(p, raw, 0o644); err != nil {
		t.Fatalf("write conflist: %v", err)
	}
	return p
}

// reclaimConf is confFor with the plugin entry's ipam.dataDir pointing at
// the test's own persistent directory: the plugin treats it as the legacy
// lease directory to migrate from, so no test ever reads or writes the real
// /var/lib/cni/networks.
func (e *testEnv) reclaimConf(t *testing.T, file string) map[string]any {
	t.Helper()
	conf := e.confFor(t, file)
	entryOfType(t, conf, pluginType)["ipam"].(map[string]any)["dataDir"] = e.persistDir
	return conf
}

// setRange limits the IPv4 range of the conflist's bridge entry (ours or
// bare bridge) to start..end.
func setRange(t *testing.T, conf map[string]any, start, end netip.Addr) {
	t.Helper()
	for _, p := range pluginEntries(t, conf) {
		if p["type"] != pluginType && p["type"] != "bridge" {
			continue
		}
		ipam := p["ipam"].(map[string]any)
		if _, ok := ipam["subnet"]; ok {
			ipam["rangeStart"], ipam["rangeEnd"] = start.String(), end.String()
			return
		}
		for _, set := range ipam["ranges"].([]any) {
			for _, r := range set.([]any) {
				rm := r.(map[string]any)
				if p, err := netip.ParsePrefix(rm["subnet"].(string)); err == nil && p.Addr().Is4() {
					rm["rangeStart"], rm["rangeEnd"] = start.String(), end.String()
					return
				}
			}
		}
	}
	t.Fatal("conflist has no IPv4 range to limit")
}

// hostAddr is the n-th address of the test's IPv4 subnet.
func (e *testEnv) hostAddr(n int) netip.Addr {
	a := e.subnet4.Addr().As4()
	a[3] += byte(n)
	return netip.AddrFrom4(a)
}

// entryConfig is the plugin entry of conf as a runtime hands it to the
// plugin: a single config carrying name and cniVersion.
func entryConfig(t *testing.T, conf map[string]any, typ string) []byte {
	t.Helper()
	entry := map[string]any{}
	for k, v := range entryOfType(t, conf, typ) {
		entry[k] = v
	}
	entry["name"] = conf["name"]
	entry["cniVersion"] = conf["cniVersion"]
	return mustJSON(t, entry)
}

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
