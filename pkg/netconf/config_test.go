package netconf

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/plugins/ipam/host-local/backend/allocator"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/eventlog"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
)

// bridgeEntry carries every key bridge v1.10.0 reads, plus keys that only
// later plugins or the runtime care about, so the rewrite is checked
// against the full surface a user may put in a conflist.
const bridgeEntry = `{
  "cniVersion": "1.0.0",
  "name": "nomad",
  "type": "nomad-bridge-cni",
  "delegate": "bridge",
  "dataDir": "/run/nbc",
  "delegateTimeout": "90s",
  "bridge": "nomad",
  "isGateway": true,
  "isDefaultGateway": false,
  "forceAddress": true,
  "ipMasq": true,
  "ipMasqBackend": "iptables",
  "mtu": 1450,
  "hairpinMode": true,
  "promiscMode": false,
  "vlan": 0,
  "vlanTrunk": [{"minID": 10, "maxID": 20}],
  "preserveDefaultVlan": true,
  "macspoofchk": true,
  "enabledad": false,
  "disableContainerInterface": false,
  "portIsolation": false,
  "Documentation": "kept verbatim",
  "capabilities": {"portMappings": true, "ips": true, "io.kubernetes.cri.pod-annotations": true},
  "runtimeConfig": {"mac": "00:11:22:33:44:55", "portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]},
  "args": {"cni": {"mac": "00:11:22:33:44:55"}},
  "dns": {"nameservers": ["10.0.0.53"], "search": ["svc"]},
  "prevResult": {"cniVersion": "1.0.0", "interfaces": [{"name": "lo", "sandbox": "/var/run/netns/x"}], "ips": [{"address": "127.0.0.1/8", "interface": 0}]},
  "cni.dev/valid-attachments": [{"containerID": "a", "ifname": "eth0"}],
  "big": 123456789012345678901234567890,
  "ipam": {
    "type": "host-local",
    "dataDir": "/var/lib/old",
    "ranges": [[{"subnet": "172.26.64.0/20", "rangeStart": "172.26.64.10", "gateway": "172.26.64.1"}], [{"subnet": "fd00::/64"}]],
    "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0", "gw": "fd00::1"}],
    "resolvConf": "/etc/resolv.conf",
    "unknownIpamKey": {"nested": [1, 2.5, "x", null]}
  }
}`

func TestDelegateConfigIsLossless(t *testing.T) {
	conf, err := Parse([]byte(bridgeEntry))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	out, err := conf.DelegateConfig()
	if err != nil {
		t.Fatalf("DelegateConfig: %v", err)
	}

	var in, got map[string]json.RawMessage
	mustUnmarshal(t, []byte(bridgeEntry), &in)
	mustUnmarshal(t, out, &got)

	for _, key := range []string{"delegate", "dataDir", "delegateTimeout"} {
		if _, ok := got[key]; ok {
			t.Errorf("delegate config still carries the wrapper's key %q", key)
		}
	}
	if string(got["type"]) != `"bridge"` {
		t.Errorf("type = %s, want \"bridge\"", got["type"])
	}
	// Every other top-level key must arrive byte-for-byte (after compaction:
	// the values are re-emitted by encoding/json, whitespace aside).
	for key, want := range in {
		switch key {
		case "delegate", "dataDir", "delegateTimeout", "type", "ipam":
			continue
		}
		if g, ok := got[key]; !ok {
			t.Errorf("key %q lost in the rewrite", key)
		} else if compact(t, g) != compact(t, want) {
			t.Errorf("key %q changed: got %s, want %s", key, compact(t, g), compact(t, want))
		}
	}
	if len(got) != len(in)-3 {
		t.Errorf("delegate config has %d keys, want %d (input minus delegate, dataDir, delegateTimeout)", len(got), len(in)-3)
	}

	var inIPAM, gotIPAM map[string]json.RawMessage
	mustUnmarshal(t, in["ipam"], &inIPAM)
	mustUnmarshal(t, got["ipam"], &gotIPAM)
	if string(gotIPAM["dataDir"]) != `"/run/nbc"` {
		t.Errorf("ipam.dataDir = %s, want \"/run/nbc\"", gotIPAM["dataDir"])
	}
	for key, want := range inIPAM {
		if key == "dataDir" {
			continue
		}
		if compact(t, gotIPAM[key]) != compact(t, want) {
			t.Errorf("ipam key %q changed: got %s, want %s", key, gotIPAM[key], want)
		}
	}
	if len(gotIPAM) != len(inIPAM) {
		t.Errorf("ipam has %d keys, want %d", len(gotIPAM), len(inIPAM))
	}
}

