package doctor

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// Nomad keeps the version of the last cni_path directory's bridge that
// prints one; a front copy's output does not matter then, an output
// without a version records nothing, and an empty or unreadable
// directory ends the scan.
func TestNomadRecordedBridge(t *testing.T) {
	root := t.TempDir()
	dir := func(name string, bridgePrints string) string {
		d := filepath.Join(root, name)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if bridgePrints != "" {
			if err := os.WriteFile(filepath.Join(d, "bridge"), []byte(bridgePrints), 0o755); err != nil {
				t.Fatal(err)
			}
		} else if err := os.WriteFile(filepath.Join(d, "other"), nil, 0o755); err != nil {
			t.Fatal(err)
		}
		return d
	}
	front := dir("front", "CNI bridge plugin version unknown\nCNI protocol versions supported: 0.1.0, 0.2.0, 1.1.0\nCNI nomad-bridge-cni plugin v0.1.0, in front of /usr/lib/cni/bridge\n")
	quiet := dir("quiet", "CNI nomad-bridge-cni plugin (nomad-bridge-cni@v0.1.0) installed as bridge\nCNI protocol versions supported: 0.3.0, 1.1.0.\n")
	stamped := dir("opt", "CNI bridge plugin v1.10.0\nCNI protocol versions supported: 0.1.0, 1.1.0\n")
	noBridge := dir("nobridge", "")
	empty := filepath.Join(root, "empty")
	if err := os.MkdirAll(empty, 0o755); err != nil {
		t.Fatal(err)
	}
	version := func(path string) (string, error) {
		b, err := os.ReadFile(path)
		return string(b), err
	}
	for _, c := range []struct {
		path      []string
		want, frm string
	}{
		{[]string{front, stamped}, "v1.10.0", stamped},
		{[]string{stamped, front}, "1.1.0", front},
		{[]string{stamped, quiet}, "v1.10.0", stamped},
		{[]string{quiet}, "", ""},
		{[]string{stamped, noBridge}, "v1.10.0", stamped},
		{[]string{front, empty, stamped}, "1.1.0", front},
		{[]string{filepath.Join(root, "absent"), stamped}, "", ""},
	} {
		v, from, _ := nomadRecordedBridge(c.path, version)
		if v != c.want || (c.frm != "" && from != filepath.Join(c.frm, "bridge")) {
			t.Errorf("cni_path %q: recorded %q from %q, want %q from %s", c.path, v, from, c.want, c.frm)
		}
	}
}

// The client's settings come from its configuration files, a later file
// winning, HCL or JSON; from the agent's API; else Nomad's defaults.
func TestNomadClientSettings(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("10-client.hcl", `client {
  enabled = true
  # cni_path = "/commented/out"
  cni_path       = "/opt/nbc/bin:/opt/cni/bin"
  bridge_network_subnet = "10.99.0.0/20"
}
`)
	write("20-net.json", `{"client": {"bridge_network_name": "nbr0", "bridge_network_subnet_ipv6": "fd99::/64"}}`)
	write("30-other.hcl", `server { enabled = true }`)
	write("notes.txt", `cni_config_dir = "/ignored"`)
	nc, ok := readNomadConfigDir(dir)
	if !ok {
		t.Fatal("no settings read")
	}
	want := NomadClient{Source: filepath.Join(dir, "10-client.hcl") + ", " + filepath.Join(dir, "20-net.json"),
		CNIPath: []string{"/opt/nbc/bin", "/opt/cni/bin"}, CNIConfigDir: "/opt/cni/config", BridgeName: "nbr0",
		Subnets: []netip.Prefix{netip.MustParsePrefix("10.99.0.0/20"), netip.MustParsePrefix("fd99::/64")}}
	if nc.Source != want.Source || !slices.Equal(nc.CNIPath, want.CNIPath) || nc.CNIConfigDir != want.CNIConfigDir || nc.BridgeName != want.BridgeName || !slices.Equal(nc.Subnets, want.Subnets) {
		t.Errorf("read %+v\nwant %+v", nc, want)
	}
	if _, ok := readNomadConfigDir(filepath.Join(dir, "absent")); ok {
		t.Error("settings read from a directory that does not exist")
	}

	self := `{"config": {"Client": {"CNIPath": "/a:/b", "CNIConfigDir": "/etc/cni/nomad", "BridgeNetworkName": "", "BridgeNetworkSubnet": "172.30.0.0/16"}}}`
	nc, err := parseAgentSelf([]byte(self))
	if err != nil || !slices.Equal(nc.CNIPath, []string{"/a", "/b"}) || nc.CNIConfigDir != "/etc/cni/nomad" || nc.BridgeName != "nomad" || nc.Subnets[0].String() != "172.30.0.0/16" || !strings.Contains(nc.Source, "API") {
		t.Errorf("from the API: %+v, %v", nc, err)
	}
	if _, err := parseAgentSelf([]byte(`{"config": {}}`)); err == nil {
		t.Error("a server-only agent's settings were read")
	}
	if d := NomadDefaults(); !slices.Equal(d.CNIPath, []string{"/opt/cni/bin"}) || d.BridgeName != "nomad" || d.Subnets[0].String() != "172.26.64.0/20" {
		t.Errorf("defaults %+v", d)
	}
}

// With Nomad, the doctor looks where the client does: its cni_path (unless
// one was given) and its cni_config_dir, and its built-in network is the
// client's bridge and subnet in the clash check.
func TestDoctorUsesTheNomadClientsSettings(t *testing.T) {
	h := newHost(t)
	h.nomad = true
	nomadConf := filepath.Join(h.root, "nomad-cni")
	if err := os.MkdirAll(nomadConf, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(nomadConf, "web.conflist"), []byte(strings.ReplaceAll(conf("web", pluginName, "nbc0", "10.99.0.0/24", "host-local"), "DATA", h.data)), 0o644); err != nil {
		t.Fatal(err)
	}
	r := Run(Options{
		ConfDirs: []string{h.conf}, CNIPath: []string{"/nowhere"}, Nomad: true, EUID: 1000,
		NomadClient: func() NomadClient {
			nc := nomadSettings{CNIPath: h.bin, CNIConfigDir: nomadConf, BridgeName: "nbr0", Subnet: "10.99.0.0/20"}.resolve("test")
			return nc
		},
		Version:   func(path string) (string, error) { return h.versions[filepath.Base(path)], nil },
		OnTmpfs:   func(string) (bool, error) { return true, nil },
		FreeBytes: func(string) (uint64, error) { return 1 << 30, nil },
	})
	text := findings(r)
	for _, want := range []string{
		"nomad: client: settings from test: cni_path " + h.bin + ", cni_config_dir " + nomadConf + ", bridge nbr0, subnets 10.99.0.0/20",
		"nomad: bridge: Nomad records bridge v1.10.0 (from " + filepath.Join(h.bin, "bridge"),
		"conflist: " + filepath.Join(nomadConf, "web.conflist") + ": network \"web\" uses",
		"plugin: " + filepath.Join(h.bin, "bridge") + ": version v1.10.0",
		"10.99.0.0/24 overlaps 10.99.0.0/20 of \"web\"",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("no %q in:\n%s", want, text)
		}
	}
}
