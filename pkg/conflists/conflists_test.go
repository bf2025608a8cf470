package conflists

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func write(t *testing.T, dir, file, body string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, file), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

// entry is a conflist of one bridge entry of type typ with ipam (the
// object's inside) and the entry's own extra keys.
func entry(name, typ, extra, ipam string) string {
	return `{"cniVersion": "1.0.0", "name": "` + name + `", "plugins": [{"type": "loopback"},
	  {"type": "` + typ + `", "bridge": "br-` + name + `"` + extra + `, "ipam": {"type": "host-local", ` + ipam + `}}]}`
}

// DataDirsOf names each data dir a host's conflists keep leases in once: the
// plugin's entries' dataDir, bare bridge's ipam.dataDir (in any case, as
// host-local reads it) and, where that is not set or empty, host-local's
// default; a relative one (a runtime's working directory) names none.
func TestDataDirs(t *testing.T) {
	root := t.TempDir()
	data, custom := filepath.Join(root, "run-cni"), filepath.Join(root, "custom")
	ranges := `"ranges": [[{"subnet": "10.77.0.0/24"}]]`
	write(t, root, "10-web.conflist", entry("web", PluginName, `, "dataDir": "`+data+`"`, ranges))
	write(t, root, "11-web2.conflist", entry("web2", PluginName, `, "dataDir": "`+data+`"`, ranges))
	write(t, root, "20-db.conflist", entry("db", "bridge", "", `"dataDir": "`+custom+`/", `+ranges))
	write(t, root, "30-plain.conflist", entry("plain", "bridge", "", ranges))
	write(t, root, "40-rel.conflist", entry("rel", "bridge", "", `"dataDir": "rel/dir", `+ranges))
	// host-local reads an empty dataDir as its default, and any spelling.
	write(t, root, "50-empty.conflist", entry("empty", "bridge", "", `"dataDir": "", `+ranges))
	spelled := filepath.Join(root, "spelled")
	write(t, root, "60-spelled.conflist", entry("spelled", "bridge", "", `"datadir": "`+spelled+`", `+ranges))
	nets := Networks(Read([]string{root, filepath.Join(root, "absent")}, false))
	got := DataDirsOf(nets)
	want := []string{data, custom, "/var/lib/cni/networks", spelled}
	if n := nets[len(nets)-2]; n.Dir.Leases() != "/var/lib/cni/networks/empty" {
		t.Errorf("%s: leases in %q, want host-local's default", n.File, n.Dir.Leases())
	}
	if !slices.Equal(got, want) {
		t.Errorf("DataDirs = %v, want %v", got, want)
	}
}

// A network's addresses are counted from rangeStart to rangeEnd as
// host-local sets them: defaults (.1 to the last before broadcast in IPv4,
// to the last address in IPv6), given bounds, several ranges and range
// sets, the old single-range keys; ranges host-local refuses (a bound
// outside the subnet, host bits set, a subnet too small, a start after its
// end, ranges that overlap) count none.
func TestRangeAddresses(t *testing.T) {
	root := t.TempDir()
	for name, ipam := range map[string]string{
		"whole24":  `"ranges": [[{"subnet": "10.1.0.0/24"}]]`,
		"bounded":  `"ranges": [[{"subnet": "10.2.0.0/20", "rangeStart": "10.2.1.10", "rangeEnd": "10.2.1.59"}]]`,
		"two":      `"ranges": [[{"subnet": "10.3.0.0/24", "rangeStart": "10.3.0.100"}, {"subnet": "10.4.0.0/28"}]]`,
		"dual":     `"ranges": [[{"subnet": "10.5.0.0/24"}], [{"subnet": "fd00:5::/120"}]]`,
		"oldstyle": `"subnet": "10.6.0.0/24", "rangeStart": "10.6.0.200", "rangeEnd": "10.6.0.209"`,
		"refused":  `"ranges": [[{"subnet": "10.7.0.0/24", "rangeStart": "10.8.0.1"}]]`,
		"hostbits": `"ranges": [[{"subnet": "10.10.0.1/24"}]]`,
		"tiny":     `"ranges": [[{"subnet": "10.11.0.0/31"}]]`,
		"reversed": `"ranges": [[{"subnet": "10.12.0.0/24", "rangeStart": "10.12.0.9", "rangeEnd": "10.12.0.5"}]]`,
		"overlap":  `"ranges": [[{"subnet": "10.13.0.0/24"}], [{"subnet": "10.13.0.0/25"}]]`,
		"v6whole":  `"ranges": [[{"subnet": "fd00:6::/126"}]]`,
	} {
		write(t, root, name+".conflist", entry(name, PluginName, "", ipam))
	}
	write(t, root, "bare.conflist", entry("bare", "bridge", "", `"ranges": [[{"subnet": "10.9.0.0/24"}]]`))
	got := RangeAddresses(Networks(Read([]string{root}, false)))
	want := map[string]float64{
		"whole24":  254,
		"bounded":  50,
		"two":      155 + 14,
		"dual":     254 + 255,
		"oldstyle": 10,
		"v6whole":  3,
	}
	if len(got) != len(want) {
		t.Errorf("RangeAddresses = %v, want %v (the plugin's networks with ranges host-local accepts)", got, want)
	}
	for name, n := range want {
		if got[name] != n {
			t.Errorf("%s: %v addresses, want %v", name, got[name], n)
		}
	}
}