func TestParseReadsWrapperKeys(t *testing.T) {
	conf, err := Parse([]byte(bridgeEntry))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	want := Config{Name: "nomad", CNIVersion: "1.0.0", Type: "nomad-bridge-cni", Delegate: "bridge", DataDir: "/run/nbc", LegacyDataDir: "/var/lib/old"}
	got := Config{Name: conf.Name, CNIVersion: conf.CNIVersion, Type: conf.Type, Delegate: conf.Delegate, DataDir: conf.DataDir, LegacyDataDir: conf.LegacyDataDir}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Parse = %+v, want %+v", got, want)
	}
	if conf.Dir().Leases() != "/run/nbc/nomad" {
		t.Errorf("Dir().Leases() = %q", conf.Dir().Leases())
	}
}

func TestParseDefaults(t *testing.T) {
	conf, err := Parse([]byte(`{"cniVersion":"0.4.0","name":"n","type":"nomad-bridge-cni","ipam":{"type":"host-local","subnet":"10.0.0.0/24"}}`))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if conf.Delegate != "bridge" || conf.DataDir != "/var/run/cni" || conf.LegacyDataDir != "/var/lib/cni/networks" || conf.DelegateTimeout != DefaultDelegateTimeout || conf.CheckSweepInterval != 10*time.Second {
		t.Errorf("defaults: delegate=%q dataDir=%q legacy=%q", conf.Delegate, conf.DataDir, conf.LegacyDataDir)
	}
	out, err := conf.DelegateConfig()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), `"dataDir":"/var/run/cni"`) {
		t.Errorf("default dataDir not injected into ipam: %s", out)
	}
}

// A DEL lost its prevResult only where a runtime sends one: from
// cniVersion 0.4.0 on.
func TestLostPrevResult(t *testing.T) {
	prev := `,"prevResult":{"cniVersion":"%s","ips":[{"address":"10.0.0.2/24"}]}`
	for _, tc := range []struct {
		version string
		prev    bool
		lost    bool
	}{
		{"0.4.0", false, true}, {"1.0.0", false, true}, {"1.0.0", true, false}, {"0.4.0", true, false}, {"0.3.1", false, false},
	} {
		entry := `{"cniVersion":"` + tc.version + `","name":"n","type":"nomad-bridge-cni","ipam":{"type":"host-local","subnet":"10.0.0.0/24"}`
		if tc.prev {
			entry += fmt.Sprintf(prev, tc.version)
		}
		conf, err := Parse([]byte(entry + "}"))
		if err != nil {
			t.Fatalf("%s: Parse: %v", entry, err)
		}
		if got := conf.LostPrevResult(); got != tc.lost {
			t.Errorf("%s: LostPrevResult = %v, want %v", entry, got, tc.lost)
		}
	}
}

