package doctor

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/conflists"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
)

// NomadClient is what a Nomad client is configured with that the doctor
// needs, and where it was read.
type NomadClient struct {
	// Source says where the settings come from: the agent's API, its
	// configuration files, or Nomad's defaults.
	Source string
	// CNIPath is cni_path, in Nomad's order.
	CNIPath []string
	// CNIConfigDir is cni_config_dir.
	CNIConfigDir string
	// BridgeName is bridge_network_name: the bridge of Nomad's built-in
	// network (which is named "nomad" whatever the bridge).
	BridgeName string
	// Subnets are bridge_network_subnet and bridge_network_subnet_ipv6.
	Subnets []netip.Prefix
}

// Nomad's client defaults (client/config and command/agent).
const (
	nomadDefaultCNIPath      = "/opt/cni/bin"
	nomadDefaultCNIConfigDir = "/opt/cni/config"
	nomadDefaultBridge       = "nomad"
	nomadDefaultSubnet       = "172.26.64.0/20"
	// nomadBuiltinNetwork is the name of the conflist Nomad builds in code.
	nomadBuiltinNetwork = "nomad"
)

// nomadSettings are the client settings as read, "" where not set.
type nomadSettings struct {
	CNIPath, CNIConfigDir, BridgeName, Subnet, Subnet6 string
}

// resolve fills Nomad's defaults in.
func (s nomadSettings) resolve(source string) NomadClient {
	or := func(v, def string) string {
		if v == "" {
			return def
		}
		return v
	}
	nc := NomadClient{Source: source, CNIPath: filepath.SplitList(or(s.CNIPath, nomadDefaultCNIPath)),
		CNIConfigDir: or(s.CNIConfigDir, nomadDefaultCNIConfigDir), BridgeName: or(s.BridgeName, nomadDefaultBridge)}
	for _, sub := range []string{or(s.Subnet, nomadDefaultSubnet), s.Subnet6} {
		if p, err := netip.ParsePrefix(sub); err == nil {
			nc.Subnets = append(nc.Subnets, p.Masked())
		}
	}
	return nc
}

// NomadDefaults are the settings of a client configured with none.
func NomadDefaults() NomadClient { return nomadSettings{}.resolve("Nomad's defaults") }

// agentSelf is the part of /v1/agent/self the doctor reads.
type agentSelf struct {
	Config struct {
		Client *struct {
			CNIPath, CNIConfigDir, BridgeNetworkName, BridgeNetworkSubnet, BridgeNetworkSubnetIPv6 string
		}
	} `json:"config"`
}

// parseAgentSelf reads the client settings from the agent's /v1/agent/self.
func parseAgentSelf(b []byte) (NomadClient, error) {
	var self agentSelf
	if err := json.Unmarshal(b, &self); err != nil {
		return NomadClient{}, fmt.Errorf("decode /v1/agent/self: %w", err)
	}
	c := self.Config.Client
	if c == nil {
		return NomadClient{}, fmt.Errorf("/v1/agent/self has no client configuration")
	}
	return nomadSettings{CNIPath: c.CNIPath, CNIConfigDir: c.CNIConfigDir, BridgeName: c.BridgeNetworkName, Subnet: c.BridgeNetworkSubnet, Subnet6: c.BridgeNetworkSubnetIPv6}.resolve("the agent's API (/v1/agent/self)"), nil
}

// hclSetting matches `key = "value"` in an HCL file: the client keys the
// doctor reads exist in the client block only, so a line scan finds them
// without an HCL parser (a diagnostic, which says where it read them).
var hclSetting = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^\s*(cni_path|cni_config_dir|bridge_network_name|bridge_network_subnet|bridge_network_subnet_ipv6)\s*=\s*"([^"]*)"`)
})

// readNomadConfigDir reads the client settings from the agent's
// configuration files in dir (*.hcl and *.json), which Nomad loads in
// lexical order, a later file's value winning.
func readNomadConfigDir(dir string) (NomadClient, bool) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return NomadClient{}, false
	}
	var names []string
	for _, e := range entries {
		if n := e.Name(); e.Type().IsRegular() && (strings.HasSuffix(n, ".hcl") || strings.HasSuffix(n, ".json")) {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	var s nomadSettings
	var read []string
	set := func(key, v string) {
		switch key {
		case "cni_path":
			s.CNIPath = v
		case "cni_config_dir":
			s.CNIConfigDir = v
		case "bridge_network_name":
			s.BridgeName = v
		case "bridge_network_subnet":
			s.Subnet = v
		case "bridge_network_subnet_ipv6":
			s.Subnet6 = v
		}
	}
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil || len(b) > 1<<20 {
			continue
		}
		found := false
		if strings.HasSuffix(n, ".json") {
			var doc struct {
				Client map[string]any `json:"client"`
			}
			if json.Unmarshal(b, &doc) == nil {
				for k, v := range doc.Client {
					if str, ok := v.(string); ok {
						set(k, str)
						found = true
					}
				}
			}
		} else {
			for line := range strings.Lines(string(b)) {
				if m := hclSetting().FindStringSubmatch(line); m != nil {
					set(m[1], m[2])
					found = true
				}
			}
		}
		if found {
			read = append(read, filepath.Join(dir, n))
		}
	}
	if len(read) == 0 {
		return NomadClient{}, false
	}
	return s.resolve(strings.Join(read, ", ")), true
}

