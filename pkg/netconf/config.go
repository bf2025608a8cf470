// Package netconf parses a nomad-bridge-cni conflist entry and rewrites it,
// losslessly, into the entry its delegate (bridge) expects: host-local's
// dataDir pointed at a directory that dies with the boot. Where that
// directory's files go is pkg/ipamdir's.
package netconf

import (
	"cmp"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/utils"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/eventlog"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
)

// SupportedVersions are the CNI spec versions the wrapper speaks. It passes
// the entry through to bridge, which speaks them all; 0.3.0 is the oldest
// whose result carries interfaces, which later plugins in a chain need.
var SupportedVersions = version.PluginSupports("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")

// CheckVersion refuses a cniVersion as every verb refuses it before the
// entry is read (pkg/skel): empty (skel would read it as 0.1.0 and report
// that version as the problem), or one the plugin does not speak. libcni
// gives every entry the list's version, "" when the list has none.
func CheckVersion(v string) *types.Error {
	supported := SupportedVersions.SupportedVersions()
	switch {
	case v == "":
		return types.NewError(types.ErrIncompatibleCNIVersion, fmt.Sprintf("\"cniVersion\" is empty: set it to one of %q", supported), "")
	case !slices.Contains(supported, v):
		return types.NewError(types.ErrIncompatibleCNIVersion, "incompatible CNI versions", fmt.Sprintf("config is %q, plugin supports %q", v, supported))
	}
	return nil
}

// MaxConfigSize caps the entry the plugin reads from stdin. A conflist
// entry with its prevResult is a few KiB; the cap keeps a runaway writer
// from making a root process read without bound. doctor applies it too.
const MaxConfigSize = 1 << 20

const (
	// DefaultDelegate is the plugin the wrapper hands the rewritten entry to.
	DefaultDelegate = "bridge"
	// HostLocal is the only IPAM this plugin manages.
	HostLocal = "host-local"
	// DefaultDelegateTimeout bounds one delegate call. bridge answers in
	// milliseconds; minutes means it hangs, and the runtime would rather
	// have an error it can act on than a plugin that never returns.
	DefaultDelegateTimeout = 2 * time.Minute
	// maxDelegateTimeout keeps a typo ("100h") from disabling the bound,
	// and minDelegateTimeout one ("1ns") from failing every call: bridge
	// with host-local and iptables needs tens of milliseconds.
	maxDelegateTimeout = time.Hour
	// maxNetworkName is NAME_MAX: the network names directories.
	maxNetworkName     = 255
	minDelegateTimeout = time.Second
	// DefaultCheckSweepInterval: a CHECK sweeps its network only if no
	// sweep of it ended within this long (why: see plugin's check).
	DefaultCheckSweepInterval = 10 * time.Second
	maxCheckSweepInterval     = 24 * time.Hour

	keyDelegate           = "delegate"
	keyDataDir            = "dataDir"
	keyDelegateTimeout    = "delegateTimeout"
	keyCheckSweepInterval = "checkSweepInterval"
	keyLogFile            = "logFile"
	keyLogLevel           = "logLevel"
	keyType               = "type"
	keyIPAM               = "ipam"
	keyValidAttachments   = "cni.dev/valid-attachments"
	// keyAttachments is the GC list's name in the spec's first drafts.
	keyAttachments = "cni.dev/attachments"
)

// Config is one validated conflist entry. Only the keys the wrapper acts on
// are modelled; everything else stays in raw and reaches the delegate as
// it came.
type Config struct {
	Name       string
	CNIVersion string
	// Type is the name this entry invoked us by (normally "nomad-bridge-cni").
	Type string
	// Delegate is the plugin binary looked up in CNI_PATH.
	Delegate string
	// DataDir holds host-local's leases (<DataDir>/<Name>/) and our records.
	DataDir string
	// LegacyDataDir is where host-local kept leases before the rewrite: the
	// user's own ipam.dataDir, or host-local's default.
	LegacyDataDir string
	// DelegateTimeout bounds each call of a delegate.
	DelegateTimeout time.Duration
	// CheckSweepInterval is how long after a sweep of the network a CHECK
	// skips its own; 0 sweeps on every CHECK.
	CheckSweepInterval time.Duration
	// LogFile, when set, is the file the verb writes its events to, one
	// JSON line each, at LogLevel (pkg/eventlog).
	LogFile  string
	LogLevel eventlog.Level
	// Passthrough marks an entry the plugin does not manage: installed
	// under its delegate's name, it receives every entry of that type,
	// also those with another IPAM (dhcp, static). Every verb hands it to
	// the delegate unchanged, and nothing else is done.
	// Only Name, CNIVersion, Type, Delegate and DelegateTimeout are set.
	Passthrough bool

	raw  map[string]json.RawMessage
	ipam map[string]json.RawMessage
}

