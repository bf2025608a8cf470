package netconf

import (
	"encoding/json"
	"fmt"
	"maps"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
)

// DelegateConfig is the entry the delegate receives: ours, minus the
// wrapper's own keys, with type set to the delegate and ipam.dataDir set to
// our DataDir. Keys we do not model (prevResult, runtimeConfig, args,
// capabilities, hairpinMode, vlan, dns, ...) are copied byte for byte.
func (c *Config) DelegateConfig() ([]byte, error) {
	return c.DelegateConfigWithDataDir(c.DataDir)
}

// DelegateConfigWithDataDir is DelegateConfig with host-local's dataDir set
// to dir: a verb that must not have host-local read the network's own
// directory gives it an empty one. Its error is the verbs' *types.Error.
func (c *Config) DelegateConfigWithDataDir(dir string) ([]byte, error) {
	conf, err := c.render(c.Delegate, dir, nil)
	if err != nil {
		return nil, types.NewError(types.ErrInternal, "failed to render the delegate configuration", err.Error())
	}
	return conf, nil
}

// GCConfigs are the entries a GC forwards to the delegate and to
// host-local, each listing valid (what the plugin's own sweep kept) as
// "cni.dev/valid-attachments", the one key host-local reads: forwarded as
// the runtime spelled it ("cni.dev/attachments", say), host-local would
// find no list and release every lease. host-local gets its own (see
// plugin's gc); GC only exists from spec 1.1.0.
func (c *Config) GCConfigs(valid []types.GCAttachment) (delegate, hostLocal []byte, err error) {
	if delegate, err = c.renderGC(c.Delegate, "", valid); err != nil {
		return nil, nil, err
	}
	hostLocal, err = c.renderGC(HostLocal, "1.1.0", valid)
	return delegate, hostLocal, err
}

func (c *Config) renderGC(pluginType, cniVersion string, valid []types.GCAttachment) ([]byte, error) {
	if valid == nil {
		valid = []types.GCAttachment{}
	}
	return c.render(pluginType, c.DataDir, func(out map[string]json.RawMessage) error {
		maps.DeleteFunc(out, func(k string, _ json.RawMessage) bool {
			return strings.EqualFold(k, keyValidAttachments) || strings.EqualFold(k, keyAttachments)
		})
		if cniVersion != "" {
			if err := setJSON(out, "cniVersion", cniVersion); err != nil {
				return err
			}
		}
		return setJSON(out, keyValidAttachments, valid)
	})
}

// render is the entry pluginType receives, as DelegateConfig describes it,
// with host-local's dataDir set to dataDir, and then edit's changes.
func (c *Config) render(pluginType, dataDir string, edit func(map[string]json.RawMessage) error) ([]byte, error) {
	out := maps.Clone(c.raw)
	for _, own := range []string{keyDelegate, keyDataDir, keyDelegateTimeout, keyCheckSweepInterval, keyLogFile, keyLogLevel} {
		delete(out, own)
	}
	ipam := maps.Clone(c.ipam)
	// Parse allowed one spelling; host-local must read ours only.
	maps.DeleteFunc(ipam, func(k string, _ json.RawMessage) bool { return strings.EqualFold(k, keyDataDir) })
	if err := setJSON(ipam, keyDataDir, dataDir); err != nil {
		return nil, err
	}
	if err := setJSON(out, keyIPAM, ipam); err != nil {
		return nil, err
	}
	if err := setJSON(out, keyType, pluginType); err != nil {
		return nil, err
	}
	if edit != nil {
		if err := edit(out); err != nil {
			return nil, err
		}
	}
	b, err := json.Marshal(out)
	if err != nil {
		return nil, fmt.Errorf("encode configuration for %s: %w", pluginType, err)
	}
	return b, nil
}

func setJSON(m map[string]json.RawMessage, key string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %q: %w", key, err)
	}
	m[key] = b
	return nil
}

// DelegateConfigRequesting is DelegateConfig asking host-local for ips
// (addresses without prefix) through args.cni.ips, the convention
// host-local reads (as it reads CNI_ARGS IP= and runtimeConfig.ips).
// ok is false, and nothing is asked, when the entry already asks for
// addresses itself or its args are not an object: the runtime's or the
// user's request wins.
func (c *Config) DelegateConfigRequesting(ips []string) (conf []byte, ok bool, err error) {
	if len(ips) == 0 || c.requestsIPs() {
		return nil, false, nil
	}
	args := map[string]json.RawMessage{}
	if raw, found := c.raw["args"]; found && !isNull(raw) {
		if err := json.Unmarshal(raw, &args); err != nil || args == nil {
			return nil, false, nil
		}
	}
	cni := map[string]json.RawMessage{}
	if raw, found := args["cni"]; found && !isNull(raw) {
		if err := json.Unmarshal(raw, &cni); err != nil || cni == nil {
			return nil, false, nil
		}
	}
	if err := setJSON(cni, "ips", ips); err != nil {
		return nil, false, err
	}
	if err := setJSON(args, "cni", cni); err != nil {
		return nil, false, err
	}
	conf, err = c.render(c.Delegate, c.DataDir, func(out map[string]json.RawMessage) error {
		return setJSON(out, "args", args)
	})
	return conf, err == nil, err
}

// requestsIPs reports whether the entry asks for addresses itself:
// args.cni.ips or runtimeConfig.ips (the "ips" capability), non-empty.
func (c *Config) requestsIPs() bool {
	asks := func(raw json.RawMessage, path ...string) bool {
		for _, key := range path {
			var m map[string]json.RawMessage
			if json.Unmarshal(raw, &m) != nil {
				return false
			}
			if raw = m[key]; raw == nil {
				return false
			}
		}
		var ips []json.RawMessage
		return json.Unmarshal(raw, &ips) != nil || len(ips) > 0
	}
	return asks(c.raw["args"], "cni", "ips") || asks(c.raw["runtimeConfig"], "ips")
}