// Both GC entries list exactly what the plugin's sweep kept, under the one
// key host-local reads, however the runtime spelled it (regression: forwarded
// as "cni.dev/attachments", host-local found no list and released every
// lease).
func TestGCConfigs(t *testing.T) {
	for _, key := range []string{"cni.dev/valid-attachments", "cni.dev/attachments"} {
		t.Run(key, func(t *testing.T) {
			conf, err := Parse([]byte(`{"cniVersion":"1.1.0","name":"n","type":"nomad-bridge-cni","dataDir":"/run/x","ipam":{"type":"host-local","subnet":"10.0.0.0/24"},"` + key + `":[{"containerID":"c1","ifname":"eth0"}]}`))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			valid, err := conf.ValidAttachments()
			if err != nil {
				t.Fatal(err)
			}
			delegate, hostLocal, err := conf.GCConfigs(valid)
			if err != nil {
				t.Fatal(err)
			}
			for name, out := range map[string][]byte{"bridge": delegate, "host-local": hostLocal} {
				// What host-local's cmdGC decodes.
				var got types.NetConf
				mustUnmarshal(t, out, &got)
				var keys map[string]json.RawMessage
				mustUnmarshal(t, out, &keys)
				if _, stale := keys["cni.dev/attachments"]; stale {
					t.Errorf("%s: the old key is still forwarded: %s", name, out)
				}
				if len(got.ValidAttachments) != 1 || got.ValidAttachments[0] != (types.GCAttachment{ContainerID: "c1", IfName: "eth0"}) {
					t.Errorf("%s: valid attachments = %+v, want c1/eth0: %s", name, got.ValidAttachments, out)
				}
				if got.Type != name || got.IPAM.Type != "host-local" {
					t.Errorf("%s: type %q, ipam %q", name, got.Type, got.IPAM.Type)
				}
			}
			var got struct {
				CNIVersion string `json:"cniVersion"`
				IPAM       struct {
					DataDir string `json:"dataDir"`
				} `json:"ipam"`
			}
			mustUnmarshal(t, hostLocal, &got)
			if got.CNIVersion != "1.1.0" || got.IPAM.DataDir != "/run/x" {
				t.Errorf("host-local GC config = %+v", got)
			}
		})
	}
	// No list: host-local must read an empty one, as the plugin did.
	conf, err := Parse([]byte(`{"cniVersion":"1.1.0","name":"n","type":"nomad-bridge-cni","ipam":{"type":"host-local","subnet":"10.0.0.0/24"}}`))
	if err != nil {
		t.Fatal(err)
	}
	_, hostLocal, err := conf.GCConfigs(nil)
	if err != nil || !strings.Contains(string(hostLocal), `"cni.dev/valid-attachments":[]`) {
		t.Errorf("GC with no list: %s, %v", hostLocal, err)
	}
}

// host-local reads an empty ipam.dataDir as its default
// (backend/disk.New): so does the plugin, for the legacy directory, where
// it refused the entry (code 7, "must not be empty").
func TestEmptyIPAMDataDirIsHostLocalsDefault(t *testing.T) {
	conf, err := Parse([]byte(`{"cniVersion":"1.0.0","name":"n","type":"nomad-bridge-cni","ipam":{"type":"host-local","subnet":"10.0.0.0/24","dataDir":""}}`))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if conf.LegacyDataDir != ipamdir.DefaultLegacyDataDir {
		t.Errorf("legacy dir = %q, want host-local's default %s", conf.LegacyDataDir, ipamdir.DefaultLegacyDataDir)
	}
}

// An ipam.dataDir that is the dataDir under another name (Nomad's
// "/var/run/cni" where the dataDir is "/run/cni", a symlink on systemd
// hosts) is no legacy directory: nothing to migrate from it. One that is
// another directory is.
func TestLegacyDirThatIsTheDataDirByAnotherName(t *testing.T) {
	dataDir := t.TempDir()
	other := t.TempDir()
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(dataDir, link); err != nil {
		t.Fatal(err)
	}
	for legacy, want := range map[string]string{link: dataDir, other: other} {
		conf, err := Parse([]byte(`{"cniVersion":"1.0.0","name":"n","type":"nomad-bridge-cni","dataDir":"` + dataDir + `","ipam":{"type":"host-local","subnet":"10.0.0.0/24","dataDir":"` + legacy + `"}}`))
		if err != nil {
			t.Fatal(err)
		}
		if conf.LegacyDataDir != want {
			t.Errorf("ipam.dataDir %s: legacy dir = %q, want %q", legacy, conf.LegacyDataDir, want)
		}
	}
}

// A network name is a directory's name: NAME_MAX bytes are allowed.
func TestNetworkNameOfNameMaxBytes(t *testing.T) {
	name := strings.Repeat("n", 255)
	conf, err := Parse([]byte(`{"cniVersion":"1.0.0","name":"` + name + `","type":"nomad-bridge-cni","ipam":{"type":"host-local","subnet":"10.0.0.0/24"}}`))
	if err != nil || conf.Name != name {
		t.Fatalf("Parse of a 255-byte name: %v", err)
	}
}