// Dir is the entry's network under its data directory.
func (c *Config) Dir() ipamdir.Dir { return ipamdir.New(c.DataDir, c.Name) }

// Parse decodes and validates a conflist entry. Every error is a
// *types.Error carrying the CNI code the runtime should see; nothing on
// disk is changed.
func Parse(stdin []byte) (*Config, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(stdin, &raw); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "failed to decode network configuration", err.Error())
	}
	if raw == nil {
		return nil, types.NewError(types.ErrDecodingFailure, "failed to decode network configuration", "configuration is not a JSON object")
	}
	c := &Config{raw: raw}

	var err error
	if c.Name, err = stringKey(raw, "name", ""); err != nil {
		return nil, err
	}
	if e := utils.ValidateNetworkName(c.Name); e != nil {
		return nil, e
	}
	if len(c.Name) > maxNetworkName {
		return nil, invalidConfig(fmt.Sprintf("network name is %d bytes long, more than the %d a directory name may have (host-local's directory and the records are named by it)", len(c.Name), maxNetworkName))
	}
	if c.CNIVersion, err = stringKey(raw, "cniVersion", ""); err != nil {
		return nil, err
	}
	if c.Type, err = stringKey(raw, keyType, ""); err != nil {
		return nil, err
	}
	if c.Delegate, err = stringKey(raw, keyDelegate, DefaultDelegate); err != nil {
		return nil, err
	}
	if err := validateDelegate(c.Delegate); err != nil {
		return nil, err
	}
	if c.DelegateTimeout, err = durationKey(raw, keyDelegateTimeout, DefaultDelegateTimeout, minDelegateTimeout, maxDelegateTimeout, "90s"); err != nil {
		return nil, err
	}
	if c.Type == c.Delegate && !managesIPAM(raw) {
		c.Passthrough = true
		return c, nil
	}
	if c.DataDir, err = stringKey(raw, keyDataDir, ipamdir.DefaultDataDir); err != nil {
		return nil, err
	}
	if c.DataDir, err = cleanDir(keyDataDir, c.DataDir); err != nil {
		return nil, err
	}
	if c.CheckSweepInterval, err = durationKey(raw, keyCheckSweepInterval, DefaultCheckSweepInterval, 0, maxCheckSweepInterval, "10s"); err != nil {
		return nil, err
	}
	if err := c.parseLog(raw); err != nil {
		return nil, err
	}

	ipamRaw, ok := raw[keyIPAM]
	if !ok || isNull(ipamRaw) {
		return nil, invalidConfig(`missing "ipam": nomad-bridge-cni manages host-local leases and needs an "ipam" of type "host-local"`)
	}
	if err := json.Unmarshal(ipamRaw, &c.ipam); err != nil || c.ipam == nil {
		return nil, invalidConfig(`"ipam" must be a JSON object`)
	}
	ipamType, err := stringKey(c.ipam, keyType, "")
	if err != nil {
		return nil, invalidConfig(`"ipam.type" must be a string`)
	}
	if ipamType != HostLocal {
		return nil, invalidConfig(fmt.Sprintf(`"ipam.type" is %q: nomad-bridge-cni only manages "host-local"`, ipamType))
	}
	// The delegate reads "IPAM" as "ipam": a second spelling would be
	// read in place of, or over, the one the plugin reads.
	if _, err := foldedKey(raw, keyIPAM); err != nil {
		return nil, err
	}
	legacyKey, err := foldedKey(c.ipam, keyDataDir)
	if err != nil {
		return nil, err
	}
	if c.LegacyDataDir, err = stringKey(c.ipam, legacyKey, ""); err != nil {
		return nil, invalidConfig(`"ipam.dataDir" must be a string`)
	}
	// Absent or empty, host-local's own default (backend/disk.New).
	c.LegacyDataDir = cmp.Or(c.LegacyDataDir, ipamdir.DefaultLegacyDataDir)
	// The legacy directory is read and pruned by the migration: it gets
	// the same checks as our own.
	if c.LegacyDataDir, err = cleanDir("ipam.dataDir", c.LegacyDataDir); err != nil {
		return nil, err
	}
	if sameDir(c.LegacyDataDir, c.DataDir) {
		// The dataDir under another name (Nomad's "/var/run/cni" with a
		// dataDir of "/run/cni"): nothing to migrate, and its lock is ours.
		c.LegacyDataDir = c.DataDir
	}
	if err := checkPrevResult(raw, c.CNIVersion); err != nil {
		return nil, err
	}
	return c, nil
}

