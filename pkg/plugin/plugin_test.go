package plugin

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/utils"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/netfilter"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/reclaim"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/records"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/sysinfo"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/fakehost"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/fakenat"
)

const bridgeResult100 = `{
  "cniVersion": "1.0.0",
  "interfaces": [{"name": "nomad", "mac": "02:00:00:00:00:01"}, {"name": "eth0", "mac": "02:00:00:00:00:02", "sandbox": "/var/run/netns/x"}],
  "ips": [{"address": "172.26.64.2/20", "gateway": "172.26.64.1", "interface": 1}],
  "routes": [{"dst": "0.0.0.0/0"}],
  "dns": {}
}`

type harness struct {
	t       testing.TB
	exec    *fakeExec
	plugin  *Plugin
	stdout  *bytes.Buffer
	stderr  *bytes.Buffer
	dataDir string
	host    *fakehost.Host
}

func newHarness(t testing.TB, installed ...string) *harness {
	t.Helper()
	t.Setenv("CNI_PATH", "/opt/cni/bin")
	t.Setenv("CNI_COMMAND", "ADD") // overridden per delegate call by invoke
	h := &harness{t: t, exec: newFakeExec(installed...), stdout: &bytes.Buffer{}, stderr: &bytes.Buffer{}}
	h.dataDir = filepath.Join(t.TempDir(), "run-cni")
	h.host = fakehost.New(time.Unix(1764660000, 0))
	h.host.Namespaces["/var/run/netns/x"] = sysinfo.NetnsID{Dev: 4, Ino: 1000}
	h.plugin = &Plugin{Exec: h.exec, Stdout: h.stdout,
		Reclaim: reclaim.Env{Host: h.host, Netfilter: &netfilter.Cleaner{}, Log: h.stderr}}
	return h
}

func (h *harness) conf(cniVersion string, extra string) []byte {
	return []byte(fmt.Sprintf(`{"cniVersion":%q,"name":"nomad","type":"nomad-bridge-cni","dataDir":%q,"bridge":"nomad","ipMasq":true%s,"ipam":{"type":"host-local","subnet":"172.26.64.0/20"}}`, cniVersion, h.dataDir, extra))
}

// served makes the network's lease directory, as host-local leaves it
// once it ran there.
func (h *harness) served() {
	h.t.Helper()
	if err := os.MkdirAll(filepath.Join(h.dataDir, "nomad"), 0o755); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) args(stdin []byte) *skel.CmdArgs {
	return &skel.CmdArgs{ContainerID: "c1", Netns: "/var/run/netns/x", IfName: "eth0", Path: "/opt/cni/bin", StdinData: stdin}
}

func delegatedConf(t testing.TB, call execCall) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(call.Stdin), &m); err != nil {
		t.Fatalf("delegate stdin is not JSON: %v\n%s", err, call.Stdin)
	}
	return m
}

func TestAddDelegatesRewrittenConfigAndEnv(t *testing.T) {
	h := newHarness(t, "bridge")
	h.exec.reply["bridge ADD"] = bridgeResult100
	t.Setenv("CNI_CONTAINERID", "c1")
	t.Setenv("CNI_IFNAME", "eth0")
	t.Setenv("CNI_NETNS", "/var/run/netns/x")

	if err := h.plugin.Funcs().Add(h.args(h.conf("1.0.0", `,"hairpinMode":true`))); err != nil {
		t.Fatalf("Add: %v", err)
	}
	call := h.exec.only(t)
	if call.Plugin != "bridge" || call.Command != "ADD" {
		t.Errorf("delegated %s %s, want bridge ADD", call.Plugin, call.Command)
	}
	for k, want := range map[string]string{"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "CNI_IFNAME": "eth0", "CNI_NETNS": "/var/run/netns/x", "CNI_PATH": "/opt/cni/bin"} {
		if call.Env[k] != want {
			t.Errorf("delegate env %s = %q, want %q", k, call.Env[k], want)
		}
	}
	want := map[string]any{
		"cniVersion": "1.0.0", "name": "nomad", "type": "bridge", "bridge": "nomad", "ipMasq": true, "hairpinMode": true,
		"ipam": map[string]any{"type": "host-local", "subnet": "172.26.64.0/20", "dataDir": h.dataDir},
	}
	got := delegatedConf(t, call)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("delegate stdin =\n%v\nwant\n%v", got, want)
	}
	if fi, err := os.Stat(h.dataDir); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
		t.Errorf("dataDir not created 0700: %v %v", fi, err)
	}
	if !strings.Contains(h.stdout.String(), "172.26.64.2/20") {
		t.Errorf("result not printed: %q", h.stdout.String())
	}
}

func TestAddPrintsResultInConfigVersion(t *testing.T) {
	for _, v := range []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"} {
		t.Run(v, func(t *testing.T) {
			h := newHarness(t, "bridge")
			// bridge answers in the version it was given; model the harder
			// case of a delegate answering at another version.
			h.exec.reply["bridge ADD"] = bridgeResult100
			if err := h.plugin.Funcs().Add(h.args(h.conf(v, ""))); err != nil {
				t.Fatalf("Add: %v", err)
			}
			var res struct {
				CNIVersion string `json:"cniVersion"`
				IPs        []struct {
					Version string `json:"version"`
					Address string `json:"address"`
				} `json:"ips"`
			}
			if err := json.Unmarshal(h.stdout.Bytes(), &res); err != nil {
				t.Fatalf("stdout is not a result: %v\n%s", err, h.stdout)
			}
			if res.CNIVersion != v {
				t.Errorf("result cniVersion = %q, want %q", res.CNIVersion, v)
			}
			if len(res.IPs) != 1 || res.IPs[0].Address != "172.26.64.2/20" {
				t.Fatalf("ips = %+v", res.IPs)
			}
			wantIPVersion := ""
			if strings.HasPrefix(v, "0.") {
				wantIPVersion = "4"
			}
			if res.IPs[0].Version != wantIPVersion {
				t.Errorf("ips[0].version = %q, want %q for cniVersion %s", res.IPs[0].Version, wantIPVersion, v)
			}
		})
	}
}