// host-local decodes ipam with encoding/json, which takes "datadir" or
// "DATADIR" for its dataDir: every spelling must be overridden, as host-local
// itself reads the result (regression: a lower-case "datadir" won and the
// leases went there), and read as the legacy directory.
func TestEverySpellingOfDataDirIsOverridden(t *testing.T) {
	for _, key := range []string{"dataDir", "datadir", "DATADIR", "DataDir", "dataDIR"} {
		t.Run(key, func(t *testing.T) {
			conf, err := Parse([]byte(`{"cniVersion":"1.0.0","name":"n","type":"nomad-bridge-cni","dataDir":"/run/ours","ipam":{"type":"host-local","subnet":"10.0.0.0/24","` + key + `":"/some/where"}}`))
			if err != nil {
				t.Fatal(err)
			}
			if conf.LegacyDataDir != "/some/where" {
				t.Errorf("legacy dir = %q, want /some/where", conf.LegacyDataDir)
			}
			out, err := conf.DelegateConfig()
			if err != nil {
				t.Fatal(err)
			}
			ipam, _, err := allocator.LoadIPAMConfig(out, "")
			if err != nil {
				t.Fatalf("host-local's loader: %v", err)
			}
			if ipam.DataDir != "/run/ours" {
				t.Errorf("host-local reads dataDir %q from %s, want /run/ours", ipam.DataDir, out)
			}
		})
	}
	for name, stdin := range map[string]string{
		"two spellings":     `{"cniVersion":"1.0.0","name":"n","type":"nomad-bridge-cni","ipam":{"type":"host-local","subnet":"10.0.0.0/24","dataDir":"/a","datadir":"/b"}}`,
		"ipam spelled IPAM": `{"cniVersion":"1.0.0","name":"n","type":"nomad-bridge-cni","ipam":{"type":"host-local","subnet":"10.0.0.0/24"},"IPAM":{"type":"host-local","dataDir":"/b"}}`,
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Parse([]byte(stdin))
			var cniErr *types.Error
			if !errors.As(err, &cniErr) || cniErr.Code != types.ErrInvalidNetworkConfig {
				t.Errorf("Parse = %v, want code 7", err)
			}
		})
	}
}