// host-local and bridge decode with encoding/json, which takes a key in
// any case ("datadir", "DATADIR") for a field and lets the last one in the
// object win. So the plugin reads, and rewrites, every spelling of a key
// it acts on: one it missed would put leases wherever it points.

// foldedKey is the one spelling of key that m uses (key itself when m has
// none); two spellings are refused: which one host-local reads depends on
// their order, which the rewrite does not keep.
func foldedKey(m map[string]json.RawMessage, key string) (string, error) {
	found := ""
	for k := range m {
		if !strings.EqualFold(k, key) {
			continue
		}
		if found != "" {
			return "", invalidConfig(fmt.Sprintf("%q and %q are both set: host-local reads keys in any case, so they name one setting; keep one", found, k))
		}
		found = k
	}
	if found == "" {
		return key, nil
	}
	return found, nil
}

// parseLog reads "logFile" and "logLevel": off unless logFile is set, a
// logLevel alone is a mistake to report, not to ignore.
func (c *Config) parseLog(raw map[string]json.RawMessage) error {
	var err error
	if c.LogFile, err = stringKey(raw, keyLogFile, ""); err != nil {
		return err
	}
	level, err := stringKey(raw, keyLogLevel, "")
	if err != nil {
		return err
	}
	if c.LogFile == "" {
		if level != "" {
			return invalidConfig(`"logLevel" is set without a "logFile" to write to`)
		}
		return nil
	}
	file, err := cleanDir(keyLogFile, c.LogFile)
	if err != nil {
		return err
	}
	if strings.HasSuffix(c.LogFile, "/") {
		return invalidConfig(fmt.Sprintf("%q %q names a directory, not a file", keyLogFile, c.LogFile))
	}
	c.LogFile = file
	if c.LogLevel, err = eventlog.ParseLevel(level); err != nil {
		return invalidConfig(fmt.Sprintf("%q: %v", keyLogLevel, err))
	}
	return nil
}

// checkPrevResult makes sure a prevResult parses as a result of the
// entry's version before anything is done with it, as every plugin of the
// chain will (CHECK relies on it; bridge would fail half-way).
func checkPrevResult(raw map[string]json.RawMessage, cniVersion string) error {
	prev, ok := raw["prevResult"]
	if !ok || isNull(prev) {
		return nil
	}
	conf := &types.PluginConf{CNIVersion: cniVersion}
	if err := json.Unmarshal(prev, &conf.RawPrevResult); err != nil || conf.RawPrevResult == nil {
		return types.NewError(types.ErrDecodingFailure, `"prevResult" must be a JSON object`, "")
	}
	if err := version.ParsePrevResult(conf); err != nil {
		return types.NewError(types.ErrDecodingFailure, `"prevResult" is not a result of this cniVersion`, err.Error())
	}
	return nil
}

// stringKey reads an optional string key, falling back to def when the key
// is absent or null.
func stringKey(m map[string]json.RawMessage, key, def string) (string, error) {
	v, ok := m[key]
	if !ok || isNull(v) {
		return def, nil
	}
	var s string
	if err := json.Unmarshal(v, &s); err != nil {
		return "", invalidConfig(fmt.Sprintf("%q must be a string", key))
	}
	return s, nil
}

// durationKey reads an optional Go duration string ("90s", "2m") between
// min and max; example is the one the error message gives.
func durationKey(m map[string]json.RawMessage, key string, def, min, max time.Duration, example string) (time.Duration, error) {
	text, err := stringKey(m, key, "")
	if err != nil || text == "" {
		return def, err
	}
	d, err := time.ParseDuration(text)
	if err != nil || d < min || d > max {
		return 0, invalidConfig(fmt.Sprintf("%q %q must be a duration between %s and %s, such as %q", key, text, min, max, example))
	}
	return d, nil
}

func isNull(v json.RawMessage) bool {
	return strings.TrimSpace(string(v)) == "null"
}

// managesIPAM reports whether the entry's IPAM is host-local, the one
// this plugin exists to manage.
func managesIPAM(raw map[string]json.RawMessage) bool {
	var ipam struct {
		Type string `json:"type"`
	}
	return raw[keyIPAM] != nil && json.Unmarshal(raw[keyIPAM], &ipam) == nil && ipam.Type == HostLocal
}

