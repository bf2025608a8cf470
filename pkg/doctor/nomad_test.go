package doctor

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/ipamdir"
)

// Nomad keeps the version of the last cni_path directory's bridge that
// prints one; a front copy's output does not matter then, and an output
// without a version records nothing. An empty or unreadable directory is
// passed by Nomad 1.11.2 and later, and ends the scan of older ones.
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
	absent := filepath.Join(root, "absent")
	version := func(path string) (string, error) {
		b, err := os.ReadFile(path)
		return string(b), err
	}
	for _, c := range []struct {
		path []string
		// want and frm: Nomad 1.11.2 and later; old and oldFrm, earlier
		// ones, which stop at stop.
		want, frm, old, oldFrm, stop string
	}{
		{[]string{front, stamped}, "v1.10.0", stamped, "v1.10.0", stamped, ""},
		{[]string{stamped, front}, "1.1.0", front, "1.1.0", front, ""},
		{[]string{stamped, quiet}, "v1.10.0", stamped, "v1.10.0", stamped, ""},
		{[]string{quiet}, "", "", "", "", ""},
		{[]string{stamped, noBridge}, "v1.10.0", stamped, "v1.10.0", stamped, ""},
		{[]string{front, empty, stamped}, "v1.10.0", stamped, "1.1.0", front, empty},
		{[]string{absent, stamped}, "v1.10.0", stamped, "", "", absent},
		{[]string{empty, stamped}, "v1.10.0", stamped, "", "", empty},
	} {
		rec, stop, _ := nomadRecordedBridge(c.path, version, false)
		if rec.Version != c.want || (c.frm != "" && rec.From != filepath.Join(c.frm, "bridge")) || stop != "" {
			t.Errorf("cni_path %q, Nomad 1.11.2: recorded %+v, stopped at %q; want %q from %s", c.path, rec, stop, c.want, c.frm)
		}
		rec, stop, _ = nomadRecordedBridge(c.path, version, true)
		if rec.Version != c.old || (c.oldFrm != "" && rec.From != filepath.Join(c.oldFrm, "bridge")) || stop != c.stop {
			t.Errorf("cni_path %q, Nomad 1.11.1: recorded %+v, stopped at %q; want %q from %s, stopped at %q", c.path, rec, stop, c.old, c.oldFrm, c.stop)
		}
	}
}

// Nomad changed its fingerprint's rule in 1.11.2 (2.x too).
func TestNomadStops(t *testing.T) {
	for v, want := range map[string][2]bool{
		"1.10.5": {true, true}, "1.11.1": {true, true}, "v1.11.1": {true, true}, "0.12.0": {true, true},
		"1.11.2": {false, true}, "1.11.2-dev": {false, true}, "1.12.0": {false, true}, "2.0.6-dev": {false, true}, "2.0.0+ent": {false, true},
		"": {false, false}, "unknown": {false, false},
	} {
		if stops, known := nomadStops(v); stops != want[0] || known != want[1] {
			t.Errorf("Nomad %q: stops %v, known %v; want %v", v, stops, known, want)
		}
	}
	for out, want := range map[string]string{
		"Nomad v2.0.6-dev\nBuildDate 2026-11-30T10:00:00Z\nRevision abc\n": "2.0.6-dev",
		"Nomad v1.10.5+ent\n": "1.10.5+ent",
		// Before 1.3, the revision followed on the same line.
		"Nomad v1.2.6 (a6c6b475db5073e33885377b4a5c733e1161020d)\n": "1.2.6",
		"nomad: command not found":                                  "",
	} {
		if v, err := parseNomadVersion(out); v != want || (err != nil) != (want == "") {
			t.Errorf("nomad version printed %q: read %q, %v; want %q", out, v, err, want)
		}
	}
}

