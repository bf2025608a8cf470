package netconf

import (
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
)

// FuzzParseAndRewrite: whatever the input, Parse either returns a CNI error
// or a config whose rewrite is a JSON object that keeps every key but ours,
// points ipam.dataDir at an absolute, clean dataDir, and names a delegate
// that is a bare plugin name. An entry passed through (the plugin installed
// under its delegate's name, an IPAM other than host-local) is not
// rewritten: its delegate is its own type, a bare plugin name.
func FuzzParseAndRewrite(f *testing.F) {
	f.Add([]byte(bridgeEntry))
	f.Add([]byte(`{"cniVersion":"0.4.0","name":"n","type":"nomad-bridge-cni","ipam":{"type":"host-local","subnet":"10.0.0.0/24"}}`))
	f.Add([]byte(`{"name":"n","dataDir":"/run/../etc","ipam":{"type":"host-local"}}`))
	f.Add([]byte(`{"name":"n","delegate":"../x","ipam":{"type":"host-local"}}`))
	f.Add([]byte(`{"name":"a\u0000b","ipam":{"type":"host-local"}}`))
	f.Add([]byte(`{"name":"n","ipam":{"type":"host-local"},"cni.dev/valid-attachments":[{"containerID":"a","ifname":"eth0"},5]}`))
	f.Add([]byte(`[]`))
	f.Add([]byte(`null`))
	f.Add([]byte(`{"name":"n","ipam":null}`))
	f.Add([]byte(`{"name":"n","type":"bridge"}`))
	f.Add([]byte(`{"name":"n","type":"bridge","ipam":{"type":"host-local"}}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		conf, err := Parse(in)
		if err != nil {
			var cniErr *types.Error
			if !errors.As(err, &cniErr) || cniErr.Code == 0 {
				t.Fatalf("Parse error is not a coded CNI error: %v", err)
			}
			return
		}
		if conf.Delegate == "" || strings.ContainsAny(conf.Delegate, `/\`) {
			t.Fatalf("accepted delegate %q", conf.Delegate)
		}
		if strings.ContainsAny(conf.Name, "/\x00\n") || strings.HasPrefix(conf.Name, ".") {
			t.Fatalf("accepted network name %q", conf.Name)
		}
		if conf.Passthrough {
			if conf.Delegate != conf.Type {
				t.Fatalf("passed through to %q an entry of type %q", conf.Delegate, conf.Type)
			}
			return
		}
		if !filepath.IsAbs(conf.DataDir) || filepath.Clean(conf.DataDir) != conf.DataDir || strings.Contains(conf.DataDir, "..") {
			t.Fatalf("accepted dataDir %q", conf.DataDir)
		}
		out, err := conf.DelegateConfig()
		if err != nil {
			t.Fatalf("DelegateConfig: %v", err)
		}
		var rewritten map[string]json.RawMessage
		if err := json.Unmarshal(out, &rewritten); err != nil {
			t.Fatalf("rewrite is not a JSON object: %v", err)
		}
		if _, ok := rewritten["delegate"]; ok {
			t.Fatal("delegate key leaked")
		}
		var ipam struct {
			DataDir string `json:"dataDir"`
		}
		if err := json.Unmarshal(rewritten["ipam"], &ipam); err != nil || ipam.DataDir != conf.DataDir {
			t.Fatalf("ipam.dataDir = %q (%v), want %q", ipam.DataDir, err, conf.DataDir)
		}
		if _, err := conf.ValidAttachments(); err != nil {
			var cniErr *types.Error
			if !errors.As(err, &cniErr) {
				t.Fatalf("ValidAttachments error is not a CNI error: %v", err)
			}
		}
	})
}
