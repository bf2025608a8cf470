package doctor

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/netconf"
)

// DefaultConfDirs are where runtimes keep their CNI network configurations:
// containerd, CRI-O, podman's CNI backend and cnitool (/etc/cni/net.d),
// Nomad (/opt/cni/config), Apptainer, and k3s.
var DefaultConfDirs = []string{
	"/etc/cni/net.d",
	"/opt/cni/config",
	"/etc/apptainer/network",
	"/usr/local/etc/apptainer/network",
	"/var/lib/rancher/k3s/agent/etc/cni/net.d",
}

// network is one bridge network found in a configuration file.
type network struct {
	file    string
	name    string
	bridge  string
	subnets []netip.Prefix
	// dir is where its host-local keeps leases (for the plugin's entries,
	// under the rewritten dataDir).
	dir ipamdir.Dir
	// ours: the entry is the plugin's (or flannel's delegate to it); conf
	// is then its validated entry, and plugins the chain's plugin types.
	ours    bool
	conf    *netconf.Config
	plugins []string
}

// readConfFile reads a configuration file as a runtime would (through a
// symlink), but never blocks on a FIFO planted there and reads at most
// what the plugin accepts on stdin: every ADD of a bigger one is refused.
func readConfFile(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("not a regular file (%s): runtimes would block on it or skip it", fi.Mode().Type())
	}
	raw, err := io.ReadAll(io.LimitReader(f, netconf.MaxConfigSize+1))
	if err != nil {
		return nil, err
	}
	if len(raw) > netconf.MaxConfigSize {
		return nil, fmt.Errorf("larger than %d bytes, the most the plugin reads of an entry: every ADD of it would be refused (error 6)", netconf.MaxConfigSize)
	}
	return raw, nil
}

// readConflists reads every configuration file in dirs and returns the
// bridge networks it found, with a finding for each file that uses the
// plugin (valid or not) and for each file that cannot be read.
func readConflists(dirs []string) ([]*network, []Finding) {
	var nets []*network
	var fs []Finding
	for _, dir := range dirs {
		entries, err := os.ReadDir(dir)
		if err != nil {
			continue // a runtime that is not installed here
		}
		for _, e := range entries {
			ext := filepath.Ext(e.Name())
			if e.IsDir() || (ext != ".conflist" && ext != ".conf" && ext != ".json") {
				continue
			}
			path := filepath.Join(dir, e.Name())
			n, f := readConflist(path)
			nets = append(nets, n...)
			fs = append(fs, f...)
		}
	}
	return nets, fs
}

func readConflist(path string) ([]*network, []Finding) {
	raw, err := readConfFile(path)
	if err != nil {
		return nil, []Finding{{Level: Error, Check: "conflist", Subject: path, Message: fmt.Sprintf("cannot read: %v", err), Fix: "remove it, or fix it"}}
	}
	var list struct {
		Name       string            `json:"name"`
		CNIVersion string            `json:"cniVersion"`
		Type       string            `json:"type"`
		Plugins    []json.RawMessage `json:"plugins"`
	}
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, []Finding{{Level: Warn, Check: "conflist", Subject: path, Message: fmt.Sprintf("not a CNI configuration (JSON: %v)", err), Fix: "runtimes skip it too; remove it or fix it"}}
	}
	entries := list.Plugins
	if len(entries) == 0 && list.Type != "" { // a single .conf
		entries = []json.RawMessage{raw}
	}
	var types []string
	for _, e := range entries {
		var t struct {
			Type string `json:"type"`
		}
		_ = json.Unmarshal(e, &t)
		types = append(types, t.Type)
	}
	var nets []*network
	var fs []Finding
	for i, e := range entries {
		entry, ours := bridgeEntry(e)
		if entry == nil {
			continue
		}
		n := describe(path, list.Name, entry)
		if ours {
			n.ours, n.plugins = true, types
			stdin, err := withListKeys(entry, list.Name, list.CNIVersion)
			if err == nil {
				n.conf, err = netconf.Parse(stdin)
			}
			if err != nil {
				fs = append(fs, Finding{Level: Error, Check: "conflist", Subject: path, Message: fmt.Sprintf("entry %d of network %q: %v", i, list.Name, err), Fix: "fix the entry: every ADD fails the same way"})
				continue
			}
			n.dir = n.conf.Dir()
			fs = append(fs, Finding{Level: OK, Check: "conflist", Subject: path, Message: fmt.Sprintf("network %q uses %s (dataDir %s, delegate %s)", list.Name, pluginName, n.conf.DataDir, n.conf.Delegate)})
		}
		nets = append(nets, n)
	}
	return nets, fs
}

