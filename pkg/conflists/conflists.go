// Package conflists finds the bridge networks a host's CNI configuration
// files set up: which are the plugin's (validated as ADD would), where each
// keeps its leases, its subnets and how many addresses its ranges hold. The
// doctor, metrics and the operator's commands read the host through it.
package conflists

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/big"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containernetworking/cni/libcni"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/internal/statefile"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/netconf"
)

// DefaultDirs are where runtimes keep their CNI network configurations:
// containerd, CRI-O, podman's CNI backend and cnitool (/etc/cni/net.d),
// Nomad (/opt/cni/config), Apptainer, and k3s.
var DefaultDirs = []string{
	"/etc/cni/net.d",
	"/opt/cni/config",
	"/etc/apptainer/network",
	"/usr/local/etc/apptainer/network",
	"/var/lib/rancher/k3s/agent/etc/cni/net.d",
}

// Reader is who reads the configuration files of a directory, and where
// they look for plugins unless told otherwise.
type Reader struct {
	Runtimes   string
	PluginDirs []string
}

// DefaultReaders are the runtimes that read each of DefaultDirs but
// Nomad's (its client's cni_path says where it looks), with their default
// plugin directories: podman's cni_plugin_dirs (containers.conf), which
// hold containerd's bin_dir, CRI-O's plugin_dirs and the usual CNI_PATH of
// cnitool; Apptainer's "cni plugin path"; k3s's bundled plugins.
var DefaultReaders = map[string]Reader{
	"/etc/cni/net.d":                           {"containerd, CRI-O, podman and cnitool", []string{"/opt/cni/bin", "/usr/local/libexec/cni", "/usr/libexec/cni", "/usr/local/lib/cni", "/usr/lib/cni"}},
	"/etc/apptainer/network":                   {"Apptainer", []string{"/usr/libexec/apptainer/cni"}},
	"/usr/local/etc/apptainer/network":         {"Apptainer", []string{"/usr/local/libexec/apptainer/cni"}},
	"/var/lib/rancher/k3s/agent/etc/cni/net.d": {"k3s", []string{"/var/lib/rancher/k3s/data/cni", "/var/lib/rancher/k3s/data/current/bin"}},
}

// PluginName is the type that names the plugin in an entry: the name of
// its binary (CNI runs the type), as operators type it too.
const PluginName = "nomad-bridge-cni"

// File is one configuration file and the bridge networks it sets up.
type File struct {
	Path string
	// Err: the file could not be read (NotCNI: it was read, but is not a
	// CNI configuration, which containerd and Nomad stop loading at).
	Err    error
	NotCNI bool
	// Networks are its bridge entries with host-local, in file order.
	Networks []*Network
}

// Network is one bridge entry with host-local.
type Network struct {
	File   string
	Entry  int // its index in the file's plugins
	Name   string
	Bridge string
	// Subnets are its ranges' subnets, each once.
	Subnets []netip.Prefix
	// Addresses is how many addresses its ranges hold, from rangeStart to
	// rangeEnd as host-local sets them (its gateway included); 0 when
	// host-local would refuse the ranges.
	Addresses float64
	// Dir is where its host-local keeps leases (for the plugin's entries,
	// under the rewritten dataDir).
	Dir ipamdir.Dir
	// Ours: the entry is the plugin's (or flannel's delegate to it). Conf
	// is then its validated entry, or Err why ADD refuses it; Plugins are
	// the chain's plugin types.
	Ours    bool
	Conf    *netconf.Config
	Err     error
	Plugins []string
}

// Read reads every configuration file (.conflist, .conf, .json) in dirs,
// each directory once, as libcni finds them for the runtimes; a directory
// that cannot be read (that does not exist: a runtime not installed here)
// holds none. With bridgeIsPlugin (the plugin installed as "bridge" in
// front of the reference plugins), an entry of type "bridge" with
// host-local is the plugin's too.
func Read(dirs []string, bridgeIsPlugin bool) []File {
	var files []File
	for i, dir := range dirs {
		if slices.ContainsFunc(dirs[:i], func(d string) bool { return filepath.Clean(d) == filepath.Clean(dir) }) {
			continue // read already
		}
		paths, _ := libcni.ConfFiles(dir, []string{".conflist", ".conf", ".json"})
		for _, path := range paths {
			files = append(files, readFile(path, bridgeIsPlugin))
		}
	}
	return files
}

