package doctor

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"unicode"

	cniversion "github.com/containernetworking/cni/pkg/version"
	"github.com/hashicorp/go-version"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/internal/statefile"
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
	// Version is the agent's Nomad version ("" unknown): it decides how
	// the fingerprint reads cni_path. VersionSource says where it was
	// read, or why it is unknown.
	Version, VersionSource string

	// cniPathDefault is the default filled in for a cni_path not set
	// ("" when it was set): it depends on the version (setVersion).
	cniPathDefault string
}

// Nomad's client defaults (client/config and command/agent).
const (
	// nomadDefaultCNIPath is cni_path's default from Nomad 1.11.2 (2.x
	// too): client/config/config_linux.go DefaultCNIPath, added by #27336
	// (fcc9a684dc, 8530874aa3 on release/1.11.x), which also made the
	// fingerprint read past a directory it cannot read (nomadStops).
	// nomadOldDefaultCNIPath is every earlier one's (v1.11.1
	// client/config/config.go and command/agent/config.go).
	nomadDefaultCNIPath      = "/opt/cni/bin:/usr/libexec/cni"
	nomadOldDefaultCNIPath   = "/opt/cni/bin"
	nomadDefaultCNIConfigDir = "/opt/cni/config"
	nomadDefaultBridge       = "nomad"
	nomadDefaultSubnet       = "172.26.64.0/20"
	// nomadBuiltinNetwork is the name of the conflist Nomad builds in code.
	nomadBuiltinNetwork = "nomad"
)

// nomadSettings are the client settings as read, "" where not set; the
// names are those of the agent's API.
type nomadSettings struct {
	CNIPath, CNIConfigDir, BridgeNetworkName, BridgeNetworkSubnet, BridgeNetworkSubnetIPv6 string
}

// resolve fills Nomad's defaults in, cni_path's as the version is
// unknown: setVersion makes it the version's.
func (s nomadSettings) resolve(source string) NomadClient {
	nc := NomadClient{Source: source, CNIPath: filepath.SplitList(cmp.Or(s.CNIPath, nomadDefaultCNIPath)),
		CNIConfigDir: cmp.Or(s.CNIConfigDir, nomadDefaultCNIConfigDir), BridgeName: cmp.Or(s.BridgeNetworkName, nomadDefaultBridge)}
	if s.CNIPath == "" {
		nc.cniPathDefault = nomadDefaultCNIPath
	}
	for _, sub := range []string{cmp.Or(s.BridgeNetworkSubnet, nomadDefaultSubnet), s.BridgeNetworkSubnetIPv6} {
		if p, err := netip.ParsePrefix(sub); err == nil {
			nc.Subnets = append(nc.Subnets, p.Masked())
		}
	}
	return nc
}

// setVersion records the agent's version, read from source, and makes a
// cni_path that was not set that version's default: changed in 1.11.2.
// Unknown, it is the newer one, which starts with the older one's only
// directory: both read the plugins there first.
func (nc *NomadClient) setVersion(v, source string) {
	nc.Version, nc.VersionSource = v, source
	if !nc.defaulted() {
		return
	}
	nc.cniPathDefault = nomadDefaultCNIPath
	if stops, _ := nomadStops(v); stops {
		nc.cniPathDefault = nomadOldDefaultCNIPath
	}
	nc.CNIPath = filepath.SplitList(nc.cniPathDefault)
}

// defaulted reports whether cni_path is the default filled in.
func (nc NomadClient) defaulted() bool {
	return nc.cniPathDefault != "" && strings.Join(nc.CNIPath, ":") == nc.cniPathDefault
}

// cniPathNote says, for the client finding, whose default cni_path is
// ("" when it was set).
func (nc NomadClient) cniPathNote() string {
	if !nc.defaulted() {
		return ""
	}
	if _, known := nomadStops(nc.Version); known {
		return fmt.Sprintf(" (Nomad %s's default)", nc.Version)
	}
	return fmt.Sprintf(" (Nomad's default from 1.11.2, the agent's version unknown; before 1.11.2, %s)", nomadOldDefaultCNIPath)
}

// NomadDefaults are the settings of a client configured with none.
func NomadDefaults() NomadClient { return nomadSettings{}.resolve("Nomad's defaults") }