const pluginName = "nomad-bridge-cni"

// bridgeEntry returns the entry that configures a bridge with host-local,
// and whether it is the plugin's: "type" nomad-bridge-cni or bridge, or
// flannel's "delegate" (flannel passes it to its delegate type, bridge by
// default).
func bridgeEntry(raw json.RawMessage) (map[string]any, bool) {
	var e map[string]any
	if json.Unmarshal(raw, &e) != nil {
		return nil, false
	}
	if e["type"] == "flannel" {
		d, ok := e["delegate"].(map[string]any)
		if !ok {
			return nil, false
		}
		return d, d["type"] == pluginName
	}
	switch e["type"] {
	case pluginName:
		return e, true
	case "bridge":
		if ipam, ok := e["ipam"].(map[string]any); ok && ipam["type"] == "host-local" {
			return e, false
		}
	}
	return nil, false
}

// withListKeys adds the conflist's name and cniVersion to an entry, as
// libcni does before running it.
func withListKeys(entry map[string]any, name, version string) ([]byte, error) {
	e := map[string]any{}
	for k, v := range entry {
		e[k] = v
	}
	if _, ok := e["name"]; !ok {
		e["name"] = name
	}
	if _, ok := e["cniVersion"]; !ok {
		e["cniVersion"] = version
	}
	return json.Marshal(e)
}

// describe reads what a clash check needs of a bridge entry.
func describe(file, name string, e map[string]any) *network {
	n := &network{file: file, name: name, bridge: "cni0"}
	if b, ok := e["bridge"].(string); ok {
		n.bridge = b
	}
	ipam, _ := e["ipam"].(map[string]any)
	dataDir := ipamdir.DefaultLegacyDataDir
	if d, ok := ipam["dataDir"].(string); ok {
		dataDir = d
	}
	n.dir = ipamdir.New(dataDir, name)
	if s, ok := ipam["subnet"].(string); ok {
		n.addSubnet(s)
	}
	ranges, _ := ipam["ranges"].([]any)
	for _, set := range ranges {
		rs, _ := set.([]any)
		for _, r := range rs {
			if m, ok := r.(map[string]any); ok {
				if s, ok := m["subnet"].(string); ok {
					n.addSubnet(s)
				}
			}
		}
	}
	return n
}

func (n *network) addSubnet(s string) {
	if p, err := netip.ParsePrefix(strings.TrimSpace(s)); err == nil && !slices.Contains(n.subnets, p.Masked()) {
		n.subnets = append(n.subnets, p.Masked())
	}
}

// RangeAddresses is, for every network of the plugin in the conflists of
// dirs, how many addresses its ranges hold (network and broadcast
// addresses of IPv4 subnets excluded): what host-local can hand out, its
// gateway included.
func RangeAddresses(dirs []string) map[string]float64 {
	nets, _ := readConflists(dirs)
	out := map[string]float64{}
	for _, n := range nets {
		if !n.ours || n.conf == nil {
			continue
		}
		total := 0.0
		for _, p := range n.subnets {
			size := math.Pow(2, float64(p.Addr().BitLen()-p.Bits()))
			if p.Addr().Is4() && size > 2 {
				size -= 2
			}
			total += size
		}
		out[n.name] = total
	}
	return out
}

// DataDirs are the data dirs where the bridge networks of the conflists in
// dirs keep their leases (the plugin's entries' and bare bridge's), each
// once, in the order found: what a sweep of some other directory must
// check before it calls NAT rules orphans.
func DataDirs(dirs []string) []string {
	nets, _ := readConflists(dirs)
	return dataDirsOf(nets)
}

func dataDirsOf(nets []*network) []string {
	var out []string
	for _, n := range nets {
		// A relative one is relative to a runtime's working directory,
		// which only the runtime knows.
		if d := filepath.Clean(n.dir.DataDir); filepath.IsAbs(d) && !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	return out
}