// The doctor judges Nomad's fingerprint by the agent's version: cni_path
// starts with an empty directory (regression: Nomad 2.0.6-dev recorded
// bridge v1.10.0 and sent CHECK, the doctor said it recorded nothing).
// Unknown, the doctor judges it as a recent Nomad does, and says what an
// older one records instead.
func TestDoctorJudgesNomadsFingerprintByItsVersion(t *testing.T) {
	h := newHost(t)
	empty := filepath.Join(h.root, "empty")
	if err := os.MkdirAll(empty, 0o755); err != nil {
		t.Fatal(err)
	}
	cniPath := []string{empty, h.bin}
	bridge := func(version string) Finding {
		nc := nomadSettings{CNIPath: strings.Join(cniPath, ":"), CNIConfigDir: h.conf}.resolve("test")
		nc.Version, nc.VersionSource = version, "the test"
		return h.nomadBridgeFinding(nc)
	}
	recorded := "Nomad records bridge v1.10.0 (from " + filepath.Join(h.bin, "bridge") + ", the last bridge of cni_path " + empty + ":" + h.bin + " that prints a version): it sends CHECK on restore"
	for _, c := range []struct {
		version string
		level   Level
		message string
		fix     string
	}{
		{"2.0.6-dev", OK, recorded, ""},
		{"1.11.2", OK, recorded, ""},
		{"", OK, recorded + " if the agent is Nomad 1.9.5 or later (1.8.10 and 1.7.18 Enterprise): earlier ones never send it (the agent's version is unknown); judged as Nomad 1.11.2 and later read cni_path (the agent's version is unknown: the test): an older Nomad reads no further than " + empty + " (empty), and records no version of bridge instead, and never sends CHECK", ""},
		{"1.11.1", Warn, "Nomad records no version of bridge from cni_path " + empty + ":" + h.bin + ": it never sends CHECK (no CHECK-time sweep), and places no group with network mode \"bridge\" on this node (servers from Nomad 1.8.0 constrain each to attr.plugins.cni.version.bridge semver >= 0.4.0; \"cni/\" modes are not constrained); Nomad 1.11.1, as every Nomad before 1.11.2, reads no further than " + empty + " (empty)",
			"take " + empty + " out of cni_path (or fill it, or make it readable), or upgrade Nomad to 1.11.2 or later, which reads on and records bridge v1.10.0 (from " + filepath.Join(h.bin, "bridge") + ")"},
	} {
		f := bridge(c.version)
		if f.Level != c.level || f.Message != c.message || f.Fix != c.fix {
			t.Errorf("Nomad %q:\n got %s: %s\n fix: %s\nwant %s: %s\n fix: %s", c.version, f.Level, f.Message, f.Fix, c.level, c.message, c.fix)
		}
	}
}