// The not-on-tmpfs warning is given once per boot and network: a runtime
// logs the plugins' stderr, and every ADD repeating it fills that log.
func TestAddWarnsOncePerBootWhenDataDirIsNotTmpfs(t *testing.T) {
	h := newHarness(t, "bridge")
	h.exec.reply["bridge ADD"] = bridgeResult100
	h.plugin.onTmpfs = func(ipamdir.Dir) (bool, int64, error) { return false, 0xef53, nil }
	add := func(cid string) int {
		t.Helper()
		h.stderr.Reset()
		args := h.args(h.conf("1.0.0", ""))
		args.ContainerID = cid
		if err := h.plugin.Funcs().Add(args); err != nil {
			t.Fatalf("Add %s: %v", cid, err)
		}
		if strings.Contains(h.stdout.String(), "tmpfs") {
			t.Errorf("warning leaked onto stdout: %q", h.stdout.String())
		}
		return strings.Count(h.stderr.String(), "is not on tmpfs")
	}
	if got := add("c1"); got != 1 {
		t.Errorf("first ADD of the boot: %d tmpfs warnings, want 1: %q", got, h.stderr.String())
	}
	if got := add("c2"); got != 0 {
		t.Errorf("second ADD in the same boot: %d tmpfs warnings, want 0: %q", got, h.stderr.String())
	}
	marker := filepath.Join(h.dataDir, ".nomad-bridge-cni", "nomad", ".warned-not-tmpfs")
	if b, err := os.ReadFile(marker); err != nil || string(b) != "boot-1" {
		t.Errorf("marker %s = %q, %v; want the boot ID", marker, b, err)
	}

	// The marker survives a reboot on such a dataDir: its boot ID decides.
	h.host.ID = "boot-2"
	if got := add("c3"); got != 1 {
		t.Errorf("first ADD of a new boot: %d tmpfs warnings, want 1: %q", got, h.stderr.String())
	}
	if got := add("c4"); got != 0 {
		t.Errorf("second ADD of the new boot: %d tmpfs warnings, want 0: %q", got, h.stderr.String())
	}

	// Another network has its own marker.
	h.stderr.Reset()
	other := bytes.Replace(h.conf("1.0.0", ""), []byte(`"name":"nomad"`), []byte(`"name":"other"`), 1)
	if err := h.plugin.Funcs().Add(h.args(other)); err != nil {
		t.Fatalf("Add on another network: %v", err)
	}
	if got := strings.Count(h.stderr.String(), "is not on tmpfs"); got != 1 {
		t.Errorf("first ADD on another network: %d tmpfs warnings, want 1: %q", got, h.stderr.String())
	}
}

func TestAddOnTmpfsNeitherWarnsNorMarks(t *testing.T) {
	h := newHarness(t, "bridge")
	h.exec.reply["bridge ADD"] = bridgeResult100
	h.plugin.onTmpfs = func(ipamdir.Dir) (bool, int64, error) { return true, 0x01021994, nil }
	if err := h.plugin.Funcs().Add(h.args(h.conf("1.0.0", ""))); err != nil {
		t.Fatalf("Add: %v", err)
	}
	if strings.Contains(h.stderr.String(), "tmpfs") {
		t.Errorf("warned about tmpfs on a tmpfs dataDir: %q", h.stderr.String())
	}
	if _, err := os.Lstat(filepath.Join(h.dataDir, ".nomad-bridge-cni", "nomad", ".warned-not-tmpfs")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("tmpfs warning marker written on a tmpfs dataDir: %v", err)
	}
}