// parseAgentSelf reads the client settings from the agent's /v1/agent/self.
func parseAgentSelf(b []byte) (NomadClient, error) {
	// The part of it the doctor reads: the agent's configuration, whose
	// Version is the agent's build (version.VersionInfo).
	var self struct {
		Config struct {
			Client  *nomadSettings
			Version *struct{ Version, VersionPrerelease string }
		} `json:"config"`
	}
	if err := json.Unmarshal(b, &self); err != nil {
		return NomadClient{}, fmt.Errorf("decode /v1/agent/self: %w", err)
	}
	if self.Config.Client == nil {
		return NomadClient{}, fmt.Errorf("/v1/agent/self has no client configuration")
	}
	nc := self.Config.Client.resolve("the agent's API (/v1/agent/self)")
	if v := self.Config.Version; v != nil && v.Version != "" {
		version := v.Version
		if v.VersionPrerelease != "" {
			version += "-" + v.VersionPrerelease
		}
		nc.setVersion(version, "the agent's API")
	}
	return nc, nil
}

// parseNomadVersion reads the version `nomad version` prints on its first
// line ("Nomad v2.0.6-dev"; before 1.3, "Nomad v1.2.6 (<revision>)").
func parseNomadVersion(out string) (string, error) {
	first, _, _ := strings.Cut(out, "\n")
	v, ok := strings.CutPrefix(strings.TrimSpace(first), "Nomad v")
	v, _, _ = strings.Cut(v, " ")
	if !ok || v == "" {
		return "", fmt.Errorf("no version in %q", first)
	}
	return v, nil
}

// hclSetting matches `key = "value"` in an HCL file: the client keys the
// doctor reads exist in the client block only, so a line scan finds them
// without an HCL parser (a diagnostic, which says where it read them).
var hclSetting = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^\s*(\w+)\s*=\s*"([^"]*)"`) })