// A file that cannot be read, one that is not JSON, and an entry of the
// plugin's that ADD refuses are each reported, and only the valid
// networks are listed.
func TestReadReportsWhatItCannotUse(t *testing.T) {
	root := t.TempDir()
	write(t, root, "10-bad.conflist", "{")
	write(t, root, "20-invalid.conflist", entry("invalid", PluginName, `, "dataDir": "relative"`, `"ranges": [[{"subnet": "10.1.0.0/24"}]]`))
	write(t, root, "30-ok.conflist", entry("ok", PluginName, "", `"ranges": [[{"subnet": "10.1.1.0/24"}]]`))
	if err := os.Mkdir(filepath.Join(root, "40-dir.conflist"), 0o755); err != nil {
		t.Fatal(err)
	}
	files := Read([]string{root}, false)
	if len(files) != 3 {
		t.Fatalf("files = %+v, want 3 (a directory is not a file)", files)
	}
	if !files[0].NotCNI || files[0].Err == nil {
		t.Errorf("%s: %+v, want it not CNI", files[0].Path, files[0])
	}
	if n := files[1].Networks; len(n) != 1 || n[0].Err == nil || !strings.Contains(n[0].Err.Error(), "dataDir") {
		t.Errorf("%s: %+v, want the entry refused for its dataDir", files[1].Path, n)
	}
	nets := Networks(files)
	if len(nets) != 1 || nets[0].Name != "ok" || !nets[0].Ours || nets[0].Conf == nil || nets[0].Dir.Leases() != "/var/run/cni/ok" {
		t.Errorf("Networks = %+v, want only ok, the plugin's, in /var/run/cni/ok", nets)
	}
}

// libcni sets every entry's "name" and "cniVersion" to the list's before it
// runs it (libcni buildOneConfig), whatever the entry says: a network's
// leases are under the list's name.
func TestEntryTakesTheListsNameAndVersion(t *testing.T) {
	root := t.TempDir()
	write(t, root, "10-web.conflist", `{"cniVersion": "1.0.0", "name": "web", "plugins": [
	  {"type": "`+PluginName+`", "name": "old-name", "cniVersion": "0.3.1", "ipam": {"type": "host-local", "subnet": "10.1.0.0/24"}}]}`)
	nets := Networks(Read([]string{root}, false))
	if len(nets) != 1 || nets[0].Conf == nil {
		t.Fatalf("networks = %+v, want web", nets)
	}
	if n := nets[0]; n.Conf.Name != "web" || n.Conf.CNIVersion != "1.0.0" || n.Dir.Leases() != "/var/run/cni/web" {
		t.Errorf("entry read as network %q at %s, leases in %s; want web at 1.0.0, in /var/run/cni/web", n.Conf.Name, n.Conf.CNIVersion, n.Dir.Leases())
	}
}