// A marker that cannot be written costs a repeated warning, never the ADD.
func TestAddWarnsWhenTheTmpfsMarkerCannotBeWritten(t *testing.T) {
	h := newHarness(t, "bridge")
	h.exec.reply["bridge ADD"] = bridgeResult100
	h.plugin.onTmpfs = func(ipamdir.Dir) (bool, int64, error) { return false, 0xef53, nil }
	// A non-empty directory where the marker goes: rename onto it fails.
	blocker := filepath.Join(h.dataDir, ".nomad-bridge-cni", "nomad", ".warned-not-tmpfs", "x")
	if err := os.MkdirAll(blocker, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, cid := range []string{"c1", "c2"} {
		h.stderr.Reset()
		args := h.args(h.conf("1.0.0", ""))
		args.ContainerID = cid
		if err := h.plugin.Funcs().Add(args); err != nil {
			t.Fatalf("Add %s with an unwritable marker: %v", cid, err)
		}
		if !strings.Contains(h.stderr.String(), "is not on tmpfs") || !strings.Contains(h.stderr.String(), "record that the tmpfs warning was given") {
			t.Errorf("ADD %s: stderr = %q, want the tmpfs warning and why it may repeat", cid, h.stderr.String())
		}
	}
}

func TestDelegateErrorKeepsCodeAndMessage(t *testing.T) {
	h := newHarness(t, "bridge")
	h.exec.fail["bridge ADD"] = types.NewError(types.ErrTryAgainLater, "failed to allocate for range 0: 172.26.64.12 has been allocated to c1, duplicate allocation is not allowed", "d")
	err := h.plugin.Funcs().Add(h.args(h.conf("1.0.0", "")))
	var cniErr *types.Error
	if !errors.As(err, &cniErr) {
		t.Fatalf("Add error = %v, want *types.Error", err)
	}
	if cniErr.Code != types.ErrTryAgainLater || !strings.Contains(cniErr.Msg, "duplicate allocation is not allowed") || !strings.Contains(cniErr.Msg, "delegate bridge failed (add)") || cniErr.Details != "d" {
		t.Errorf("error = %+v", cniErr)
	}
	if h.stdout.Len() != 0 {
		t.Errorf("stdout on failure: %q", h.stdout.String())
	}

	h.exec.fail["bridge ADD"] = errors.New("exec: signal: killed")
	err = h.plugin.Funcs().Add(h.args(h.conf("1.0.0", "")))
	if !errors.As(err, &cniErr) || cniErr.Code != types.ErrInternal || !strings.Contains(cniErr.Details, "killed") {
		t.Errorf("plain delegate error = %+v", err)
	}
}

// Bad input is rejected before anything is delegated or written.
func TestBadInputTouchesNothing(t *testing.T) {
	type verb func(skel.CNIFuncs) func(*skel.CmdArgs) error
	verbs := map[string]verb{
		"ADD":    func(f skel.CNIFuncs) func(*skel.CmdArgs) error { return f.Add },
		"DEL":    func(f skel.CNIFuncs) func(*skel.CmdArgs) error { return f.Del },
		"CHECK":  func(f skel.CNIFuncs) func(*skel.CmdArgs) error { return f.Check },
		"GC":     func(f skel.CNIFuncs) func(*skel.CmdArgs) error { return f.GC },
		"STATUS": func(f skel.CNIFuncs) func(*skel.CmdArgs) error { return f.Status },
	}
	cases := []struct {
		name  string
		stdin func(h *harness) []byte
		code  uint
	}{
		{"malformed JSON", func(h *harness) []byte { return []byte(`{"name": "x",`) }, types.ErrDecodingFailure},
		{"missing ipam", func(h *harness) []byte {
			return []byte(fmt.Sprintf(`{"cniVersion":"1.1.0","name":"n","dataDir":%q}`, h.dataDir))
		}, types.ErrInvalidNetworkConfig},
		{"non host-local ipam", func(h *harness) []byte {
			return []byte(fmt.Sprintf(`{"cniVersion":"1.1.0","name":"n","dataDir":%q,"ipam":{"type":"static"}}`, h.dataDir))
		}, types.ErrInvalidNetworkConfig},
		{"relative dataDir", func(h *harness) []byte {
			return []byte(`{"cniVersion":"1.1.0","name":"n","dataDir":"run/cni","ipam":{"type":"host-local"}}`)
		}, types.ErrInvalidNetworkConfig},
		{"delegate with slash", func(h *harness) []byte {
			return []byte(fmt.Sprintf(`{"cniVersion":"1.1.0","name":"n","dataDir":%q,"delegate":"/tmp/evil","ipam":{"type":"host-local"}}`, h.dataDir))
		}, types.ErrInvalidNetworkConfig},
		{"delegate not in CNI_PATH", func(h *harness) []byte {
			return []byte(fmt.Sprintf(`{"cniVersion":"1.1.0","name":"n","dataDir":%q,"delegate":"no-such-plugin","ipam":{"type":"host-local"}}`, h.dataDir))
		}, types.ErrInvalidNetworkConfig},
	}
	for _, tc := range cases {
		for verbName, call := range verbs {
			t.Run(tc.name+"/"+verbName, func(t *testing.T) {
				h := newHarness(t, "bridge", "host-local")
				err := call(h.plugin.Funcs())(h.args(tc.stdin(h)))
				var cniErr *types.Error
				if !errors.As(err, &cniErr) {
					t.Fatalf("error = %v, want *types.Error", err)
				}
				want := tc.code
				if verbName == "STATUS" && tc.name == "delegate not in CNI_PATH" {
					want = types.ErrPluginNotAvailable
				}
				if cniErr.Code != want {
					t.Errorf("code = %d (%v), want %d", cniErr.Code, cniErr, want)
				}
				if len(h.exec.calls) != 0 {
					t.Errorf("delegated despite bad input: %+v", h.exec.calls)
				}
				if _, err := os.Lstat(h.dataDir); !os.IsNotExist(err) {
					t.Errorf("dataDir %s was created (err=%v)", h.dataDir, err)
				}
				if h.stdout.Len() != 0 {
					t.Errorf("stdout = %q, want nothing", h.stdout.String())
				}
			})
		}
	}
}

func TestDelAndCheckDelegate(t *testing.T) {
	for _, tc := range []struct {
		verb string
		call func(*Plugin, *skel.CmdArgs) error
	}{
		{"DEL", func(p *Plugin, args *skel.CmdArgs) error { return p.Funcs().Del(args) }},
		{"CHECK", func(p *Plugin, args *skel.CmdArgs) error { return p.Funcs().Check(args) }},
	} {
		t.Run(tc.verb, func(t *testing.T) {
			h := newHarness(t, "bridge")
			h.served()
			stdin := h.conf("1.0.0", `,"prevResult":`+bridgeResult100)
			if err := tc.call(h.plugin, h.args(stdin)); err != nil {
				t.Fatalf("%s: %v", tc.verb, err)
			}
			call := h.exec.only(t)
			if call.Plugin != "bridge" || call.Command != tc.verb {
				t.Errorf("delegated %s %s, want bridge %s", call.Plugin, call.Command, tc.verb)
			}
			conf := delegatedConf(t, call)
			if conf["type"] != "bridge" || conf["ipam"].(map[string]any)["dataDir"] != h.dataDir || conf["prevResult"] == nil {
				t.Errorf("delegate conf = %v", conf)
			}
			if h.stdout.Len() != 0 {
				t.Errorf("stdout = %q", h.stdout.String())
			}
		})
	}
}

func TestDelIsIdempotentWhenDelegateSucceeds(t *testing.T) {
	h := newHarness(t, "bridge")
	for i := 0; i < 2; i++ {
		if err := h.plugin.Funcs().Del(h.args(h.conf("1.0.0", ""))); err != nil {
			t.Fatalf("DEL #%d: %v", i+1, err)
		}
	}
}

func TestGCForwardsToDelegateAndHostLocal(t *testing.T) {
	h := newHarness(t, "bridge", "host-local")
	h.served()
	stdin := h.conf("1.1.0", `,"cni.dev/valid-attachments":[{"containerID":"keep","ifname":"eth0"}]`)
	if err := h.plugin.Funcs().GC(&skel.CmdArgs{Path: "/opt/cni/bin", StdinData: stdin}); err != nil {
		t.Fatalf("GC: %v", err)
	}
	if len(h.exec.calls) != 2 {
		t.Fatalf("calls = %+v, want bridge GC then host-local GC", h.exec.calls)
	}
	for i, want := range []string{"bridge", "host-local"} {
		call := h.exec.calls[i]
		if call.Plugin != want || call.Command != "GC" {
			t.Errorf("call %d = %s %s, want %s GC", i, call.Plugin, call.Command, want)
		}
		conf := delegatedConf(t, call)
		if conf["type"] != want || conf["cniVersion"] != "1.1.0" || conf["ipam"].(map[string]any)["dataDir"] != h.dataDir {
			t.Errorf("%s GC conf = %v", want, conf)
		}
		valid, _ := json.Marshal(conf["cni.dev/valid-attachments"])
		if string(valid) != `[{"containerID":"keep","ifname":"eth0"}]` {
			t.Errorf("%s GC valid attachments = %s", want, valid)
		}
	}
}

func TestGCRunsHostLocalEvenIfDelegateFails(t *testing.T) {
	h := newHarness(t, "bridge", "host-local")
	h.served()
	h.exec.fail["bridge GC"] = types.NewError(types.ErrInternal, "boom", "")
	err := h.plugin.Funcs().GC(&skel.CmdArgs{StdinData: h.conf("1.1.0", "")})
	if err == nil || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("GC error = %v, want the delegate's", err)
	}
	if len(h.exec.calls) != 2 || h.exec.calls[1].Plugin != "host-local" {
		t.Errorf("host-local GC skipped after delegate failure: %+v", h.exec.calls)
	}
}

