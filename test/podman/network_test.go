package podman

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/testhost"
)

// adoption is how a podman network gets the plugin, or, for the control,
// does not.
type adoption int

const (
	// oneWord: "type": "nomad-bridge-cni" in the network's conflist, with
	// the plugin's dataDir on the test's tmpfs.
	oneWord adoption = iota
	// asBridge: the plugin installed as `bridge` in a directory that
	// cni_plugin_dirs lists before the reference plugins; the conflist is
	// podman's own.
	asBridge
	// bareBridge: the control, the reference bridge with host-local's
	// leases in a plain (persistent) directory of the test.
	bareBridge
)

var adoptions = []adoption{oneWord, asBridge, bareBridge}

func (a adoption) String() string {
	switch a {
	case oneWord:
		return "one-word"
	case asBridge:
		return "as-bridge"
	case bareBridge:
		return "bare-bridge"
	}
	return fmt.Sprintf("adoption(%d)", int(a))
}

// plugin reports whether the plugin manages the network's leases.
func (a adoption) plugin() bool { return a != bareBridge }

// forEachAdoption runs fn as a subtest per adoption.
func forEachAdoption(t *testing.T, fn func(t *testing.T, a adoption)) {
	for _, a := range adoptions {
		t.Run(a.String(), func(t *testing.T) { fn(t, a) })
	}
}

// network is a podman network the test created.
type network struct {
	name    string
	bridge  string
	subnet  netip.Prefix
	gateway netip.Addr
}

// conflistPath is where podman's CNI backend keeps the network.
func (e *env) conflistPath(n *network) string {
	return filepath.Join(e.netConfDir, n.name+".conflist")
}

// leaseDir is where host-local keeps the network's leases.
func (e *env) leaseDir(n *network) string {
	switch e.adoption {
	case oneWord:
		return filepath.Join(e.tmpfs, n.name)
	case asBridge:
		return filepath.Join(pluginDefaultDataDir, n.name)
	}
	return filepath.Join(e.persist, n.name)
}

// recordDir is where the plugin keeps the network's attachment records
// ("" for the control).
func (e *env) recordDir(n *network) string {
	switch e.adoption {
	case oneWord:
		return filepath.Join(e.tmpfs, recordDirName, n.name)
	case asBridge:
		return filepath.Join(pluginDefaultDataDir, recordDirName, n.name)
	}
	return ""
}

// addNetwork creates a network with `podman network create`, then adopts
// the plugin in the conflist podman wrote (see adopt). suffix tells the
// env's networks apart.
func (e *env) addNetwork(t *testing.T, suffix string) *network {
	t.Helper()
	n := e.createNetwork(t, suffix)
	e.adopt(t, n)
	return n
}

// addBridgeNetwork creates a network that does not use the plugin yet:
// podman's conflist as written, but for its bridge device (see adopt).
// host-local keeps its leases in its default directory (legacyDir).
func (e *env) addBridgeNetwork(t *testing.T, suffix string) *network {
	t.Helper()
	n := e.createNetwork(t, suffix)
	e.editFirstPlugin(t, n, func(first, _ map[string]any) { first["bridge"] = n.bridge })
	return n
}

// legacyDir is host-local's default lease directory of network n, where
// plain bridge on a conflist without ipam.dataDir keeps its leases (the
// name is the env's own; the test removes it).
func (e *env) legacyDir(n *network) string {
	return filepath.Join(hostLocalDefaultDir, n.name)
}

// adoptOneWord switches a network of addBridgeNetwork to the plugin, as an
// operator would while its containers run: "type": "nomad-bridge-cni" and
// the plugin's dataDir, every other key unchanged.
func (e *env) adoptOneWord(t *testing.T, n *network) {
	t.Helper()
	if e.adoption != oneWord {
		t.Fatalf("adoptOneWord in a %s env", e.adoption)
	}
	e.editFirstPlugin(t, n, func(first, _ map[string]any) {
		first["type"] = pluginType
		first["dataDir"] = e.tmpfs
	})
}

// createNetwork runs `podman network create` for a network of unique
// name, bridge and subnet.
func (e *env) createNetwork(t *testing.T, suffix string) *network {
	t.Helper()
	n := &network{
		// Unique: as `bridge`, the plugin keeps its leases under the
		// host's /var/run/cni/<name>.
		name:   "nbp-" + e.id + suffix,
		bridge: "nbp" + e.id + suffix, // at most 15 bytes
		subnet: pickSubnet(t),
	}
	n.gateway = n.subnet.Addr().Next()
	e.mu.Lock()
	e.nets = append(e.nets, n)
	e.mu.Unlock()
	e.mustPodman(t, "network", "create", "--disable-dns", "--subnet", n.subnet.String(), n.name)
	return n
}

// adopt edits the network's conflist, keeping every key podman wrote. The
// bridge device is renamed after the test (podman numbers them
// cni-podman<N> from what it knows of, which is not the host's); then, by
// adoption: one word changes the first plugin's type and adds the plugin's
// dataDir; as `bridge` changes nothing else; the control puts host-local's
// leases into the test's directory instead of /var/lib/cni/networks.
func (e *env) adopt(t *testing.T, n *network) {
	t.Helper()
	e.editFirstPlugin(t, n, func(first, ipam map[string]any) {
		first["bridge"] = n.bridge
		switch e.adoption {
		case oneWord:
			first["type"] = pluginType
			first["dataDir"] = e.tmpfs
		case bareBridge:
			ipam["dataDir"] = e.persist
		}
	})
}

// editFirstPlugin rewrites the network's conflist with edit applied to its
// first plugin (which podman writes as bridge with ipam) and its ipam.
func (e *env) editFirstPlugin(t *testing.T, n *network, edit func(first, ipam map[string]any)) {
	t.Helper()
	path := e.conflistPath(n)
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read podman's conflist: %v", err)
	}
	var conflist map[string]any
	if err := json.Unmarshal(raw, &conflist); err != nil {
		t.Fatalf("parse %s: %v", path, err)
	}
	plugins, _ := conflist["plugins"].([]any)
	if len(plugins) == 0 {
		t.Fatalf("%s has no plugins:\n%s", path, raw)
	}
	first, _ := plugins[0].(map[string]any)
	ipam, _ := first["ipam"].(map[string]any)
	if first["type"] != "bridge" || ipam == nil {
		t.Fatalf("%s: first plugin is not bridge with ipam:\n%s", path, raw)
	}
	edit(first, ipam)
	out, err := json.MarshalIndent(conflist, "", "   ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
}

// ---------------------------------------------------------------------------
// Subnets

// subnets are this package's: 10.200.0.0-10.249.255.0 (the e2e tests use
// 10.100-10.199).
var subnets = &testhost.Subnets{Second10: [2]int{200, 250}}

func pickSubnet(t *testing.T) netip.Prefix {
	t.Helper()
	p, err := subnets.IPv4()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// nthAddr is the n-th address of p (p's own address is the 0th).
func nthAddr(p netip.Prefix, n int) netip.Addr {
	a := p.Addr()
	for range n {
		a = a.Next()
	}
	return a
}
