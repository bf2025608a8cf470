package doctor

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/pkg/conflists"
)

// Installed as bridge in Nomad's cni_path, the plugin's conflists are
// judged by the plugin path of the runtime that reads each (regression:
// podman's 87-podman-bridge.conflist in /etc/cni/net.d was judged by
// Nomad's cni_path: "✗ plugin: tuning: not found", exit 1): Nomad's own
// by its cni_path, those of a directory that containerd, CRI-O and podman
// read by their default plugin dirs, and one whose reader the doctor
// cannot tell by all of those, a plugin found in none a warning.
func TestEachConflistIsJudgedByItsRuntimesPluginPath(t *testing.T) {
	h := newHost(t)
	front := filepath.Join(h.root, "nbc")
	podmanBin := filepath.Join(h.root, "usr-lib-cni")
	nomadConf := filepath.Join(h.root, "nomad-cni")
	other := filepath.Join(h.root, "elsewhere")
	for _, d := range []string{podmanBin, nomadConf, other} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	h.frontCopy(front)
	for _, p := range []string{"bridge", "host-local", "portmap", "firewall", "tuning"} {
		if err := os.WriteFile(filepath.Join(podmanBin, p), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	h.versions[filepath.Join(podmanBin, "tuning")] = "CNI tuning plugin v1.1.1\n"
	// podman's default network: bridge, portmap, firewall, tuning.
	podman := `{"cniVersion": "0.4.0", "name": "podman", "plugins": [
	  {"type": "bridge", "bridge": "cni-podman0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
	   "ipam": {"type": "host-local", "routes": [{"dst": "0.0.0.0/0"}], "ranges": [[{"subnet": "10.88.0.0/16", "gateway": "10.88.0.1"}]]}},
	  {"type": "portmap", "capabilities": {"portMappings": true}},
	  {"type": "firewall"},
	  {"type": "tuning"}]}`
	h.conflist("87-podman-bridge.conflist", podman)
	h.conflist("90-vrf.conflist", strings.Replace(conf("vrf", "bridge", "vrf0", "10.97.0.0/24", "host-local"), `{"type": "portmap"`, `{"type": "vrf", "vrfname": "blue"}, {"type": "portmap"`, 1))
	write := func(dir, file, body string) {
		if err := os.WriteFile(filepath.Join(dir, file), []byte(strings.ReplaceAll(body, "DATA", h.data)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(nomadConf, "web.conflist", strings.Replace(conf("web", "bridge", "web0", "10.99.0.0/24", "host-local"), `{"type": "portmap"`, `{"type": "tuning"}, {"type": "portmap"`, 1))
	write(other, "mine.conflist", strings.Replace(conf("mine", "bridge", "mine0", "10.98.0.0/24", "host-local"), `{"type": "portmap"`, `{"type": "sbr"}, {"type": "portmap"`, 1))
	nomadPath := []string{front, h.bin}
	r := Run(Options{
		ConfDirs: []string{h.conf, other}, CNIPath: []string{"/opt/cni/bin"}, Nomad: true, EUID: 1000,
		NomadClient: func() NomadClient {
			nc := NomadDefaults()
			nc.Source, nc.CNIPath, nc.CNIConfigDir = "test", nomadPath, nomadConf
			return nc
		},
		// The plugin is installed first in these runtimes' plugin path too:
		// else their bridge entries are bare bridge's, whose plugins the
		// doctor does not judge.
		Readers: map[string]conflists.Reader{h.conf: {Runtimes: "containerd, CRI-O and podman", PluginDirs: []string{front, h.bin, podmanBin}}},
		Version: h.version,
		OnTmpfs: func(string) (bool, error) { return true, nil },
		Free:    func(string) (Room, error) { return plenty, nil },
	})
	text := findings(r)
	has := func(level Level, subject, message string) bool {
		return slices.ContainsFunc(r.Findings, func(f Finding) bool {
			return f.Check == "plugin" && f.Level == level && f.Subject == subject && strings.Contains(f.Message, message)
		})
	}
	for _, want := range []struct {
		level            Level
		subject, message string
	}{
		// podman's, by the default plugin dirs of /etc/cni/net.d's readers.
		{OK, filepath.Join(podmanBin, "tuning"), "version v1.1.1"},
		// Missing from all of them: an error.
		{Error, "vrf", "not found in the default plugin dirs of containerd, CRI-O and podman, " + front + ":" + h.bin + ":" + podmanBin + " (for " + filepath.Join(h.conf, "90-vrf.conflist") + ")"},
		// Nomad's, by its cni_path, which has no tuning.
		{Error, "tuning", "not found in Nomad's cni_path " + front + ":" + h.bin + " (for " + filepath.Join(nomadConf, "web.conflist") + ")"},
		// One of a directory no known runtime reads: a warning.
		{Warn, "sbr", "not found in "},
	} {
		if !has(want.level, want.subject, want.message) {
			t.Errorf("no %s plugin: %s: %q in:\n%s", want.level, want.subject, want.message, text)
		}
	}
	if has(Error, "tuning", filepath.Join(h.conf, "87-podman-bridge.conflist")) || has(Error, "sbr", "") {
		t.Errorf("a plugin judged by another runtime's path, or by no runtime's, is an error:\n%s", text)
	}
	if !has(Warn, "sbr", "cannot tell which runtime reads "+filepath.Join(other, "mine.conflist")) {
		t.Errorf("the warning does not say the doctor cannot tell the reader:\n%s", text)
	}
}