// A CNI path given to the doctor (--cni-path, CNI_PATH) is what its
// nomad: lines read, and they say so (regression: they read the agent's
// cni_path).
func TestDoctorNomadLinesReadTheGivenCNIPath(t *testing.T) {
	h := newHost(t)
	r := Run(Options{
		ConfDirs: []string{h.conf}, CNIPath: []string{h.bin}, CNIPathGiven: true, Nomad: true, EUID: 1000,
		NomadClient: func() NomadClient { return nomadSettings{CNIPath: "/nowhere", CNIConfigDir: h.conf}.resolve("test") },
		Version:     func(path string) (string, error) { return h.versions[filepath.Base(path)], nil },
		OnTmpfs:     func(string) (bool, error) { return true, nil },
		Free:        func(string) (Room, error) { return plenty, nil },
	})
	text := findings(r)
	for _, want := range []string{
		"✓ nomad: client: settings from test: cni_path /nowhere, cni_config_dir " + h.conf + ", bridge nomad, subnets 172.26.64.0/20; the doctor reads the CNI path given (--cni-path or CNI_PATH) " + h.bin + " in place of the agent's cni_path\n",
		"✓ nomad: bridge: Nomad records bridge v1.10.0 (from " + filepath.Join(h.bin, "bridge") + ", the last bridge of the CNI path given (--cni-path or CNI_PATH) " + h.bin + " that prints a version): it sends CHECK on restore if the agent is Nomad 1.9.5 or later (1.8.10 and 1.7.18 Enterprise): earlier ones never send it (the agent's version is unknown)\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("no %q in:\n%s", want, text)
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
	if nc.Version != "" {
		t.Errorf("a version read from an API that gives none: %q", nc.Version)
	}
	self = `{"config": {"Client": {"CNIPath": "/a"}, "Version": {"Revision": "abc", "Version": "2.0.6", "VersionPrerelease": "dev", "VersionMetadata": ""}}}`
	if nc, err := parseAgentSelf([]byte(self)); err != nil || nc.Version != "2.0.6-dev" || nc.VersionSource != "the agent's API" {
		t.Errorf("the agent's version: %q from %q, %v", nc.Version, nc.VersionSource, err)
	}
	if _, err := parseAgentSelf([]byte(`{"config": {}}`)); err == nil {
		t.Error("a server-only agent's settings were read")
	}
	if d := NomadDefaults(); !slices.Equal(d.CNIPath, []string{"/opt/cni/bin", "/usr/libexec/cni"}) || d.BridgeName != "nomad" || d.Subnets[0].String() != "172.26.64.0/20" {
		t.Errorf("defaults %+v", d)
	}
}

// Nomad reads its configuration files with HCL 1, whose JSON form takes a
// block as an object or as a list of objects (json/parser flattenListType;
// Nomad's own command/agent/testdata/basic.json writes "client": [{…}]),
// each decoded in turn into the one client, a later one's setting winning;
// and a file is JSON when its first character that is not white space is
// "{" (hcl lexMode), whatever its name (regression: "client": [{…}] was not
// read, and the doctor silently took Nomad's defaults).
func TestNomadClientSettingsInJSONLists(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("c.json", `{"client":[{"cni_path":"/x"}]}`)
	nc, ok := readNomadConfigDir(dir)
	if !ok || !slices.Equal(nc.CNIPath, []string{"/x"}) || nc.Source != filepath.Join(dir, "c.json") {
		t.Fatalf(`{"client":[{"cni_path":"/x"}]}: read %v, %+v`, ok, nc)
	}
	write("d.json", `{"server": [{"enabled": true}], "client": [
	  {"enabled": true, "cni_config_dir": "/etc/cni/nomad", "bridge_network_name": "first"},
	  {"bridge_network_name": "nbr0"}]}`)
	write("e.hcl", "\n  {\"client\": {\"bridge_network_subnet\": \"10.99.0.0/20\"}}\n")
	nc, ok = readNomadConfigDir(dir)
	want := NomadClient{CNIPath: []string{"/x"}, CNIConfigDir: "/etc/cni/nomad", BridgeName: "nbr0", Subnets: []netip.Prefix{netip.MustParsePrefix("10.99.0.0/20")}}
	if !ok || !slices.Equal(nc.CNIPath, want.CNIPath) || nc.CNIConfigDir != want.CNIConfigDir || nc.BridgeName != want.BridgeName || !slices.Equal(nc.Subnets, want.Subnets) {
		t.Errorf("read %+v\nwant %+v", nc, want)
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
			nc := nomadSettings{CNIPath: h.bin, CNIConfigDir: nomadConf, BridgeNetworkName: "nbr0", BridgeNetworkSubnet: "10.99.0.0/20"}.resolve("test")
			return nc
		},
		Version: func(path string) (string, error) { return h.versions[filepath.Base(path)], nil },
		OnTmpfs: func(string) (bool, error) { return true, nil },
		Free:    func(string) (Room, error) { return plenty, nil },
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

// Nomad reads versions with hashicorp/go-version: the fingerprint keeps
// the first token NewSemver accepts (four numbers too, a letter suffix
// without its "-" not), and CHECK is sent for what meets ">= 1.3.0",
// which takes "1.3" and "2" and never a pre-release (regression: the
// doctor said a bridge printing "1.3" never gets CHECK, and one printing
// "v1.4.0-rc.1" does).
func TestDoctorReadsBridgeVersionsAsNomadDoes(t *testing.T) {
	for v, want := range map[string]bool{
		"v1.3.0": true, "1.3": true, "2": true, "v1.10.0": true, "v1.3.0+build.5": true,
		"v1.2.9": false, "v1.4.0-rc.1": false, "v0.1.0-git117.ga2a9f7c": false,
	} {
		if got := sendsCheck(v); got != want {
			t.Errorf("bridge %q: sends CHECK %v, want %v", v, got, want)
		}
	}
	root := t.TempDir()
	version := func(path string) (string, error) {
		b, err := os.ReadFile(path)
		return string(b), err
	}
	for prints, want := range map[string]string{
		"CNI bridge plugin v1.2.3.4\n": "v1.2.3.4",
		"CNI bridge plugin 1.7rc2\n":   "",
	} {
		d := t.TempDir()
		if err := os.WriteFile(filepath.Join(d, "bridge"), []byte(prints), 0o755); err != nil {
			t.Fatal(err)
		}
		if rec, _, _ := nomadRecordedBridge([]string{root, d}, version, false); rec.Version != want {
			t.Errorf("bridge printing %q: recorded %q, want %q", prints, rec.Version, want)
		}
	}

	h := newHost(t)
	h.nomad = true
	h.plugin("bridge", "CNI bridge plugin v1.4.0-rc.1\n")
	want := Finding{Level: Warn, Check: "nomad", Subject: "bridge", Message: "Nomad records bridge v1.4.0-rc.1 (from " + filepath.Join(h.bin, "bridge") + ", the last bridge of cni_path " + h.bin + " that prints a version): a pre-release, which Nomad's \">= 1.3.0\" never takes, so it never sends CHECK (no CHECK-time sweep)",
		Fix: "replace " + filepath.Join(h.bin, "bridge") + " with the reference plugins, stamped with their version (make plugins)"}
	if r := h.run(); !slices.Contains(r.Findings, want) {
		t.Errorf("no finding\n%+v\nin:\n%s", want, findings(r))
	}
}

// cni_path's default depends on the agent's version: Nomad 1.11.2 made it
// "/opt/cni/bin:/usr/libexec/cni" (client/config/config_linux.go
// DefaultCNIPath, #27336); v1.11.1's is "/opt/cni/bin". Where the API
// cannot be read and no configuration file sets cni_path, the default is
// the one of the version `nomad version` prints, read after the settings
// (regression: the doctor took "/opt/cni/bin" whatever the version).
// Unknown, it is the newer one, whose first directory is the older one's,
// and the client line says so.
func TestNomadDefaultCNIPathFollowsTheAgentsVersion(t *testing.T) {
	conf := t.TempDir()
	if err := os.WriteFile(filepath.Join(conf, "client.hcl"), []byte("client {\n  bridge_network_name = \"nbr0\"\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	t.Setenv("PATH", bin)
	for _, c := range []struct {
		prints string // by `nomad version`; "" no nomad CLI
		want   []string
		client string
	}{
		{"Nomad v1.11.1", []string{"/opt/cni/bin"}, "cni_path /opt/cni/bin (Nomad 1.11.1's default), "},
		{"Nomad v1.11.2", []string{"/opt/cni/bin", "/usr/libexec/cni"}, "cni_path /opt/cni/bin:/usr/libexec/cni (Nomad 1.11.2's default), "},
		{"Nomad v2.0.5", []string{"/opt/cni/bin", "/usr/libexec/cni"}, "cni_path /opt/cni/bin:/usr/libexec/cni (Nomad 2.0.5's default), "},
		{"", []string{"/opt/cni/bin", "/usr/libexec/cni"}, "cni_path /opt/cni/bin:/usr/libexec/cni (Nomad's default from 1.11.2, the agent's version unknown; before 1.11.2, /opt/cni/bin), "},
	} {
		os.Remove(filepath.Join(bin, "nomad"))
		if c.prints != "" {
			script := "#!/bin/sh\n[ \"$1\" = version ] || { echo 'Error querying agent: 403 Forbidden' >&2; exit 1; }\necho '" + c.prints + "'\n"
			if err := os.WriteFile(filepath.Join(bin, "nomad"), []byte(script), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		nc := nomadClient(conf)
		if !slices.Equal(nc.CNIPath, c.want) || nc.BridgeName != "nbr0" {
			t.Errorf("%q: cni_path %q, bridge %q; want %q, nbr0", c.prints, nc.CNIPath, nc.BridgeName, c.want)
		}
		for _, dir := range []string{conf, filepath.Join(conf, "absent")} {
			nc := nomadClient(dir)
			if !slices.Equal(nc.CNIPath, c.want) {
				t.Errorf("%q, settings from %s: cni_path %q; want %q", c.prints, nc.Source, nc.CNIPath, c.want)
			}
			f := checkNomad(Options{Version: func(string) (string, error) { return "", nil }}, nc)[0]
			if !strings.Contains(f.Message, c.client) {
				t.Errorf("%q: client finding %q lacks %q", c.prints, f.Message, c.client)
			}
		}
	}
	nc := nomadSettings{CNIPath: "/opt/nbc/bin"}.resolve("test")
	nc.setVersion("1.11.1", "the test")
	if f := checkNomad(Options{Version: func(string) (string, error) { return "", nil }}, nc)[0]; !slices.Equal(nc.CNIPath, []string{"/opt/nbc/bin"}) || strings.Contains(f.Message, "default") {
		t.Errorf("a cni_path set: %q, %q", nc.CNIPath, f.Message)
	}
}

// Nomad sends CHECK on restore from 1.9.5 (#24658: v1.9.5
// client/allocrunner/networking_cni.go; v1.9.4's network_hook.go calls
// Setup only for a namespace it created), 1.8.10 and 1.7.18 Enterprise:
// an older agent never does, whatever it records for bridge (regression:
// the doctor said "it sends CHECK on restore" from the record alone).
// Unknown, the doctor says which Nomads do.
func TestDoctorSaysWhichNomadsSendCheck(t *testing.T) {
	h := newHost(t)
	run := func(version string) Finding {
		nc := nomadSettings{CNIPath: h.bin, CNIConfigDir: h.conf}.resolve("test")
		nc.setVersion(version, "the test")
		return h.nomadBridgeFinding(nc)
	}
	recorded := "Nomad records bridge v1.10.0 (from " + filepath.Join(h.bin, "bridge") + ", the last bridge of cni_path " + h.bin + " that prints a version): it sends CHECK on restore"
	for _, v := range []string{"1.9.5", "1.10.0", "2.0.5", "1.8.10", "1.8.21+ent", "1.7.18"} {
		if f := run(v); f.Level != OK || f.Message != recorded || f.Fix != "" {
			t.Errorf("Nomad %s: %s: %s (fix: %s); want ok: %s", v, f.Level, f.Message, f.Fix, recorded)
		}
	}
	for _, v := range []string{"1.9.4", "1.9.0", "1.8.4", "1.8.9", "1.7.17", "1.6.0"} {
		want := Finding{Level: Warn, Check: "nomad", Subject: "bridge",
			Message: "Nomad " + v + " never sends CHECK on restore (no CHECK-time sweep), whatever it records for bridge, here bridge v1.10.0 (from " + filepath.Join(h.bin, "bridge") + "): Nomad sends it from 1.9.5 (1.8.10 and 1.7.18 Enterprise)",
			Fix:     "upgrade Nomad to 1.9.5 or later"}
		if f := run(v); f != want {
			t.Errorf("Nomad %s:\n got %s: %s\n fix: %s\nwant %s: %s\n fix: %s", v, f.Level, f.Message, f.Fix, want.Level, want.Message, want.Fix)
		}
	}
	if f, want := run(""), recorded+" if the agent is Nomad 1.9.5 or later (1.8.10 and 1.7.18 Enterprise): earlier ones never send it (the agent's version is unknown: the test)"; f.Level != OK || f.Message != want {
		t.Errorf("Nomad unknown: %s: %s\nwant ok: %s", f.Level, f.Message, want)
	}
	h.plugin("bridge", "CNI bridge plugin version unknown\nCNI protocol versions supported: 0.1.0, 0.2.0, 1.1.0\n")
	if f, fix := run("1.9.4"), "upgrade Nomad to 1.9.5 or later; then replace "+filepath.Join(h.bin, "bridge")+" with the reference plugins, stamped with their version (make plugins)"; f.Level != Warn || f.Fix != fix {
		t.Errorf("Nomad 1.9.4, bridge 1.1.0: %s: %s\n fix: %s\nwant fix: %s", f.Level, f.Message, f.Fix, fix)
	}
}

// Nomad's built-in bridge network keeps host-local's leases in
// /var/run/cni from 1.9.4 (#24650: v1.9.4 client/allocrunner/cni/bridge.go
// DataDir; v1.9.3 sets none, so host-local's default), 1.8.8 and 1.7.16
// Enterprise (regression: the doctor said /var/run/cni/nomad for every
// version). The plugin installed as bridge in front keeps them in its own
// dataDir, /var/run/cni, whatever the version.
func TestDoctorFindsNomadsLeasesByItsVersion(t *testing.T) {
	h := newHost(t)
	h.conflist("10-web.conflist", conf("web", pluginName, "nbc0", "172.26.64.0/24", "host-local"))
	frontDir := filepath.Join(h.root, "front")
	h.frontCopy(frontDir)
	version := h.version
	for _, front := range []bool{false, true} {
		cniPath := []string{h.bin}
		if front {
			cniPath = []string{frontDir, h.bin}
		}
		for v, want := range map[string]string{
			"1.9.3": ipamdir.DefaultLegacyDataDir, "1.8.4": ipamdir.DefaultLegacyDataDir, "1.8.7": ipamdir.DefaultLegacyDataDir, "1.7.15": ipamdir.DefaultLegacyDataDir,
			"1.9.4": ipamdir.DefaultDataDir, "1.8.8": ipamdir.DefaultDataDir, "1.7.16": ipamdir.DefaultDataDir, "2.0.5": ipamdir.DefaultDataDir, "": ipamdir.DefaultDataDir,
		} {
			r := Run(Options{
				ConfDirs: []string{h.conf}, CNIPath: cniPath, CNIPathGiven: true, Nomad: true, EUID: 1000,
				NomadClient: func() NomadClient {
					nc := nomadSettings{CNIPath: strings.Join(cniPath, ":"), CNIConfigDir: h.conf}.resolve("test")
					nc.setVersion(v, "the test")
					return nc
				},
				Version: version,
				OnTmpfs: func(string) (bool, error) { return true, nil },
				Free:    func(string) (Room, error) { return plenty, nil },
			})
			if front {
				want = ipamdir.DefaultDataDir
			}
			clash := "kept in " + filepath.Join(h.data, "web") + " and " + filepath.Join(want, "nomad") + ": one address can be handed out twice"
			if text := findings(r); !strings.Contains(text, clash) {
				t.Errorf("Nomad %q, front %v: no %q in:\n%s", v, front, clash, text)
			}
		}
	}
}

// Nomad's servers (1.8.0 and later, #15473) constrain every group with
// network mode "bridge" to attr.plugins.cni.version.bridge semver >=
// 0.4.0 (v2.0.5 nomad/job_endpoint_hooks.go, Job.RequiredBridgeNetwork:
// that mode only, not cni/ ones): with no version of bridge recorded, or
// one below 0.4.0, no such group is placed on the node (regression: the
// doctor spoke of CHECK only).
func TestDoctorSaysNoBridgeModeGroupIsPlacedWithoutABridgeVersion(t *testing.T) {
	h := newHost(t)
	h.nomad = true
	placed := `and places no group with network mode "bridge" on this node (servers from Nomad 1.8.0 constrain each to attr.plugins.cni.version.bridge semver >= 0.4.0; "cni/" modes are not constrained)`
	for prints, want := range map[string]string{
		"CNI bridge plugin\n":             "Nomad records no version of bridge from cni_path " + h.bin + ": it never sends CHECK (no CHECK-time sweep), " + placed,
		"CNI bridge plugin v0.3.1\n":      "Nomad records bridge v0.3.1 (from " + filepath.Join(h.bin, "bridge") + ", the last bridge of cni_path " + h.bin + " that prints a version): below 1.3.0 it never sends CHECK (no CHECK-time sweep), " + placed,
		"CNI bridge plugin v0.4.0-rc.1\n": "Nomad records bridge v0.4.0-rc.1 (from " + filepath.Join(h.bin, "bridge") + ", the last bridge of cni_path " + h.bin + " that prints a version): below 1.3.0 it never sends CHECK (no CHECK-time sweep), " + placed,
		"CNI bridge plugin v0.4.0\n":      "Nomad records bridge v0.4.0 (from " + filepath.Join(h.bin, "bridge") + ", the last bridge of cni_path " + h.bin + " that prints a version): below 1.3.0 it never sends CHECK (no CHECK-time sweep)",
		"CNI bridge plugin v1.4.0-rc.1\n": "Nomad records bridge v1.4.0-rc.1 (from " + filepath.Join(h.bin, "bridge") + ", the last bridge of cni_path " + h.bin + " that prints a version): a pre-release, which Nomad's \">= 1.3.0\" never takes, so it never sends CHECK (no CHECK-time sweep)",
	} {
		h.plugin("bridge", prints)
		r := h.run()
		i := slices.IndexFunc(r.Findings, func(f Finding) bool { return f.Check == "nomad" && f.Subject == "bridge" })
		if i < 0 || r.Findings[i].Level != Warn || r.Findings[i].Message != want {
			t.Errorf("bridge printing %q: no warning %q in:\n%s", prints, want, findings(r))
		}
	}
	// A Nomad without CHECK on restore says so too.
	h.plugin("bridge", "CNI bridge plugin\n")
	nc := nomadSettings{CNIPath: h.bin}.resolve("test")
	nc.setVersion("1.9.4", "the test")
	want := "Nomad 1.9.4 never sends CHECK on restore (no CHECK-time sweep), whatever it records for bridge, here no version of bridge from cni_path " + h.bin + ", with which Nomad " + placed[len("and "):] + ": Nomad sends it from 1.9.5 (1.8.10 and 1.7.18 Enterprise)"
	if f := checkNomad(Options{Version: func(path string) (string, error) { return h.versions[filepath.Base(path)], nil }}, nc)[1]; f.Level != Warn || f.Message != want {
		t.Errorf("Nomad 1.9.4, no version of bridge: %s: %s\nwant warn: %s", f.Level, f.Message, want)
	}
}

// With the agent's version unknown and cni_path not set, the doctor reads
// the newer default; an older Nomad reads only its own default, that
// path's first directory (regression: the older Nomad's scan walked the
// newer default too, and found a bridge it never sees).
func TestDoctorJudgesAnOlderNomadByItsOwnDefaultCNIPath(t *testing.T) {
	h := newHost(t)
	first := filepath.Join(h.root, "opt-cni-bin")
	if err := os.MkdirAll(first, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(first, "loopback"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	nc := NomadDefaults()
	nc.cniPathDefault = first + ":" + h.bin
	nc.CNIPath = []string{first, h.bin}
	nc.VersionSource = "the test"
	if f := h.nomadBridgeFinding(nc); !strings.Contains(f.Message, "an older Nomad reads only "+first+" (its default cni_path), and records no version of bridge instead, and never sends CHECK") {
		t.Errorf("bridge finding: %s", f.Message)
	}
}

// nomadBridgeFinding runs the doctor with the Nomad client nc, its
// fingerprint reading h's plugins, and returns its nomad: bridge finding.
func (h *host) nomadBridgeFinding(nc NomadClient) Finding {
	h.t.Helper()
	r := Run(Options{
		ConfDirs: []string{h.conf}, Nomad: true, EUID: 1000,
		NomadClient: func() NomadClient { return nc },
		Version:     func(path string) (string, error) { return h.versions[filepath.Base(path)], nil },
		OnTmpfs:     func(string) (bool, error) { return true, nil },
		Free:        func(string) (Room, error) { return plenty, nil },
	})
	for _, f := range r.Findings {
		if f.Check == "nomad" && f.Subject == "bridge" {
			return f
		}
	}
	h.t.Fatalf("no nomad: bridge finding in:\n%s", findings(r))
	return Finding{}
}

// libcni refuses CHECK below cniVersion 0.4.0 (CheckNetworkList), and
// Nomad takes that for a failed CHECK on restore: it re-creates the
// namespace and re-ADDs while the tasks stay in the old one, so each agent
// restart reschedules the network's allocations. A network of the plugin
// in Nomad's cni_config_dir at 0.3.1 is therefore no fine network while
// Nomad sends CHECK (regression: the doctor said both were fine): broken
// where the agent's version says it does, worth a look where it is
// unknown, nothing where it never sends CHECK; one at 0.4.0 is fine.
func TestDoctorFlagsANomadConflistBelowCheck(t *testing.T) {
	for version, mark := range map[string]string{"2.0.6-dev": "✗", "": "!", "1.9.4": ""} {
		h := newHost(t)
		h.nomad, h.nomadVersion = true, version
		h.conflist("10-old.conflist", strings.Replace(conf("old", pluginName, "nbc0", "172.26.80.0/20", "host-local"), `"0.4.0"`, `"0.3.1"`, 1))
		h.conflist("20-new.conflist", conf("new", pluginName, "nbc1", "172.26.96.0/20", "host-local"))
		text := findings(h.run())
		want := mark + " conflist: " + filepath.Join(h.conf, "10-old.conflist") + ": network \"old\" is at cniVersion 0.3.1"
		if n := strings.Count(text, "is at cniVersion"); mark == "" && n != 0 || mark != "" && (!strings.Contains(text, want) || n != 1) {
			t.Errorf("Nomad %q: want the finding %q (none without a mark), once, in:\n%s", version, want, text)
		}
	}
}