func TestParseRejectsBadInput(t *testing.T) {
	const ipam = `"ipam":{"type":"host-local","subnet":"10.0.0.0/24"}`
	cases := []struct {
		name  string
		input string
		code  uint
		msg   string
	}{
		{"malformed JSON", `{"name":`, types.ErrDecodingFailure, "decode"},
		{"not an object", `[1,2]`, types.ErrDecodingFailure, "decode"},
		{"null", `null`, types.ErrDecodingFailure, "not a JSON object"},
		{"missing name", `{"cniVersion":"1.0.0",` + ipam + `}`, types.ErrInvalidNetworkConfig, "network name"},
		{"name with slash", `{"name":"a/b",` + ipam + `}`, types.ErrInvalidNetworkConfig, "invalid characters"},
		{"name with dotdot", `{"name":"..",` + ipam + `}`, types.ErrInvalidNetworkConfig, "invalid characters"},
		{"name wrong type", `{"name":5,` + ipam + `}`, types.ErrInvalidNetworkConfig, `"name" must be a string`},
		// Was code 5, "unsafe data directory ... file name too long".
		{"name 300 bytes", `{"name":"` + strings.Repeat("n", 300) + `",` + ipam + `}`, types.ErrInvalidNetworkConfig, "more than the 255"},
		{"missing ipam", `{"name":"n"}`, types.ErrInvalidNetworkConfig, `missing "ipam"`},
		{"null ipam", `{"name":"n","ipam":null}`, types.ErrInvalidNetworkConfig, `missing "ipam"`},
		{"ipam not object", `{"name":"n","ipam":"host-local"}`, types.ErrInvalidNetworkConfig, "must be a JSON object"},
		{"ipam not host-local", `{"name":"n","ipam":{"type":"dhcp"}}`, types.ErrInvalidNetworkConfig, `only manages "host-local"`},
		{"ipam without type", `{"name":"n","ipam":{"subnet":"10.0.0.0/24"}}`, types.ErrInvalidNetworkConfig, `only manages "host-local"`},
		{"ipam type wrong type", `{"name":"n","ipam":{"type":1}}`, types.ErrInvalidNetworkConfig, `"ipam.type" must be a string`},
		{"ipam dataDir wrong type", `{"name":"n","ipam":{"type":"host-local","dataDir":[]}}`, types.ErrInvalidNetworkConfig, `"ipam.dataDir" must be a string`},
		{"relative dataDir", `{"name":"n","dataDir":"run/cni",` + ipam + `}`, types.ErrInvalidNetworkConfig, "absolute"},
		{"empty dataDir", `{"name":"n","dataDir":"",` + ipam + `}`, types.ErrInvalidNetworkConfig, "must not be empty"},
		{"dataDir with dotdot", `{"name":"n","dataDir":"/run/../etc",` + ipam + `}`, types.ErrInvalidNetworkConfig, `".."`},
		{"dataDir wrong type", `{"name":"n","dataDir":true,` + ipam + `}`, types.ErrInvalidNetworkConfig, `"dataDir" must be a string`},
		// host-local's GC there deleted the live networks' records.
		{"dataDir is the record directory", `{"name":"n","dataDir":"/run/cni/.nomad-bridge-cni",` + ipam + `}`, types.ErrInvalidNetworkConfig, "record directory"},
		{"dataDir inside the record directory", `{"name":"n","dataDir":"/run/cni/.nomad-bridge-cni/nomad/",` + ipam + `}`, types.ErrInvalidNetworkConfig, "record directory"},
		{"ipam dataDir inside the record directory", `{"name":"n","ipam":{"type":"host-local","dataDir":"/run/cni/.nomad-bridge-cni"}}`, types.ErrInvalidNetworkConfig, "record directory"},
		{"delegate with slash", `{"name":"n","delegate":"/usr/bin/bridge",` + ipam + `}`, types.ErrInvalidNetworkConfig, "not a path"},
		{"delegate relative path", `{"name":"n","delegate":"../bridge",` + ipam + `}`, types.ErrInvalidNetworkConfig, "not a path"},
		{"delegate dotdot", `{"name":"n","delegate":"..",` + ipam + `}`, types.ErrInvalidNetworkConfig, "not a path"},
		{"delegate empty", `{"name":"n","delegate":"",` + ipam + `}`, types.ErrInvalidNetworkConfig, "must not be empty"},
		{"delegate wrong type", `{"name":"n","delegate":1,` + ipam + `}`, types.ErrInvalidNetworkConfig, `"delegate" must be a string`},
		{"delegateTimeout garbage", `{"name":"n","delegateTimeout":"soon",` + ipam + `}`, types.ErrInvalidNetworkConfig, `"delegateTimeout"`},
		{"checkSweepInterval negative", `{"name":"n","checkSweepInterval":"-1s",` + ipam + `}`, types.ErrInvalidNetworkConfig, `"checkSweepInterval" "-1s" must be a duration between 0s and 24h0m0s`},
		{"checkSweepInterval too long", `{"name":"n","checkSweepInterval":"25h",` + ipam + `}`, types.ErrInvalidNetworkConfig, `"checkSweepInterval"`},
		{"checkSweepInterval not a string", `{"name":"n","checkSweepInterval":10,` + ipam + `}`, types.ErrInvalidNetworkConfig, `"checkSweepInterval" must be a string`},
		{"delegateTimeout negative", `{"name":"n","delegateTimeout":"-1s",` + ipam + `}`, types.ErrInvalidNetworkConfig, `"delegateTimeout"`},
		{"logFile relative", `{"name":"n","logFile":"nbc.log",` + ipam + `}`, types.ErrInvalidNetworkConfig, `"logFile" "nbc.log" must be an absolute path`},
		{"logFile a directory", `{"name":"n","logFile":"/var/log/",` + ipam + `}`, types.ErrInvalidNetworkConfig, `names a directory`},
		{"logFile with dotdot", `{"name":"n","logFile":"/var/log/../../etc/passwd",` + ipam + `}`, types.ErrInvalidNetworkConfig, `".."`},
		{"logFile not a string", `{"name":"n","logFile":1,` + ipam + `}`, types.ErrInvalidNetworkConfig, `"logFile" must be a string`},
		{"logLevel without logFile", `{"name":"n","logLevel":"debug",` + ipam + `}`, types.ErrInvalidNetworkConfig, `"logLevel" is set without a "logFile"`},
		{"logLevel unknown", `{"name":"n","logFile":"/var/log/nbc.log","logLevel":"verbose",` + ipam + `}`, types.ErrInvalidNetworkConfig, `"logLevel": "verbose" is not one of error, info, debug`},
		// Every call, and the rollback after it, would fail.
		{"delegateTimeout 1ns", `{"name":"n","delegateTimeout":"1ns",` + ipam + `}`, types.ErrInvalidNetworkConfig, `between 1s and`},
		{"delegateTimeout too long", `{"name":"n","delegateTimeout":"100h",` + ipam + `}`, types.ErrInvalidNetworkConfig, `"delegateTimeout"`},
		{"delegateTimeout wrong type", `{"name":"n","delegateTimeout":90,` + ipam + `}`, types.ErrInvalidNetworkConfig, `"delegateTimeout" must be a string`},
		{"ipam dataDir relative", `{"name":"n","ipam":{"type":"host-local","dataDir":"relative"}}`, types.ErrInvalidNetworkConfig, `"ipam.dataDir" "relative" must be an absolute path`},
		{"ipam dataDir with dotdot", `{"name":"n","ipam":{"type":"host-local","dataDir":"/var/lib/../x"}}`, types.ErrInvalidNetworkConfig, `must not contain ".."`},
		{"prevResult a string", `{"cniVersion":"1.0.0","name":"n","prevResult":"x",` + ipam + `}`, types.ErrDecodingFailure, `"prevResult" must be a JSON object`},
		{"prevResult an array", `{"cniVersion":"1.0.0","name":"n","prevResult":[1],` + ipam + `}`, types.ErrDecodingFailure, `"prevResult" must be a JSON object`},
		{"prevResult ips not a list", `{"cniVersion":"1.0.0","name":"n","prevResult":{"ips":"x"},` + ipam + `}`, types.ErrDecodingFailure, `not a result of this cniVersion`},
		{"cniVersion wrong type", `{"name":"n","cniVersion":1.0,` + ipam + `}`, types.ErrInvalidNetworkConfig, `"cniVersion" must be a string`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.input))
			var cniErr *types.Error
			if !errors.As(err, &cniErr) {
				t.Fatalf("Parse(%s) = %v, want a *types.Error", tc.input, err)
			}
			if cniErr.Code != tc.code {
				t.Errorf("code = %d, want %d (%v)", cniErr.Code, tc.code, cniErr)
			}
			if !strings.Contains(cniErr.Error(), tc.msg) {
				t.Errorf("error %q does not mention %q", cniErr.Error(), tc.msg)
			}
		})
	}
}