// flannel hands its delegate the "delegate" map (of type bridge unless it
// says otherwise) with flannel's own "ipam" (of type host-local unless it
// says otherwise), and refuses "ipam" or "name" in "delegate"
// (flannel-io/cni-plugin; test/e2e flannelDelegate rebuilds it): the
// plugin's delegate entry is read that way, as the shipped k3s conflist
// has it, and the plugin is one of the chain's plugins.
func TestFlannelDelegate(t *testing.T) {
	root := t.TempDir()
	shipped, err := os.ReadFile("../../conflist/k3s-flannel.conflist")
	if err != nil {
		t.Fatal(err)
	}
	write(t, root, "10-flannel.conflist", string(shipped))
	write(t, root, "20-own.conflist", `{"cniVersion": "1.0.0", "name": "own", "plugins": [{"type": "flannel",
	  "ipam": {"dataDir": "/var/lib/k3s-leases"}, "delegate": {"type": "`+PluginName+`", "dataDir": "/run/own"}}]}`)
	write(t, root, "30-refused.conflist", `{"cniVersion": "1.0.0", "name": "refused", "plugins": [{"type": "flannel",
	  "delegate": {"type": "`+PluginName+`", "ipam": {"type": "host-local", "subnet": "10.1.0.0/24"}}}]}`)
	files := Read([]string{root}, false)
	var got []string
	for _, f := range files {
		for _, n := range f.Networks {
			if n.Err != nil {
				got = append(got, fmt.Sprintf("%s: %v", n.Name, n.Err))
				continue
			}
			got = append(got, fmt.Sprintf("%s ours=%v leases=%s legacy=%s plugins=%v", n.Name, n.Ours, n.Dir.Leases(), n.Conf.LegacyDataDir, n.Plugins))
		}
	}
	want := []string{
		"cbr0 ours=true leases=/var/run/cni/cbr0 legacy=/var/lib/cni/networks plugins=[flannel portmap bandwidth nomad-bridge-cni]",
		"own ours=true leases=/run/own/own legacy=/var/lib/k3s-leases plugins=[flannel nomad-bridge-cni]",
		`refused: flannel refuses "ipam" in its "delegate": it sets it from its own entry's "ipam"`,
	}
	if !slices.Equal(got, want) {
		t.Errorf("networks =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// A file's extension says how runtimes read it: a .conflist's plugins are
// its "plugins" (libcni NetworkConfFromBytes), a .conf or .json file is one
// plugin's configuration, "type" required (libcni NetworkPluginConfFromBytes;
// go-cni's loadFromConfDir, Nomad's loadCNIConf). A list in a .conf file,
// or one plugin's configuration in a .conflist, is refused by every
// runtime (containerd and Nomad stop loading the directory there): it is
// no network, and says why.
func TestFileIsReadAsItsExtensionSays(t *testing.T) {
	root := t.TempDir()
	list := entry("list", PluginName, "", `"subnet": "10.1.0.0/24"`)
	single := `{"cniVersion": "1.0.0", "name": "single", "type": "` + PluginName + `", "ipam": {"type": "host-local", "subnet": "10.2.0.0/24"}}`
	write(t, root, "10-list.conf", list)
	write(t, root, "20-list.json", list)
	write(t, root, "30-single.conflist", single)
	write(t, root, "40-ok.conf", strings.Replace(single, `"single"`, `"ok-conf"`, 1))
	write(t, root, "50-ok.conflist", strings.Replace(list, `"list"`, `"ok-list"`, 1))
	var got []string
	for _, f := range Read([]string{root}, false) {
		var names []string
		for _, n := range f.Networks {
			names = append(names, n.Name)
		}
		got = append(got, fmt.Sprintf("%s %v err=%v", filepath.Base(f.Path), names, f.Err != nil))
	}
	want := []string{"10-list.conf [] err=true", "20-list.json [] err=true", "30-single.conflist [] err=true", "40-ok.conf [ok-conf] err=false", "50-ok.conflist [ok-list] err=false"}
	if !slices.Equal(got, want) {
		t.Errorf("files =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// A directory given twice (a --conf-dir that is a default one, Nomad's
// cni_config_dir "/opt/cni/config/") is read once: the doctor reported each
// of its files twice.
func TestDirectoryGivenTwiceIsReadOnce(t *testing.T) {
	root := t.TempDir()
	write(t, root, "10-web.conflist", entry("web", PluginName, "", `"subnet": "10.1.0.0/24"`))
	if files := Read([]string{root, root + "/", root + "//."}, false); len(files) != 1 {
		t.Errorf("files = %+v, want 10-web.conflist once", files)
	}
}

// A network defined in two files is the first one's, as Nomad and libcni
// load it (the files in lexical order): its range is the one in force.
func TestRangeAddressesOfANetworkInTwoFilesAreTheFirstOnes(t *testing.T) {
	root := t.TempDir()
	write(t, root, "10-first.conflist", entry("twice", PluginName, "", `"ranges": [[{"subnet": "10.1.0.0/24"}]]`))
	write(t, root, "20-second.conflist", entry("twice", PluginName, "", `"ranges": [[{"subnet": "10.2.0.0/28"}]]`))
	if got := RangeAddresses(Networks(Read([]string{root}, false)))["twice"]; got != 254 {
		t.Errorf("addresses of a network in two files: %v, want the first file's 254", got)
	}
}

// A .conflist that libcni refuses to load (NetworkConfFromBytes: no "name",
// an empty "plugins", an entry without "type" or that is not an object) is
// refused by containerd and Nomad, which stop loading the directory there,
// however valid the plugin's own entry in it is: it is no network, and says
// libcni's why. A "cniVersions" list gives the entries the version libcni
// picks from it, as it runs them.
func TestFileLibcniRefusesIsNoNetwork(t *testing.T) {
	root := t.TempDir()
	ours := `{"type": "` + PluginName + `", "ipam": {"type": "host-local", "subnet": "10.1.0.0/24"}}`
	write(t, root, "10-noname.conflist", `{"cniVersion": "1.0.0", "plugins": [`+ours+`]}`)
	write(t, root, "20-empty.conflist", `{"cniVersion": "1.0.0", "name": "empty", "plugins": []}`)
	write(t, root, "30-notype.conflist", `{"cniVersion": "1.0.0", "name": "notype", "plugins": [`+ours+`, {"capabilities": {"portMappings": true}}]}`)
	write(t, root, "40-string.conflist", `{"cniVersion": "1.0.0", "name": "string", "plugins": [`+ours+`, "portmap"]}`)
	write(t, root, "50-versions.conflist", `{"cniVersions": ["0.4.0", "1.0.0"], "name": "versions", "plugins": [`+ours+`]}`)
	var got []string
	for _, f := range Read([]string{root}, false) {
		var nets []string
		for _, n := range f.Networks {
			if n.Conf != nil {
				nets = append(nets, n.Name+"@"+n.Conf.CNIVersion)
			} else {
				nets = append(nets, fmt.Sprintf("%s: %v", n.Name, n.Err))
			}
		}
		got = append(got, fmt.Sprintf("%s %v notCNI=%v", filepath.Base(f.Path), nets, f.NotCNI && f.Err != nil))
	}
	want := []string{"10-noname.conflist [] notCNI=true", "20-empty.conflist [] notCNI=true", "30-notype.conflist [] notCNI=true",
		"40-string.conflist [] notCNI=true", "50-versions.conflist [versions@1.0.0] notCNI=false"}
	if !slices.Equal(got, want) {
		t.Errorf("files =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// libcni gives every entry the list's cniVersion, "" when the list has none
// (a version written in the entries only), and the plugin refuses every
// verb of an empty or unknown one before it reads the entry: such an entry
// is refused here too, with that verb's message (regression: netconf's
// parser took it, and the doctor called the network fine).
func TestEntryOfAVersionThePluginRefusesIsRefused(t *testing.T) {
	root := t.TempDir()
	ours := `{"type": "` + PluginName + `", "cniVersion": "1.0.0", "ipam": {"type": "host-local", "subnet": "10.1.0.0/24"}}`
	write(t, root, "10-none.conflist", `{"name": "none", "plugins": [`+ours+`]}`)
	write(t, root, "20-old.conflist", `{"cniVersion": "0.2.0", "name": "old", "plugins": [`+ours+`]}`)
	write(t, root, "30-ok.conflist", `{"cniVersion": "0.3.1", "name": "ok", "plugins": [`+ours+`]}`)
	var got []string
	for _, f := range Read([]string{root}, false) {
		for _, n := range f.Networks {
			got = append(got, fmt.Sprintf("%s: %v", n.Name, n.Err))
		}
	}
	want := []string{`none: "cniVersion" is empty: set it to one of ["0.3.0" "0.3.1" "0.4.0" "1.0.0" "1.1.0"]`,
		`old: incompatible CNI versions; config is "0.2.0", plugin supports ["0.3.0" "0.3.1" "0.4.0" "1.0.0" "1.1.0"]`, "ok: <nil>"}
	if !slices.Equal(got, want) {
		t.Errorf("networks =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// InRanges keeps the addresses host-local would hand out under the entry's
// ranges as it reads them: the runtime's ipRanges, the single-range keys,
// "ranges" with their bounds.
func TestInRanges(t *testing.T) {
	addrs := []string{"10.0.0.5", "fd00::5", "10.9.0.5", "garbage"}
	for entry, want := range map[string][]string{
		`{"ipam":{"ranges":[[{"subnet":"10.0.0.0/24"}],[{"subnet":"fd00::/64","rangeStart":"fd00::10"}]]}}`: {"10.0.0.5"},
		`{"ipam":{"subnet":"10.0.0.0/24","rangeEnd":"10.0.0.4"}}`:                                           nil,
		`{"ipam":{"subnet":"10.0.0.0/24"},"runtimeConfig":{"ipRanges":[[{"subnet":"fd00::/64"}]]}}`:         {"10.0.0.5", "fd00::5"},
		`{"ipam":{"ranges":"x"}}`: nil,
	} {
		if got := InRanges([]byte(entry), addrs); !slices.Equal(got, want) {
			t.Errorf("InRanges(%s) = %q, want %q", entry, got, want)
		}
	}
}