// On a network the plugin never served, CHECK and the GC verb create
// nothing: host-local, which would make the network's directory and lock
// to find no lease, is shown an empty directory of its own on CHECK, and
// not asked on GC (regression: a failed CHECK left <net>/lock and the record
// directory).
func TestCheckAndGCOnANetworkNeverServedCreateNothing(t *testing.T) {
	h := newHarness(t, "bridge", "host-local")
	h.exec.fail["bridge CHECK"] = types.NewError(types.ErrInternal, "no lease", "")
	if err := h.plugin.Funcs().Check(h.args(h.conf("1.0.0", `,"prevResult":`+bridgeResult100))); err == nil {
		t.Error("CHECK passed")
	}
	if dir := delegatedConf(t, h.exec.only(t))["ipam"].(map[string]any)["dataDir"]; dir == h.dataDir {
		t.Errorf("host-local's CHECK was given the data dir")
	}
	h.exec.calls = nil
	if err := h.plugin.Funcs().GC(&skel.CmdArgs{StdinData: h.conf("1.1.0", "")}); err != nil {
		t.Fatalf("GC: %v", err)
	}
	if call := h.exec.only(t); call.Plugin != "bridge" {
		t.Errorf("GC forwarded to %s", call.Plugin)
	}
	if _, err := os.Stat(h.dataDir); !os.IsNotExist(err) {
		t.Errorf("the data dir was created: %v", err)
	}
}

func TestStatus(t *testing.T) {
	h := newHarness(t, "bridge")
	if err := h.plugin.Funcs().Status(&skel.CmdArgs{StdinData: h.conf("1.1.0", "")}); err != nil {
		t.Fatalf("STATUS: %v", err)
	}
	call := h.exec.only(t)
	if call.Plugin != "bridge" || call.Command != "STATUS" {
		t.Errorf("delegated %s %s", call.Plugin, call.Command)
	}
	if _, err := os.Stat(h.dataDir); !os.IsNotExist(err) {
		t.Errorf("STATUS wrote in the data dir: %v", err)
	}
}

func TestStatusFailsWhenDataDirUnusable(t *testing.T) {
	h := newHarness(t, "bridge")
	// A regular file where the directory should be: no mode bits to lean on,
	// so this holds as root too.
	if err := os.WriteFile(h.dataDir, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := h.plugin.Funcs().Status(&skel.CmdArgs{StdinData: h.conf("1.1.0", "")})
	var cniErr *types.Error
	if !errors.As(err, &cniErr) || cniErr.Code != types.ErrPluginNotAvailable {
		t.Fatalf("STATUS error = %v, want code 50", err)
	}
	if len(h.exec.calls) != 0 {
		t.Errorf("delegated although dataDir is unusable")
	}
}

// BeginAdd's domain errors reach the runtime with the code it acts on.
func TestBeginAddErrorsKeepTheirCNICode(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code uint
	}{
		{&reclaim.AddError{Kind: reclaim.ErrAddInProgress, Msg: "m", Detail: "d"}, types.ErrTryAgainLater},
		{&reclaim.AddError{Kind: reclaim.ErrNoNamespace, Msg: "m", Detail: "d"}, types.ErrInvalidNetNS},
		{&reclaim.AddError{Kind: reclaim.ErrRecordWrite, Msg: "m", Detail: "d"}, types.ErrIOFailure},
		{&reclaim.AddError{Kind: reclaim.ErrStillAttached, Msg: "m", Detail: "d"}, types.ErrInternal},
		{errors.New("boom"), types.ErrInternal},
	} {
		var cniErr *types.Error
		if err := beginAddError(tc.err); !errors.As(err, &cniErr) || cniErr.Code != tc.code {
			t.Errorf("beginAddError(%v) = %v, want code %d", tc.err, err, tc.code)
		} else if cniErr.Msg == "" || cniErr.Details == "" {
			t.Errorf("beginAddError(%v) lost the message or detail: %+v", tc.err, cniErr)
		} else if _, refusal := tc.err.(*reclaim.AddError); refusal && !strings.HasPrefix(cniErr.Msg, "nomad-bridge-cni refused the ADD: ") {
			// Installed as bridge, the runtime names "bridge": the
			// message's first words say who refused.
			t.Errorf("a refusal does not lead with the plugin's name: %q", cniErr.Msg)
		}
	}
}