// validateDelegate keeps the delegate a bare plugin name: CNI_PATH lookup
// is the only way a binary gets chosen. A delegate of the plugin's own
// type is how it runs installed under the delegate's name; the lookup
// skips its own executable (plugin.FindDelegate), so naming only itself is
// caught there.
func validateDelegate(delegate string) error {
	switch {
	case delegate == "":
		return invalidConfig(`"delegate" must not be empty`)
	case strings.ContainsAny(delegate, `/\`) || delegate == "." || delegate == "..":
		return invalidConfig(fmt.Sprintf(`"delegate" %q must be a plugin name looked up in CNI_PATH, not a path`, delegate))
	case strings.ContainsRune(delegate, 0):
		return invalidConfig(`"delegate" contains a NUL byte`)
	}
	return nil
}

// cleanDir is dir, cleaned, if it is absolute and has no "..": a relative
// path would resolve against whatever directory the runtime happens to exec
// us in, and ".." could climb out of the directory the operator chose.
func cleanDir(key, dir string) (string, error) {
	switch {
	case dir == "":
		return "", invalidConfig(fmt.Sprintf("%q must not be empty", key))
	case !filepath.IsAbs(dir):
		return "", invalidConfig(fmt.Sprintf("%q %q must be an absolute path", key, dir))
	case strings.ContainsRune(dir, 0):
		return "", invalidConfig(fmt.Sprintf("%q contains a NUL byte", key))
	}
	for _, part := range strings.Split(dir, "/") {
		switch part {
		case "..":
			return "", invalidConfig(fmt.Sprintf("%q %q must not contain \"..\"", key, dir))
		case ipamdir.RecordDirName:
			// host-local's GC there deletes what it takes for stale
			// leases: the records and markers of the plugin's networks.
			return "", invalidConfig(fmt.Sprintf("%q %q is inside the plugin's record directory %s: give the data dir itself", key, dir, ipamdir.RecordDirName))
		}
	}
	return filepath.Clean(dir), nil
}

// sameDir reports whether a and b name one existing directory.
func sameDir(a, b string) bool {
	ai, err := os.Stat(a)
	if err != nil {
		return false
	}
	bi, err := os.Stat(b)
	return err == nil && os.SameFile(ai, bi)
}

func invalidConfig(msg string) *types.Error {
	return types.NewError(types.ErrInvalidNetworkConfig, msg, "")
}

// LostPrevResult reports whether the entry came without the prevResult a
// runtime sends on DEL from CNI 0.4.0 on (libcni's cached result of the
// ADD): the runtime could not read its cache (killed while it wrote it,
// say), and the chain's other plugins got none either.
func (c *Config) LostPrevResult() bool {
	prev, ok := c.raw["prevResult"]
	sends, err := version.GreaterThanOrEqualTo(c.CNIVersion, "0.4.0")
	return err == nil && sends && (!ok || isNull(prev))
}

// ValidAttachments reads the GC verb's list of attachments to keep:
// "cni.dev/valid-attachments", or "cni.dev/attachments" as the spec first
// misnamed it. It is parsed from the raw entry because types.NetConf's
// omitempty cannot tell an absent list from an empty one; both mean that
// no attachment is valid, as host-local reads it.
func (c *Config) ValidAttachments() ([]types.GCAttachment, error) {
	for _, key := range []string{keyValidAttachments, keyAttachments} {
		raw, ok := c.raw[key]
		if !ok || isNull(raw) {
			continue
		}
		var list []types.GCAttachment
		if err := json.Unmarshal(raw, &list); err != nil {
			return nil, invalidConfig(fmt.Sprintf("%q must be a list of {\"containerID\", \"ifname\"}: %v", key, err))
		}
		for i, a := range list {
			if e := utils.ValidateContainerID(a.ContainerID); e != nil {
				return nil, invalidConfig(fmt.Sprintf("%q entry %d: %s", key, i, e.Error()))
			}
			// host-local's GC keeps only the leases of the listed
			// container ID *and* ifname: an entry without one would
			// release the container it names.
			if e := utils.ValidateInterfaceName(a.IfName); e != nil {
				return nil, invalidConfig(fmt.Sprintf("%q entry %d (containerID %q): %s", key, i, a.ContainerID, e.Error()))
			}
		}
		return list, nil
	}
	return nil, nil
}