func mustUnmarshal(t *testing.T, b []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("unmarshal %s: %v", b, err)
	}
}

func compact(t *testing.T, b []byte) string {
	t.Helper()
	var out strings.Builder
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
	enc := json.NewEncoder(&out)
	if err := enc.Encode(v); err != nil {
		t.Fatal(err)
	}
	return out.String()
}

func TestValidAttachments(t *testing.T) {
	base := `{"cniVersion":"1.1.0","name":"n","ipam":{"type":"host-local"}%s}`
	cases := []struct {
		name    string
		extra   string
		want    int
		wantNil bool
		bad     bool
	}{
		{name: "absent means none valid", extra: "", wantNil: true},
		{name: "null means none valid", extra: `,"cni.dev/valid-attachments":null`, wantNil: true},
		{name: "empty list", extra: `,"cni.dev/valid-attachments":[]`, want: 0},
		{name: "two", extra: `,"cni.dev/valid-attachments":[{"containerID":"a","ifname":"eth0"},{"containerID":"b","ifname":"eth1"}]`, want: 2},
		{name: "legacy key", extra: `,"cni.dev/attachments":[{"containerID":"a","ifname":"eth0"}]`, want: 1},
		{name: "not a list", extra: `,"cni.dev/valid-attachments":"a"`, bad: true},
		{name: "garbage entry", extra: `,"cni.dev/valid-attachments":[5]`, bad: true},
		{name: "bad container id", extra: `,"cni.dev/valid-attachments":[{"containerID":"../x","ifname":"eth0"}]`, bad: true},
		{name: "empty container id", extra: `,"cni.dev/valid-attachments":[{"ifname":"eth0"}]`, bad: true},
		{name: "bad ifname", extra: `,"cni.dev/valid-attachments":[{"containerID":"a","ifname":"a/b"}]`, bad: true},
		// host-local's GC would release the container it names.
		{name: "no ifname", extra: `,"cni.dev/valid-attachments":[{"containerID":"a"}]`, bad: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			conf, err := Parse([]byte(fmt.Sprintf(base, tc.extra)))
			if err != nil {
				t.Fatal(err)
			}
			list, err := conf.ValidAttachments()
			if tc.bad {
				var cniErr *types.Error
				if !errors.As(err, &cniErr) || cniErr.Code != types.ErrInvalidNetworkConfig {
					t.Errorf("error = %v, want code 7", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.wantNil != (list == nil) || len(list) != tc.want {
				t.Errorf("list = %#v", list)
			}
		})
	}
}

// Installed under its delegate's name, the plugin receives entries of the
// delegate's type: those with host-local are managed as usual, any other
// reaches the delegate byte for byte.
func TestInstalledUnderTheDelegatesName(t *testing.T) {
	for _, stdin := range []string{
		`{"cniVersion":"1.0.0","name":"n","type":"bridge","ipam":{"type":"dhcp"}}`,
		`{"cniVersion":"1.0.0","name":"n","type":"bridge","ipam":{"type":"static","addresses":[{"address":"10.1.0.2/24"}]},"dataDir":"relative"}`,
		`{"cniVersion":"0.4.0","name":"n","type":"bridge"}`,
		`{"name":"n","type":"bridge","ipam":{"type":1}}`,
		`{"name":"n","type":"macvlan","delegate":"macvlan","ipam":{"type":"dhcp"}}`,
	} {
		c, err := Parse([]byte(stdin))
		if err != nil {
			t.Errorf("Parse(%s): %v", stdin, err)
			continue
		}
		// Each verb passes such an entry on as it came (the plugin's
		// TestEntriesItDoesNotManagePassThrough).
		if !c.Passthrough {
			t.Errorf("Parse(%s): not passed through", stdin)
		}
	}

	c, err := Parse([]byte(`{"cniVersion":"0.4.0","name":"nomad","type":"bridge","bridge":"nomad","ipam":{"type":"host-local","dataDir":"/var/run/cni","ranges":[[{"subnet":"172.26.64.0/20"}]]}}`))
	if err != nil || c.Passthrough {
		t.Fatalf("Nomad's own bridge entry: passthrough %v, %v; want it managed", c != nil && c.Passthrough, err)
	}
	out, err := c.DelegateConfig()
	if err != nil {
		t.Fatal(err)
	}
	var delegate struct {
		Type string `json:"type"`
		IPAM struct {
			DataDir string `json:"dataDir"`
		} `json:"ipam"`
	}
	if err := json.Unmarshal(out, &delegate); err != nil || delegate.Type != "bridge" || delegate.IPAM.DataDir != ipamdir.DefaultDataDir {
		t.Errorf("delegate gets %s (%v)", out, err)
	}

	// Under its own name the plugin only manages host-local.
	if _, err := Parse([]byte(`{"name":"n","type":"nomad-bridge-cni","ipam":{"type":"dhcp"}}`)); err == nil {
		t.Error("nomad-bridge-cni accepted a dhcp entry")
	}
}

func TestCheckSweepIntervalIsReadAndNotDelegated(t *testing.T) {
	conf, err := Parse([]byte(`{"name":"n","type":"nomad-bridge-cni","checkSweepInterval":"0s","ipam":{"type":"host-local","subnet":"10.0.0.0/24"}}`))
	if err != nil || conf.CheckSweepInterval != 0 {
		t.Fatalf("Parse = %+v, %v; want a 0s interval", conf, err)
	}
	out, err := conf.DelegateConfig()
	if err != nil || strings.Contains(string(out), "checkSweepInterval") {
		t.Errorf("the delegate gets %s (%v)", out, err)
	}
}

func TestLogKeysAreReadAndNotDelegated(t *testing.T) {
	conf, err := Parse([]byte(`{"name":"n","type":"nomad-bridge-cni","logFile":"/var/log//nbc.log","logLevel":"debug","ipam":{"type":"host-local","subnet":"10.0.0.0/24"}}`))
	if err != nil || conf.LogFile != "/var/log/nbc.log" || conf.LogLevel != eventlog.Debug {
		t.Fatalf("Parse = %+v, %v; want /var/log/nbc.log at debug", conf, err)
	}
	out, err := conf.DelegateConfig()
	if err != nil || strings.Contains(string(out), "logFile") || strings.Contains(string(out), "logLevel") {
		t.Errorf("the delegate gets %s (%v)", out, err)
	}
	conf, err = Parse([]byte(`{"name":"n","type":"nomad-bridge-cni","ipam":{"type":"host-local","subnet":"10.0.0.0/24"}}`))
	if err != nil || conf.LogFile != "" {
		t.Errorf("no logFile: %+v, %v", conf, err)
	}
}

// Asking for addresses adds args.cni.ips and changes nothing else (the
// entry's other args included); an entry that asks itself is left alone.
func TestDelegateConfigRequesting(t *testing.T) {
	conf, err := Parse([]byte(bridgeEntry))
	if err != nil {
		t.Fatal(err)
	}
	plain, err := conf.DelegateConfig()
	if err != nil {
		t.Fatal(err)
	}
	asking, ok, err := conf.DelegateConfigRequesting([]string{"172.26.64.12", "fd00::5"})
	if err != nil || !ok {
		t.Fatalf("DelegateConfigRequesting: %v %v", ok, err)
	}
	var p, a map[string]json.RawMessage
	mustUnmarshal(t, plain, &p)
	mustUnmarshal(t, asking, &a)
	for key := range p {
		if key != "args" && compact(t, p[key]) != compact(t, a[key]) {
			t.Errorf("key %q changed: %s, was %s", key, a[key], p[key])
		}
	}
	if len(a) != len(p) {
		t.Errorf("%d keys, want %d", len(a), len(p))
	}
	if got, want := compact(t, a["args"]), compact(t, []byte(`{"cni":{"ips":["172.26.64.12","fd00::5"],"mac":"00:11:22:33:44:55"}}`)); got != want {
		t.Errorf("args = %s, want %s", got, want)
	}

	for _, own := range []string{
		`"args": {"cni": {"ips": ["172.26.64.9"]}}`,
		`"runtimeConfig": {"ips": ["172.26.64.9/20"]}`,
		`"args": {"cni": {"ips": "not a list"}}`,
		`"args": ["not", "an", "object"]`,
		`"args": {"cni": 5}`,
	} {
		entry := strings.Replace(bridgeEntry, `"dns":`, own+`, "dns":`, 1)
		entry = strings.Replace(entry, `"args": {"cni": {"mac": "00:11:22:33:44:55"}},`, "", 1)
		entry = strings.Replace(entry, `"runtimeConfig": {"mac": "00:11:22:33:44:55", "portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]},`, "", 1)
		c, err := Parse([]byte(entry))
		if err != nil {
			t.Fatalf("%s: %v", own, err)
		}
		if _, ok, err := c.DelegateConfigRequesting([]string{"172.26.64.12"}); ok || err != nil {
			t.Errorf("%s: asked anyway (%v)", own, err)
		}
	}
}