// nomadBuiltin is the network Nomad's client builds in code for
// `mode = "bridge"`: named "nomad", on the client's bridge and subnets,
// with host-local's dataDir /var/run/cni (the plugin's default too, when
// it is installed as bridge).
func nomadBuiltin(nc NomadClient) *conflists.Network {
	return &conflists.Network{File: "Nomad's built-in bridge network", Name: nomadBuiltinNetwork, Bridge: nc.BridgeName,
		Subnets: slices.Clone(nc.Subnets), Dir: ipamdir.New(ipamdir.DefaultDataDir, nomadBuiltinNetwork)}
}

// nomadSemver is what Nomad's fingerprint takes for a version: a token
// hashicorp/go-version's NewSemver accepts (one to three numbers, a
// pre-release and build metadata).
var nomadSemver = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^v?[0-9]+(\.[0-9]+){0,2}(-[0-9A-Za-z\-~]+(\.[0-9A-Za-z\-~]+)*|-?[A-Za-z\-~]+[0-9A-Za-z\-~]*(\.[0-9A-Za-z\-~]+)*)?(\+[0-9A-Za-z\-~]+(\.[0-9A-Za-z\-~]+)*)?$`)
})

// nomadRecordedBridge is the version Nomad's fingerprint records for
// `bridge` (attr.plugins.cni.version.bridge), found its way: it runs every
// executable of each cni_path directory in order, with no arguments and
// no CNI_PATH, takes the first token of the output that parses as a
// version, and a later directory's overwrites an earlier one's (an output
// without one records nothing); it stops at a directory it cannot read or
// that is empty. from is the bridge whose version it keeps.
func nomadRecordedBridge(cniPath []string, version func(string) (string, error)) (v, from string, ok bool) {
	for _, dir := range cniPath {
		entries, err := os.ReadDir(dir)
		if err != nil || len(entries) == 0 {
			return v, from, ok
		}
		path := filepath.Join(dir, "bridge")
		fi, err := os.Stat(path)
		if err != nil || fi.Mode()&0o111 == 0 {
			continue
		}
		out, err := version(path)
		if err != nil {
			continue
		}
		for _, tok := range strings.Fields(out) {
			if nomadSemver().MatchString(tok) {
				v, from, ok = tok, path, true
				break
			}
		}
	}
	return v, from, ok
}

// atLeast13 reports whether a recorded version is 1.3.0 or later: Nomad
// sends CHECK only then.
func atLeast13(v string) bool {
	_, n, ok := firstVersion(v)
	return ok && (n[0] > 1 || (n[0] == 1 && n[1] >= 3))
}

// checkNomad reports the client settings the doctor used and what Nomad
// records for bridge, which decides whether it sends CHECK.
func checkNomad(o Options, nc NomadClient) []Finding {
	fs := []Finding{{Level: OK, Check: "nomad", Subject: "client", Message: fmt.Sprintf("settings from %s: cni_path %s, cni_config_dir %s, bridge %s, subnets %s", nc.Source, strings.Join(nc.CNIPath, ":"), nc.CNIConfigDir, nc.BridgeName, prefixes(nc.Subnets))}}
	v, from, ok := nomadRecordedBridge(nc.CNIPath, o.Version)
	where := strings.Join(nc.CNIPath, ":")
	switch {
	case !ok:
		fs = append(fs, Finding{Level: Warn, Check: "nomad", Subject: "bridge", Message: fmt.Sprintf("Nomad records no version of bridge from cni_path %s: it never sends CHECK (no CHECK-time sweep)", where), Fix: fmt.Sprintf("install the reference CNI plugins, stamped with their version (make plugins), into a directory of %s", where)})
	case !atLeast13(v):
		fs = append(fs, Finding{Level: Warn, Check: "nomad", Subject: "bridge", Message: fmt.Sprintf("Nomad records bridge %s (from %s, the last bridge of cni_path %s that prints a version): below 1.3.0 it never sends CHECK (no CHECK-time sweep)", v, from, where), Fix: fmt.Sprintf("replace %s with the reference plugins, stamped with their version (make plugins)", from)})
	default:
		fs = append(fs, Finding{Level: OK, Check: "nomad", Subject: "bridge", Message: fmt.Sprintf("Nomad records bridge %s (from %s, the last bridge of cni_path %s that prints a version): it sends CHECK on restore", v, from, where)})
	}
	return fs
}

func prefixes(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}