// Networks are the files' networks, but for the plugin's entries that ADD
// refuses.
func Networks(files []File) []*Network {
	var out []*Network
	for _, f := range files {
		for _, n := range f.Networks {
			if n.Err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}

func readFile(path string, bridgeIsPlugin bool) File {
	file := File{Path: path}
	// As a runtime reads it (through a symlink), but never blocking on a
	// FIFO planted there, and at most what the plugin accepts on stdin:
	// every ADD of a bigger one is refused.
	raw, err := statefile.ReadConfig(path, netconf.MaxConfigSize)
	if err != nil {
		file.Err = err
		return file
	}
	var list struct {
		Name       string            `json:"name"`
		CNIVersion string            `json:"cniVersion"`
		Type       string            `json:"type"`
		Plugins    []json.RawMessage `json:"plugins"`
	}
	if err := json.Unmarshal(raw, &list); err != nil {
		file.Err, file.NotCNI = fmt.Errorf("JSON: %w", err), true
		return file
	}
	// The extension says how runtimes read the file (libcni, go-cni,
	// Nomad): they refuse it in the other shape, and what libcni's parser
	// refuses (no "name", an entry without "type"), whatever the plugin's
	// entry in it; libcni picks the version from "cniVersions" too.
	raws := list.Plugins
	switch conflist := filepath.Ext(path) == ".conflist"; {
	case conflist && len(raws) == 0 && list.Type != "":
		file.Err = errors.New(`one plugin's configuration ("type", no "plugins"): runtimes read that only from a .conf or .json file`)
	case !conflist && list.Type == "":
		file.Err = errors.New(`no "type": runtimes read a .conf or .json file as one plugin's configuration, and a list of plugins only from a .conflist`)
	case !conflist:
		raws = []json.RawMessage{raw}
		_, file.Err = libcni.NetworkPluginConfFromBytes(raw)
	default:
		var parsed *libcni.NetworkConfigList
		if parsed, file.Err = libcni.NetworkConfFromBytes(raw); file.Err == nil {
			list.CNIVersion = parsed.CNIVersion
		}
	}
	if file.Err != nil {
		file.NotCNI = true
		return file
	}
	// An entry that is not an object stays nil, of no type.
	entries := make([]map[string]any, len(raws))
	types := make([]string, len(raws))
	for i, e := range raws {
		_ = json.Unmarshal(e, &entries[i])
		types[i], _ = entries[i]["type"].(string)
	}
	for i, e := range entries {
		entry, ours, refused := bridgeEntry(e, bridgeIsPlugin)
		if entry == nil {
			continue
		}
		// libcni sets an entry's name and cniVersion to the conflist's
		// before it runs it, over the entry's own.
		entry["name"], entry["cniVersion"] = list.Name, list.CNIVersion
		stdin, err := json.Marshal(entry)
		err = cmp.Or(refused, err)
		ranges, rangesErr := hostLocalRanges(stdin)
		n := describe(path, list.Name, entry, ranges)
		n.Entry = i
		if err == nil && rangesErr == nil {
			n.Addresses = rangeAddresses(ranges)
		}
		if ours {
			// flannel's delegate runs too.
			n.Ours, n.Plugins = true, types
			if t := entry["type"].(string); !slices.Contains(types, t) {
				n.Plugins = append(slices.Clone(types), t)
			}
			if e := netconf.CheckVersion(list.CNIVersion); err == nil && e != nil {
				err = e
			} else if err == nil {
				n.Conf, err = netconf.Parse(stdin)
			}
			if err != nil {
				n.Err = err
			} else {
				n.Dir = n.Conf.Dir()
			}
		}
		file.Networks = append(file.Networks, n)
	}
	return file
}

// bridgeEntry returns the entry that configures a bridge with host-local,
// and whether it is the plugin's: "type" nomad-bridge-cni (or bridge, when
// bridgeIsPlugin), or what flannel hands its delegate of that type;
// refused says why flannel refuses its entry.
func bridgeEntry(e map[string]any, bridgeIsPlugin bool) (entry map[string]any, ours bool, refused error) {
	if e["type"] == "flannel" {
		e, refused = flannelDelegate(e)
	}
	switch e["type"] {
	case PluginName:
		return e, true, refused
	case "bridge":
		if ipam, ok := e["ipam"].(map[string]any); ok && ipam["type"] == netconf.HostLocal {
			return e, bridgeIsPlugin, refused
		}
	}
	return nil, false, nil
}

// flannelDelegate is the entry flannel's CNI plugin (flannel-io/cni-plugin)
// hands its delegate, as far as the conflist tells: its "delegate" map, of
// type bridge unless it says otherwise, with flannel's own "ipam", of type
// host-local unless it says otherwise (its ranges come from subnet.env).
// flannel refuses a "delegate" with "name" or "ipam", which it sets.
func flannelDelegate(e map[string]any) (map[string]any, error) {
	given, _ := e["delegate"].(map[string]any)
	var refused error
	for _, key := range []string{"name", "ipam"} {
		if _, ok := given[key]; ok {
			refused = fmt.Errorf(`flannel refuses %q in its "delegate": it sets it from its own entry's %q`, key, key)
		}
	}
	d := map[string]any{"type": "bridge"}
	maps.Copy(d, given)
	ipam := map[string]any{"type": netconf.HostLocal}
	if own, ok := e["ipam"].(map[string]any); ok {
		maps.Copy(ipam, own)
	}
	d["ipam"] = ipam
	return d, refused
}

// describe reads what a clash check needs of a bridge entry: its bridge,
// where it keeps leases, and each subnet of its ranges once.
func describe(file, name string, e map[string]any, ranges []hostLocalRange) *Network {
	n := &Network{File: file, Name: name, Bridge: "cni0"}
	if b, ok := e["bridge"].(string); ok {
		n.Bridge = b
	}
	ipam, _ := e["ipam"].(map[string]any)
	dataDir := ipamdir.DefaultLegacyDataDir
	for k, v := range ipam {
		// host-local reads the key in any case, and "" as its default.
		if d, ok := v.(string); ok && d != "" && strings.EqualFold(k, "dataDir") {
			dataDir = d
		}
	}
	n.Dir = ipamdir.New(dataDir, name)
	for _, r := range ranges {
		if p, err := netip.ParsePrefix(strings.TrimSpace(r.Subnet)); err == nil && !slices.Contains(n.Subnets, p.Masked()) {
			n.Subnets = append(n.Subnets, p.Masked())
		}
	}
	return n
}

// hostLocalRanges are an entry's ranges as host-local reads them
// (plugins/ipam/host-local/backend/allocator): the runtime's ipRanges
// first, then the old single-range keys, then "ranges", each range set's
// in order. A key of the wrong type is an error, and the others are still
// read.
func hostLocalRanges(entry []byte) ([]hostLocalRange, error) {
	var conf struct {
		IPAM struct {
			hostLocalRange
			Ranges [][]hostLocalRange `json:"ranges"`
		} `json:"ipam"`
		RuntimeConfig struct {
			IPRanges [][]hostLocalRange `json:"ipRanges"`
		} `json:"runtimeConfig"`
	}
	err := json.Unmarshal(entry, &conf)
	ranges := slices.Concat(conf.RuntimeConfig.IPRanges...)
	if conf.IPAM.Subnet != "" {
		ranges = append(ranges, conf.IPAM.hostLocalRange)
	}
	return append(ranges, slices.Concat(conf.IPAM.Ranges...)...), err
}

// InRanges are those of addrs (without prefix) that one of entry's ranges
// holds, as host-local reads them: asked for an address outside them,
// host-local refuses the whole request, the addresses still in range too.
func InRanges(entry []byte, addrs []string) []string {
	ranges, _ := hostLocalRanges(entry) // a key of the wrong type: host-local refuses the ADD anyway
	return slices.DeleteFunc(slices.Clone(addrs), func(s string) bool {
		a, err := netip.ParseAddr(s)
		return err != nil || !slices.ContainsFunc(ranges, func(r hostLocalRange) bool {
			start, end, ok := r.bounds()
			return ok && start.Is4() == a.Is4() && start.Compare(a) <= 0 && a.Compare(end) <= 0
		})
	})
}

// rangeAddresses counts the addresses of an entry's ranges as host-local
// does (rangeStart defaults to the subnet's first address after the
// network's, rangeEnd to its last, less the broadcast address in IPv4), or
// 0 if host-local would refuse them (a subnet too small or with host bits
// set, a bound outside its subnet, a start after its end, ranges that
// overlap). host-local's allocator (and plugins' pkg/ip alone) is not
// linked for this: it brings netlink and knftables, whose init every verb
// of the plugin would pay (BENCHMARKS.md).
func rangeAddresses(ranges []hostLocalRange) float64 {
	var bounds [][2]netip.Addr
	total := new(big.Int)
	for _, r := range ranges {
		start, end, ok := r.bounds()
		if !ok {
			return 0
		}
		for _, b := range bounds {
			if start.Is4() == b[0].Is4() && start.Compare(b[1]) <= 0 && b[0].Compare(end) <= 0 {
				return 0
			}
		}
		bounds = append(bounds, [2]netip.Addr{start, end})
		s, e := start.As16(), end.As16()
		n := new(big.Int).Sub(new(big.Int).SetBytes(e[:]), new(big.Int).SetBytes(s[:]))
		total.Add(total, n.Add(n, big.NewInt(1)))
	}
	f, _ := new(big.Float).SetInt(total).Float64()
	return f
}

// hostLocalRange is one range of a host-local configuration.
type hostLocalRange struct {
	Subnet     string `json:"subnet"`
	RangeStart string `json:"rangeStart"`
	RangeEnd   string `json:"rangeEnd"`
}

// bounds are the first and last address host-local hands out of r.
func (r hostLocalRange) bounds() (start, end netip.Addr, ok bool) {
	p, err := netip.ParsePrefix(strings.TrimSpace(r.Subnet))
	if err != nil || p != p.Masked() || p.Bits() > p.Addr().BitLen()-2 {
		return start, end, false
	}
	last := lastAddr(p)
	if p.Addr().Is4() {
		last = last.Prev()
	}
	// A bound given must be an address of the subnet.
	bound := func(given string, def netip.Addr) (netip.Addr, bool) {
		if given == "" {
			return def, true
		}
		a, err := netip.ParseAddr(given)
		return a.Unmap(), err == nil && p.Contains(a.Unmap())
	}
	start, startOK := bound(r.RangeStart, p.Addr().Next())
	end, endOK := bound(r.RangeEnd, last)
	return start, end, startOK && endOK && start.Compare(end) <= 0
}

// lastAddr is the last address of p.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := range b {
		if bits := p.Bits() - i*8; bits < 8 {
			b[i] |= byte(0xff >> max(bits, 0))
		}
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// RangeAddresses is, for every network of the plugin among nets, how many
// addresses its ranges hold. A name in two files is the first one's, as
// Nomad and libcni load it (the files in lexical order).
func RangeAddresses(nets []*Network) map[string]float64 {
	out := map[string]float64{}
	for _, n := range nets {
		if _, seen := out[n.Name]; !seen && n.Ours && n.Addresses > 0 {
			out[n.Name] = n.Addresses
		}
	}
	return out
}

// PluginDataDirs are dataDir, then the data dirs the plugin's entries among
// nets use, each once: every data dir a sweep of the host must cover.
func PluginDataDirs(dataDir string, nets []*Network) []string {
	ours := slices.DeleteFunc(slices.Clone(nets), func(n *Network) bool { return !n.Ours || n.Conf == nil })
	return dataDirs([]string{filepath.Clean(dataDir)}, ours)
}

// DataDirsOf are the data dirs where nets keep their leases (the plugin's
// entries' and bare bridge's), each once, in the order found: what a sweep
// of some other directory must check before it calls NAT rules orphans.
func DataDirsOf(nets []*Network) []string { return dataDirs(nil, nets) }

// dataDirs adds to out the data dirs of nets it does not hold yet.
func dataDirs(out []string, nets []*Network) []string {
	for _, n := range nets {
		// A relative one is relative to a runtime's working directory,
		// which only the runtime knows.
		if d := filepath.Clean(n.Dir.DataDir); filepath.IsAbs(d) && !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	return out
}