// readNomadConfigDir reads the client settings from the agent's
// configuration files in dir (*.hcl and *.json), which Nomad loads in
// lexical order (os.ReadDir's), a later file's value winning; each is JSON
// or HCL by its content, as Nomad reads it (nomadReadsJSON).
func readNomadConfigDir(dir string) (NomadClient, bool) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return NomadClient{}, false
	}
	var s nomadSettings
	var read []string
	keys := map[string]*string{"cni_path": &s.CNIPath, "cni_config_dir": &s.CNIConfigDir, "bridge_network_name": &s.BridgeNetworkName,
		"bridge_network_subnet": &s.BridgeNetworkSubnet, "bridge_network_subnet_ipv6": &s.BridgeNetworkSubnetIPv6}
	for _, e := range entries {
		n := e.Name()
		if !e.Type().IsRegular() || !strings.HasSuffix(n, ".hcl") && !strings.HasSuffix(n, ".json") {
			continue
		}
		b, _, err := statefile.ReadSmall(filepath.Join(dir, n), 1<<20)
		if err != nil {
			continue
		}
		found := false
		if nomadReadsJSON(b) {
			for _, client := range nomadJSONClients(b) {
				for k, v := range client {
					if str, ok := v.(string); ok && keys[k] != nil {
						*keys[k] = str
						found = true
					}
				}
			}
		} else {
			for line := range strings.Lines(string(b)) {
				if m := hclSetting().FindStringSubmatch(line); m != nil && keys[m[1]] != nil {
					*keys[m[1]] = m[2]
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

// nomadReadsJSON tells whether Nomad reads a configuration file as JSON:
// HCL 1 does when the file's first character that is not white space is
// "{" (hcl's lexMode), whatever the file's name.
func nomadReadsJSON(b []byte) bool {
	return strings.HasPrefix(strings.TrimLeftFunc(string(b), unicode.IsSpace), "{")
}

// nomadJSONClients are the client blocks of a configuration file in HCL's
// JSON form, in file order: "client" is an object, or a list of objects
// (HCL 1's JSON parser flattens such a list into one block each,
// json/parser flattenListType, as Nomad's command/agent/testdata/basic.json
// writes it). Nomad decodes each in turn into the one client (its
// ParseConfigFile decodes into a ClientConfig it made), so that a later
// block's setting wins.
func nomadJSONClients(b []byte) []map[string]any {
	var doc struct {
		Client json.RawMessage `json:"client"`
	}
	if json.Unmarshal(b, &doc) != nil || doc.Client == nil {
		return nil
	}
	var one map[string]any
	if json.Unmarshal(doc.Client, &one) == nil {
		return []map[string]any{one}
	}
	var list []map[string]any
	_ = json.Unmarshal(doc.Client, &list)
	return list
}

// nomadBuiltin is the network Nomad's client builds in code for
// `mode = "bridge"`: named "nomad", on the client's bridge and subnets,
// its leases where host-local keeps them: with the plugin installed as
// bridge in front, in the plugin's own dataDir, its default /var/run/cni
// (Nomad's conflist sets none); else in Nomad's ipam.dataDir, which
// depends on its version (nomadTmpfsDataDir): unknown, a recent Nomad's.
func nomadBuiltin(nc NomadClient, front bool) *conflists.Network {
	dataDir := ipamdir.DefaultDataDir
	if has, known := nomadHas(nc.Version, nomadTmpfsDataDir...); !front && known && !has {
		dataDir = ipamdir.DefaultLegacyDataDir
	}
	return &conflists.Network{File: "Nomad's built-in bridge network", Name: nomadBuiltinNetwork, Bridge: nc.BridgeName,
		Subnets: slices.Clone(nc.Subnets), Dir: ipamdir.New(dataDir, nomadBuiltinNetwork)}
}

// nomadHas reports whether Nomad version v has a change, released in the
// versions one of constraints takes (one constraint per release line it
// came to); known is false when v is not a version. A pre-release counts
// as its release, as in nomadStops.
func nomadHas(v string, constraints ...string) (has, known bool) {
	n, err := version.NewVersion(v)
	if err != nil {
		return false, false
	}
	for _, c := range constraints {
		if version.MustConstraints(version.NewConstraint(c)).Check(n.Core()) {
			return true, true
		}
	}
	return false, true
}

// Nomad sends CHECK on restore (a client restart finding an allocation's
// network namespace) from 1.9.5: #24658, v1.9.5
// client/allocrunner/networking_cni.go supportsCNICheck, where v1.9.4's
// client/allocrunner/network_hook.go calls Setup only `if created`;
// backported to 1.8.10 and 1.7.18 Enterprise (CHANGELOG.md, v2.0.5).
var nomadCheckOnRestore = []string{"~> 1.7.18", "~> 1.8.10", ">= 1.9.5"}

// Nomad's built-in bridge network sets host-local's dataDir to
// /var/run/cni from 1.9.4: #24650, v1.9.4 client/allocrunner/cni/bridge.go
// (DataDir), where v1.9.3's sets none, so host-local's own default;
// backported to 1.8.8 and 1.7.16 Enterprise (CHANGELOG.md, v2.0.5).
var nomadTmpfsDataDir = []string{"~> 1.7.16", "~> 1.8.8", ">= 1.9.4"}

// bridgeRecord is what Nomad's fingerprint records for `bridge`
// (attr.plugins.cni.version.bridge): Version, "" for nothing, printed by
// From.
type bridgeRecord struct{ Version, From string }

// nomadRecordedBridge finds what Nomad's fingerprint records for bridge,
// its way: it runs every executable of each cni_path directory in order,
// with no arguments and no CNI_PATH, takes the first token of the output
// that parses as a version, and a later directory's overwrites an earlier
// one's (an output without one records nothing). A directory it cannot
// read or that is empty is logged and passed by Nomad 1.11.2 and later;
// with stops (earlier Nomads) the scan ends there, at stop ("" when it
// read every directory), why says how.
func nomadRecordedBridge(cniPath []string, version func(string) (string, error), stops bool) (rec bridgeRecord, stop, why string) {
	for _, dir := range cniPath {
		entries, err := os.ReadDir(dir)
		if stops && err != nil {
			return rec, dir, fmt.Sprintf("cannot read it: %v", err)
		}
		if stops && len(entries) == 0 {
			return rec, dir, "empty"
		}
		path := filepath.Join(dir, "bridge")
		fi, err := os.Stat(path)
		if err != nil || fi.Mode()&0o111 == 0 {
			continue
		}
		out, err := version(path)
		if v := recordedVersion(out); err == nil && v != "" {
			rec = bridgeRecord{v, path}
		}
	}
	return rec, "", ""
}

// nomadStops reports whether the fingerprint of Nomad version v ends its
// scan of cni_path at an empty or unreadable directory, as every Nomad
// before 1.11.2 does (1.10.x included); known is false when v is not a
// version. A pre-release counts as its release: the change was made
// before 1.11.2 was released.
func nomadStops(v string) (stops, known bool) {
	reads, known := nomadHas(v, ">= 1.11.2")
	return known && !reads, known
}

// describe says what Nomad records for bridge, for a finding.
func (r bridgeRecord) describe() string {
	if r.Version == "" {
		return "no version of bridge"
	}
	return fmt.Sprintf("bridge %s (from %s)", r.Version, r.From)
}

// sendsCheck reports whether Nomad sends CHECK for the version it
// recorded for bridge: only for one that meets its constraint ">= 1.3.0",
// which no pre-release meets (go-version's rule).
func sendsCheck(recorded string) bool {
	v, err := version.NewSemver(recorded)
	return err == nil && version.MustConstraints(version.NewConstraint(">= 1.3.0")).Check(v)
}

// noBridgeGroups says that Nomad places no group of network mode
// "bridge" on the node, for a bridge version placesBridgeGroups refuses.
const noBridgeGroups = `places no group with network mode "bridge" on this node (servers from Nomad 1.8.0 constrain each to attr.plugins.cni.version.bridge semver >= 0.4.0; "cni/" modes are not constrained)`

// placesBridgeGroups reports whether Nomad's servers place a group of
// network mode "bridge" on a node that records bridge version recorded
// ("" none): from 1.8.0 (#15473) they add the constraint
// attr.plugins.cni.version.bridge semver ">= 0.4.0" to every such group
// (v2.0.5 nomad/job_endpoint_hooks.go cniBridgeConstraint, for
// Job.RequiredBridgeNetwork: the mode "bridge" exactly, no "cni/" one),
// which the scheduler checks with go-version's NewVersion and semver 2.0
// order (scheduler/feasible/feasible.go checkVersionMatch,
// helper/constraints/semver), so that a pre-release of 0.4.0 is below it
// and a node recording nothing fails it.
func placesBridgeGroups(recorded string) bool {
	v, err := version.NewVersion(recorded)
	return err == nil && v.Compare(version.Must(version.NewVersion("0.4.0"))) >= 0
}

// checkNomad reports the client settings the doctor used and what Nomad
// records for bridge, which decides whether it sends CHECK, if the
// agent's Nomad sends CHECK on restore at all (nomadCheckOnRestore). A CNI
// path given to the doctor is read in place of the agent's cni_path. When
// the agent's version is unknown, the fingerprint is judged as Nomad
// 1.11.2 and later make it, and the finding says what an older one
// records instead, when that differs, and which Nomads send CHECK.
func checkNomad(o Options, nc NomadClient) []Finding {
	client := fmt.Sprintf("settings from %s: cni_path %s%s, cni_config_dir %s, bridge %s, subnets %s", nc.Source, strings.Join(nc.CNIPath, ":"), nc.cniPathNote(), nc.CNIConfigDir, nc.BridgeName, prefixes(nc.Subnets))
	cniPath, where := nc.CNIPath, "cni_path "+strings.Join(nc.CNIPath, ":")
	if o.CNIPathGiven && !slices.Equal(o.CNIPath, nc.CNIPath) {
		cniPath, where = o.CNIPath, "the CNI path given (--cni-path or CNI_PATH) "+strings.Join(o.CNIPath, ":")
		client += "; the doctor reads " + where + " in place of the agent's cni_path"
	}
	if nc.Version != "" {
		client += fmt.Sprintf("; Nomad %s (from %s)", nc.Version, nc.VersionSource)
	}
	fs := []Finding{{Level: OK, Check: "nomad", Subject: "client", Message: client}}

	unknown := "unknown"
	if nc.VersionSource != "" {
		unknown += ": " + nc.VersionSource
	}
	stops, known := nomadStops(nc.Version)
	// A Nomad before 1.11.2 reads its own default cni_path, the newer
	// one's first directory (setVersion), where cni_path is not set.
	oldPath := cniPath
	if !known && nc.defaulted() && slices.Equal(cniPath, nc.CNIPath) {
		oldPath = cniPath[:1]
	}
	modern, _, _ := nomadRecordedBridge(cniPath, o.Version, false)
	old, stop, why := nomadRecordedBridge(oldPath, o.Version, true)
	rec, note, stopFix := modern, "", ""
	switch {
	case known && stops && stop != "":
		rec = old
		note = fmt.Sprintf("; Nomad %s, as every Nomad before 1.11.2, reads no further than %s (%s)", nc.Version, stop, why)
		if old != modern && sendsCheck(modern.Version) {
			stopFix = fmt.Sprintf("take %s out of cni_path (or fill it, or make it readable), or upgrade Nomad to 1.11.2 or later, which reads on and records %s", stop, modern.describe())
		}
	case !known && old != modern:
		reads := fmt.Sprintf("reads no further than %s (%s)", stop, why)
		if stop == "" {
			reads = fmt.Sprintf("reads only %s (its default cni_path)", strings.Join(oldPath, ":"))
		}
		note = fmt.Sprintf("; judged as Nomad 1.11.2 and later read cni_path (the agent's version is %s): an older Nomad %s, and records %s instead", unknown, reads, old.describe())
		switch {
		case sendsCheck(old.Version) && !sendsCheck(modern.Version):
			note += ", and sends CHECK from 1.9.5 (1.8.10 and 1.7.18 Enterprise)"
		case !sendsCheck(old.Version) && sendsCheck(modern.Version):
			note += ", and never sends CHECK"
		}
		unknown = "unknown" // the note says why
	}
	checks, _ := nomadHas(nc.Version, nomadCheckOnRestore...)
	sends := "it sends CHECK on restore"
	if !known {
		sends += " if the agent is Nomad 1.9.5 or later (1.8.10 and 1.7.18 Enterprise): earlier ones never send it (the agent's version is " + unknown + ")"
	}
	var f Finding
	switch {
	case rec.Version == "":
		f = Finding{Level: Warn, Check: "nomad", Subject: "bridge", Message: fmt.Sprintf("Nomad records no version of bridge from %s: it never sends CHECK (no CHECK-time sweep), and %s%s", where, noBridgeGroups, note), Fix: cmp.Or(stopFix, fmt.Sprintf("install the reference CNI plugins, stamped with their version (make plugins), into a directory of %s", where))}
	case !sendsCheck(rec.Version):
		why := "below 1.3.0"
		if v := version.Must(version.NewSemver(rec.Version)); v.Prerelease() != "" && !v.Core().LessThan(version.Must(version.NewVersion("1.3.0"))) {
			why = "a pre-release, which Nomad's \">= 1.3.0\" never takes, so"
		}
		placed := ""
		if !placesBridgeGroups(rec.Version) {
			placed = ", and " + noBridgeGroups
		}
		f = Finding{Level: Warn, Check: "nomad", Subject: "bridge", Message: fmt.Sprintf("Nomad records bridge %s (from %s, the last bridge of %s that prints a version): %s it never sends CHECK (no CHECK-time sweep)%s%s", rec.Version, rec.From, where, why, placed, note), Fix: cmp.Or(stopFix, fmt.Sprintf("replace %s with the reference plugins, stamped with their version (make plugins)", rec.From))}
	default:
		f = Finding{Level: OK, Check: "nomad", Subject: "bridge", Message: fmt.Sprintf("Nomad records bridge %s (from %s, the last bridge of %s that prints a version): %s%s", rec.Version, rec.From, where, sends, note)}
	}
	// Whatever bridge records, a Nomad without CHECK on restore never
	// sends it.
	if known && !checks {
		recorded := rec.describe()
		if rec.Version == "" {
			recorded += " from " + where
		}
		if !placesBridgeGroups(rec.Version) {
			recorded += ", with which Nomad " + noBridgeGroups
		}
		fix := "upgrade Nomad to 1.9.5 or later"
		if f.Fix != "" {
			fix += "; then " + f.Fix
		}
		f = Finding{Level: Warn, Check: "nomad", Subject: "bridge", Message: fmt.Sprintf("Nomad %s never sends CHECK on restore (no CHECK-time sweep), whatever it records for bridge, here %s: Nomad sends it from 1.9.5 (1.8.10 and 1.7.18 Enterprise)%s", nc.Version, recorded, note), Fix: fix}
	}
	return append(fs, f)
}

// checkBelowCheck flags, for a Nomad that sends CHECK on restore, the
// plugin's networks in its cni_config_dir below cniVersion 0.4.0: libcni
// refuses CHECK there (CheckNetworkList), Nomad takes that for a failed
// CHECK (v2.0.5 networking_cni.go Setup) and re-creates the namespace and
// re-ADDs while the tasks stay in the old one, an ADD that is refused. An
// agent of unknown version may be one that never sends CHECK.
func checkBelowCheck(o Options, ours []*conflists.Network) []Finding {
	level := Warn
	if _, known := nomadStops(o.nomad.Version); known {
		level = Error
	}
	var fs []Finding
	for _, n := range ours {
		below, err := cniversion.GreaterThan("0.4.0", n.Conf.CNIVersion)
		if err == nil && below && filepath.Dir(n.File) == filepath.Clean(o.nomad.CNIConfigDir) {
			fs = append(fs, Finding{Level: level, Check: "conflist", Subject: n.File, Message: fmt.Sprintf("network %q is at cniVersion %s: libcni refuses CHECK below 0.4.0, which Nomad takes for a failed CHECK on restore; it then re-ADDs in a new namespace while the tasks stay in the old one, so each agent restart reschedules the network's allocations", n.Name, n.Conf.CNIVersion),
				Fix: `set its "cniVersion" to "1.0.0"`})
		}
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