// The GC verb from an entry whose dataDir is not the plugin's (a wrong or
// new one: no ADD through the plugin marked the network as its own) must
// not release NAT rules it cannot prove are of that data dir: a live
// container of the real data dir has no record there, and its rules are
// not orphans. Once the network is the plugin's, orphans go.
func TestGCReleasesOrphanRulesOnlyOfItsOwnNetwork(t *testing.T) {
	h := newHarness(t, "bridge", "host-local")
	nat := fakenat.New()
	nat.AddContainer("nomad", "live-elsewhere", "172.26.64.9", 8080)
	h.plugin.Reclaim.Netfilter = &netfilter.Cleaner{Tables: []netfilter.Table{nat}}
	if err := os.MkdirAll(filepath.Join(h.dataDir, "nomad"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := h.plugin.Funcs().GC(&skel.CmdArgs{Path: "/opt/cni/bin", StdinData: h.conf("1.1.0", `,"cni.dev/valid-attachments":[]`)}); err != nil {
		t.Fatalf("GC: %v", err)
	}
	if !nat.Owns("nomad", "live-elsewhere") {
		t.Fatal("the GC verb of a data dir that is not the plugin's released NAT rules it cannot prove are its own")
	}
	// The marker an ADD through the plugin writes first.
	records := filepath.Join(h.dataDir, ".nomad-bridge-cni", "nomad")
	if err := os.MkdirAll(records, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(records, ".owned"), []byte("nomad\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := h.plugin.Funcs().GC(&skel.CmdArgs{Path: "/opt/cni/bin", StdinData: h.conf("1.1.0", `,"cni.dev/valid-attachments":[]`)}); err != nil {
		t.Fatalf("GC: %v", err)
	}
	if nat.Owns("nomad", "live-elsewhere") {
		t.Error("the GC verb of the plugin's own network left orphan NAT rules")
	}
}

// bridge's DEL fails on a read-only data dir even with nothing to delete
// (host-local creates its directory first): the DEL succeeds when the
// network holds nothing of the attachment, and fails when it does.
func TestDelOnAReadOnlyDataDirWithNothingToDelete(t *testing.T) {
	h := newHarness(t, "bridge")
	h.exec.fail["bridge DEL"] = types.NewError(types.ErrInternal, "mkdir "+h.dataDir+"/nomad: read-only file system", "")
	if err := h.plugin.Funcs().Del(h.args(h.conf("1.0.0", ""))); err != nil {
		t.Errorf("DEL with nothing to delete on a read-only data dir: %v", err)
	}
	h.deadAttachment("c1", "172.26.64.5")
	if err := h.plugin.Funcs().Del(h.args(h.conf("1.0.0", ""))); err == nil {
		t.Error("DEL succeeded although the network still holds the attachment's lease and record")
	}
}

// A DEL whose bridge found every recorded address on the interface and
// succeeded lists the iptables tables no more (bridge tore their rules
// down, and fails while an earlier attachment's rule still uses the
// container's chain); one where bridge could not have (an address missing
// from the interface, no interface, bridge failing) lists them and
// releases what is left. bridge tears down the rules of the link's global
// unicast addresses only (ip.DelLinkByNameAddr): a recorded link-local one
// was not (regression: it counted as torn down).
func TestDelListsNATOnlyWhenBridgeCouldNotTearItDown(t *testing.T) {
	for _, tc := range []struct {
		name   string
		ip     string // the ADD's address (default 172.26.64.2)
		onLink []string
		fail   bool
		listed bool
	}{
		{name: "every address on the link", onLink: []string{"172.26.64.2"}, listed: false},
		{name: "no link", listed: true},
		{name: "another address on the link", onLink: []string{"172.26.64.3"}, listed: true},
		{name: "bridge fails", onLink: []string{"172.26.64.2"}, fail: true, listed: true},
		{name: "a link-local address on the link", ip: "169.254.3.2", onLink: []string{"169.254.3.2"}, listed: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, "bridge")
			ip := cmp.Or(tc.ip, "172.26.64.2")
			h.exec.reply["bridge ADD"] = strings.ReplaceAll(bridgeResult100, "172.26.64.2", ip)
			nat := fakenat.New()
			h.plugin.Reclaim.Netfilter = &netfilter.Cleaner{Tables: []netfilter.Table{nat}}
			stdin := h.conf("1.0.0", "")
			if err := h.plugin.Funcs().Add(h.args(stdin)); err != nil {
				t.Fatal(err)
			}
			nat.AddContainer("nomad", "c1", ip, 0)
			h.host.Links = map[string][]net.IP{}
			for _, ip := range tc.onLink {
				h.host.Links["/var/run/netns/x eth0"] = append(h.host.Links["/var/run/netns/x eth0"], net.ParseIP(ip))
			}
			if tc.fail {
				// bridge fails once (a leftover jump), then succeeds.
				h.exec.fail["bridge DEL"] = types.NewError(types.ErrInternal, "iptables -X: Device or resource busy", "")
				h.exec.onExec = func() {
					if n := len(h.exec.calls); n > 0 && h.exec.calls[n-1].Command == "DEL" && len(h.exec.calls) > 2 {
						delete(h.exec.fail, "bridge DEL")
					}
				}
			}
			nat.Calls = nil
			if err := h.plugin.Funcs().Del(h.args(stdin)); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			if listed := slices.Contains(nat.Calls, "list nat"); listed != tc.listed {
				t.Errorf("NAT listed: %v, want %v (calls %v)", listed, tc.listed, nat.Calls)
			}
			if tc.listed && nat.Owns("nomad", "c1") {
				t.Errorf("the container's NAT rules were listed but left: %v", nat.Chains)
			}
		})
	}
}

// With "logFile", a verb's refusal and (at debug) its start and end are
// JSON lines in the file, each naming the attachment; without it, nothing
// is opened; a log file that cannot be opened never fails the verb.
func TestLogFileGetsTheVerbsEvents(t *testing.T) {
	h := newHarness(t, "bridge")
	// The data dir is said to be off tmpfs, wherever t.TempDir() is (a
	// tmpfs /tmp on Debian 13), so that the warning is given.
	h.plugin.onTmpfs = func(ipamdir.Dir) (bool, int64, error) { return false, 0xef53, nil }
	logFile := filepath.Join(t.TempDir(), "nbc.log")
	h.exec.fail["bridge ADD"] = types.NewError(types.ErrTryAgainLater, "failed to allocate for range 0: 172.26.64.12 has been allocated to c1, duplicate allocation is not allowed", "d")
	if err := h.plugin.Funcs().Add(h.args(h.conf("1.0.0", `,"logFile":"`+logFile+`","logLevel":"debug"`))); err == nil {
		t.Fatal("Add succeeded")
	}
	b, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	var events []string
	for line := range strings.Lines(string(b)) {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		if m["command"] != "ADD" || m["network"] != "nomad" || m["containerID"] != "c1" || m["ifName"] != "eth0" {
			t.Errorf("line without the attachment: %v", m)
		}
		events = append(events, fmt.Sprint(m["event"]))
		if m["event"] == "refusal" && (m["code"] != float64(types.ErrTryAgainLater) || !strings.Contains(fmt.Sprint(m["message"]), "duplicate allocation is not allowed")) {
			t.Errorf("refusal line: %v", m)
		}
	}
	// The data dir is no tmpfs (onTmpfs above): the once-per-boot warning
	// is an event too.
	if strings.Join(events, " ") != "start warning refusal" || !strings.Contains(string(b), "is not on tmpfs") {
		t.Errorf("events %v, want start, the tmpfs warning, then the refusal:\n%s", events, b)
	}

	// The stderr lines go on reaching stderr; a log that cannot be
	// opened is a warning there, and the verb runs.
	delete(h.exec.fail, "bridge ADD")
	h.exec.reply["bridge ADD"] = bridgeResult100
	link := filepath.Join(t.TempDir(), "link.log")
	if err := os.Symlink(logFile, link); err != nil {
		t.Fatal(err)
	}
	h.stderr.Reset()
	if err := h.plugin.Funcs().Add(h.args(h.conf("1.0.0", `,"logFile":"`+link+`"`))); err != nil {
		t.Fatalf("Add with an unopenable log: %v", err)
	}
	if !strings.Contains(h.stderr.String(), "not a regular file; nothing is logged there") {
		t.Errorf("stderr: %q", h.stderr.String())
	}
}

// What the sweep keeps although the runtime did not list it (an ADD whose
// processes still run: the plugin killed, bridge on) is listed to
// host-local's GC, which would otherwise remove its lease under the ADD
// (regression: host-local got the runtime's list alone).
func TestGCListsToHostLocalWhatTheSweepKept(t *testing.T) {
	h := newHarness(t, "bridge", "host-local")
	h.host.Processes[777] = 55
	lease := h.attachment(&records.Record{Version: records.FormatVersion, Network: "nomad", ContainerID: "adding", IfName: "eth0", Netns: "/var/run/netns/x",
		BootID: "boot-1", State: records.Started, PID: 777, PIDStart: 55}, "172.26.64.7")
	stdin := h.conf("1.1.0", `,"cni.dev/valid-attachments":[{"containerID":"keep","ifname":"eth0"}]`)
	if err := h.plugin.Funcs().GC(&skel.CmdArgs{Path: "/opt/cni/bin", StdinData: stdin}); err != nil {
		t.Fatalf("GC: %v", err)
	}
	if gone(lease) {
		t.Fatal("the sweep released the lease of an ADD still running")
	}
	valid := h.hostLocalGCList()
	if valid != `[{"containerID":"keep","ifname":"eth0"},{"containerID":"adding","ifname":"eth0"}]` {
		t.Errorf("host-local GC valid attachments = %s, want the runtime's and the running ADD's", valid)
	}
}

// A sweep that could not judge the network (here the boot time cannot be
// read) leaves host-local's GC unsent: without the sweep's verdicts,
// host-local would remove the lease of an ADD still running.
func TestGCSendsHostLocalNothingWhenTheSweepCouldNotJudge(t *testing.T) {
	h := newHarness(t, "bridge", "host-local")
	h.served()
	h.host.BootErr = errors.New("/proc/stat: input/output error")
	if err := h.plugin.Funcs().GC(&skel.CmdArgs{Path: "/opt/cni/bin", StdinData: h.conf("1.1.0", "")}); err == nil || !strings.Contains(err.Error(), "input/output error") {
		t.Fatalf("GC error = %v, want the sweep's", err)
	}
	for _, call := range h.exec.calls {
		if call.Plugin == "host-local" {
			t.Error("host-local GC sent after a sweep that could not judge the network")
		}
	}
}

// A stale attachment whose NAT rules could not go keeps its lease and
// record, through which the next sweep finds them: host-local's GC must
// not take that lease either, or the address is handed out again while
// the old rules still point at it (regression: host-local's list had only
// the runtime's and the attachments judged pending or unknown).
func TestGCListsToHostLocalAStaleAttachmentWhoseRulesStayed(t *testing.T) {
	h := newHarness(t, "bridge", "host-local")
	nat := fakenat.New()
	h.plugin.Reclaim.Netfilter = &netfilter.Cleaner{Tables: []netfilter.Table{nat}}
	lease := h.deadAttachment("dead1", "172.26.64.9")
	nat.AddContainer("nomad", "dead1", "172.26.64.9", 0)
	// A jump no comment names: bridge's chain cannot be deleted.
	nat.Add("OUTPUT", "-j "+utils.FormatChainName("nomad", "dead1"))
	if err := h.plugin.Funcs().GC(&skel.CmdArgs{Path: "/opt/cni/bin", StdinData: h.conf("1.1.0", `,"cni.dev/valid-attachments":[]`)}); err == nil {
		t.Fatal("GC succeeded although a chain could not be deleted")
	}
	if gone(lease) {
		t.Fatal("the sweep released the lease of an attachment whose rules stayed")
	}
	valid := h.hostLocalGCList()
	if valid != `[{"containerID":"dead1","ifname":"eth0"}]` {
		t.Errorf("host-local GC valid attachments = %s, want the attachment the sweep kept", valid)
	}
}

// hostLocalGCList is the valid-attachments list of the last call, which
// must be host-local's GC.
func (h *harness) hostLocalGCList() string {
	h.t.Helper()
	call := h.exec.calls[len(h.exec.calls)-1]
	if call.Plugin != "host-local" || call.Command != "GC" {
		h.t.Fatalf("last call %s %s, want host-local GC", call.Plugin, call.Command)
	}
	valid, _ := json.Marshal(delegatedConf(h.t, call)["cni.dev/valid-attachments"])
	return string(valid)
}

// An ADD and a DEL with nothing wrong say nothing on stderr: runtimes log
// the plugins' stderr, and an operator reads a "warning" there as a fault
// to chase.
func TestPlainAddAndDelWarnOfNothing(t *testing.T) {
	h := newHarness(t, "bridge")
	h.exec.reply["bridge ADD"] = bridgeResult100
	// Wherever t.TempDir() is, the data dir is on tmpfs: the not-on-tmpfs
	// warning is not the one looked for.
	h.plugin.onTmpfs = func(ipamdir.Dir) (bool, int64, error) { return true, 0x01021994, nil }
	stdin := h.conf("1.0.0", "")
	if err := h.plugin.Funcs().Add(h.args(stdin)); err != nil {
		t.Fatalf("ADD: %v", err)
	}
	if strings.Contains(h.stderr.String(), "warning") {
		t.Errorf("a plain ADD warned: %q", h.stderr.String())
	}
	h.stderr.Reset()
	if err := h.plugin.Funcs().Del(h.args(stdin)); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	if strings.Contains(h.stderr.String(), "warning") {
		t.Errorf("a plain DEL warned: %q", h.stderr.String())
	}
}

// A DEL of an ID with no record, naming the namespace and ifname of one
// attached through the plugin (a runtime's stale cache), does not run
// bridge, which would delete the live container's interface; host-local
// is not run either, so the plugin itself releases the lease that names
// the DELed ID, as host-local's DEL would have, and keeps the live one's.
func TestDelOfAnotherIDInALiveAttachmentsPlaceReleasesItsLease(t *testing.T) {
	h := newHarness(t, "bridge")
	h.exec.reply["bridge ADD"] = bridgeResult100
	stdin := h.conf("1.0.0", "")
	if err := h.plugin.Funcs().Add(h.args(stdin)); err != nil {
		t.Fatalf("ADD: %v", err)
	}
	live := filepath.Join(h.dataDir, "nomad", "172.26.64.2")
	mkdir(t, filepath.Dir(live))
	if err := os.WriteFile(live, []byte("c1\r\neth0"), 0o600); err != nil {
		t.Fatal(err)
	}
	stray := filepath.Join(h.dataDir, "nomad", "172.26.64.7")
	if err := os.WriteFile(stray, []byte("stale\r\neth0"), 0o600); err != nil {
		t.Fatal(err)
	}
	h.exec.calls = nil
	args := h.args(stdin)
	args.ContainerID = "stale"
	if err := h.plugin.Funcs().Del(args); err != nil {
		t.Fatalf("DEL of the stale ID: %v", err)
	}
	if len(h.exec.calls) != 0 {
		t.Errorf("delegates run in the live container's namespace: %+v", h.exec.calls)
	}
	if !gone(stray) {
		t.Error("the DELed ID's lease was kept")
	}
	if gone(live) {
		t.Error("the live container's lease was released")
	}
}

// STATUS and CHECK with nothing wrong say nothing on stderr: Nomad asks
// STATUS before every teardown and CHECK on every restore, and logs the
// plugins' stderr; a "warning" there sends the operator after a fault that
// is not there.
func TestPlainStatusAndCheckWarnOfNothing(t *testing.T) {
	h := newHarness(t, "bridge")
	h.served()
	if err := h.plugin.Funcs().Status(&skel.CmdArgs{StdinData: h.conf("1.1.0", "")}); err != nil {
		t.Fatalf("STATUS: %v", err)
	}
	if h.stderr.Len() != 0 {
		t.Errorf("a STATUS on a usable data dir said %q", h.stderr.String())
	}
	h.stderr.Reset()
	if err := h.plugin.Funcs().Check(h.args(h.conf("1.0.0", `,"prevResult":`+bridgeResult100))); err != nil {
		t.Fatalf("CHECK: %v", err)
	}
	if strings.Contains(h.stderr.String(), "warning") {
		t.Errorf("a plain CHECK warned: %q", h.stderr.String())
	}
}

// GC's one failure keeps its CNI code (a runtime acts on it, e.g. 11: try
// again later); only several fold into an internal error.
func TestGCKeepsTheCodeOfItsOnlyFailure(t *testing.T) {
	h := newHarness(t, "bridge", "host-local")
	h.served()
	h.exec.fail["bridge GC"] = types.NewError(types.ErrTryAgainLater, "busy", "")
	err := h.plugin.Funcs().GC(&skel.CmdArgs{StdinData: h.conf("1.1.0", "")})
	var cniErr *types.Error
	if !errors.As(err, &cniErr) || cniErr.Code != types.ErrTryAgainLater {
		t.Errorf("GC error = %#v, want bridge's, code %d", err, types.ErrTryAgainLater)
	}
}

// CNI_CONTAINERID and CNI_IFNAME may be maxKeyLength bytes together (with
// the separator), not one more: the record's file name must fit.
func TestAddTakesKeysUpToTheLimit(t *testing.T) {
	for _, tc := range []struct {
		idLen int
		code  uint // 0: accepted
	}{
		{maxKeyLength - 1 - len("eth0"), 0},
		{maxKeyLength - len("eth0"), types.ErrInvalidEnvironmentVariables},
	} {
		t.Run(fmt.Sprint(tc.idLen), func(t *testing.T) {
			h := newHarness(t, "bridge")
			h.exec.reply["bridge ADD"] = bridgeResult100
			args := h.args(h.conf("1.0.0", ""))
			args.ContainerID = strings.Repeat("c", tc.idLen)
			err := h.plugin.Funcs().Add(args)
			var cniErr *types.Error
			switch {
			case tc.code == 0 && err != nil:
				t.Errorf("ADD of a %d-byte key refused: %v", tc.idLen+1+len("eth0"), err)
			case tc.code != 0 && (!errors.As(err, &cniErr) || cniErr.Code != tc.code):
				t.Errorf("ADD of a %d-byte key: %v, want code %d", tc.idLen+1+len("eth0"), err, tc.code)
			}
		})
	}
}

// The GC verb releases every attachment the runtime did not list, a live
// one too (its namespace still there): the runtime's list is the verdict,
// not the namespace (host-local's semantics). Its lease, NAT rules and
// record go; a listed one keeps all of them.
func TestGCReleasesALiveAttachmentTheRuntimeDidNotList(t *testing.T) {
	h := newHarness(t, "bridge", "host-local")
	h.exec.reply["bridge ADD"] = bridgeResult100
	nat := fakenat.New()
	h.plugin.Reclaim.Netfilter = &netfilter.Cleaner{Tables: []netfilter.Table{nat}}
	if err := h.plugin.Funcs().Add(h.args(h.conf("1.0.0", ""))); err != nil {
		t.Fatalf("ADD: %v", err)
	}
	nat.AddContainer("nomad", "c1", "172.26.64.2", 0)
	lease := filepath.Join(h.dataDir, "nomad", "172.26.64.2")
	mkdir(t, filepath.Dir(lease))
	if err := os.WriteFile(lease, []byte("c1\r\neth0"), 0o600); err != nil {
		t.Fatal(err)
	}
	listed := h.conf("1.1.0", `,"cni.dev/valid-attachments":[{"containerID":"c1","ifname":"eth0"}]`)
	if err := h.plugin.Funcs().GC(&skel.CmdArgs{Path: "/opt/cni/bin", StdinData: listed}); err != nil {
		t.Fatalf("GC listing c1: %v", err)
	}
	if gone(lease) || !nat.Owns("nomad", "c1") || h.record() == nil {
		t.Fatal("GC released an attachment the runtime listed")
	}
	unlisted := h.conf("1.1.0", `,"cni.dev/valid-attachments":[{"containerID":"other","ifname":"eth0"}]`)
	if err := h.plugin.Funcs().GC(&skel.CmdArgs{Path: "/opt/cni/bin", StdinData: unlisted}); err != nil {
		t.Fatalf("GC not listing c1: %v", err)
	}
	if !gone(lease) {
		t.Error("GC kept the lease of an attachment the runtime did not list")
	}
	if nat.Owns("nomad", "c1") {
		t.Errorf("GC kept the NAT rules of an attachment the runtime did not list: %v", nat.Chains)
	}
	if r := h.record(); r != nil {
		t.Errorf("GC kept the record of an attachment the runtime did not list: %+v", r)
	}
}

// An ADD that bridge refuses on a network the plugin never served leaves
// nothing behind: not the data dir, nor the record directory and its marker
// (which would make the network's NAT rules the plugin's to release). One
// that succeeds keeps its record.
func TestFailedAddOnANewNetworkLeavesNothing(t *testing.T) {
	h := newHarness(t, "bridge")
	h.plugin.onTmpfs = func(ipamdir.Dir) (bool, int64, error) { return true, 0x01021994, nil }
	h.exec.fail["bridge ADD"] = types.NewError(types.ErrInvalidNetworkConfig, "invalid hairpinMode", "")
	if err := h.plugin.Funcs().Add(h.args(h.conf("1.0.0", ""))); err == nil {
		t.Fatal("ADD succeeded although bridge failed")
	}
	if _, err := os.Lstat(h.dataDir); !os.IsNotExist(err) {
		entries, _ := os.ReadDir(h.dataDir)
		t.Errorf("the failed ADD left the data dir (%v): %v", err, entries)
	}
	delete(h.exec.fail, "bridge ADD")
	h.exec.reply["bridge ADD"] = bridgeResult100
	if err := h.plugin.Funcs().Add(h.args(h.conf("1.0.0", ""))); err != nil {
		t.Fatalf("ADD: %v", err)
	}
	if r := h.record(); r == nil || r.State != records.Complete {
		t.Errorf("record after a successful ADD: %+v", r)
	}
}
