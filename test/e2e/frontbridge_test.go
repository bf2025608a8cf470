package e2e

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	gocni "github.com/containerd/go-cni"
	"github.com/containernetworking/cni/pkg/invoke"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/internal/statefile"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/cniexec"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/testhost"
)

// nomadBridgeConflist is the conflist Nomad's client generates in code for
// `network { mode = "bridge" }` (client/allocrunner/cni/bridge.go: loopback,
// bridge with forceAddress and hairpinMode, host-local with dataDir
// /var/run/cni, firewall with the admin chain, portmap with snat), with the
// test's own network name, bridge, subnet and admin chain.
func (e *testEnv) nomadBridgeConflist() []byte {
	return []byte(fmt.Sprintf(`{
	"cniVersion": "0.4.0",
	"name": %q,
	"plugins": [
		{
			"type": "loopback"
		},
		{
			"type": "bridge",
			"bridge": %q,
			"ipMasq": true,
			"isGateway": true,
			"forceAddress": true,
			"hairpinMode": false,
			"ipam": {
				"type": "host-local",
				"ranges": [
					[
						{
							"subnet": %q
						}
					]
				],
				"routes": [
					{
						"dst": "0.0.0.0/0"
					}
				],
				"dataDir": "/var/run/cni"
			}
		},
		{
			"type": "firewall",
			"backend": "iptables",
			"iptablesAdminChainName": %q
		},
		{
			"type": "portmap",
			"capabilities": {
				"portMappings": true
			},
			"snat": true
		}
	]
}`, e.netName, e.bridge, e.subnet4, e.adminChain))
}

// frontDir installs the plugin as `bridge` in a directory of its own, as
// `make install-as-bridge` does: the runtime lists it before the reference
// plugins.
func (e *testEnv) frontDir(t *testing.T) string {
	t.Helper()
	e.requirePlugin(t)
	dir := filepath.Join(t.TempDir(), "front")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := run("install", "-m", "0755", filepath.Join(e.bin, pluginType), filepath.Join(dir, "bridge")); err != nil {
		t.Fatal(err)
	}
	return dir
}

// nomadCNI is go-cni set up as Nomad's client sets it up: cni_path split on
// ':', interface prefix "eth", the generated conflist.
func (e *testEnv) nomadCNI(t *testing.T, cniPath string) gocni.CNI {
	t.Helper()
	return e.goCNI(t, gocni.WithPluginDir(filepath.SplitList(cniPath)), gocni.WithInterfacePrefix("eth"), gocni.WithConfListBytes(e.nomadBridgeConflist()))
}

// nomadOpts are the namespace options of Nomad's Setup: its CNI_ARGS and
// the group's port mappings.
func nomadOpts(allocID string, hostPort int) []gocni.NamespaceOpts {
	return []gocni.NamespaceOpts{
		gocni.WithCapabilityPortMap([]gocni.PortMapping{{HostPort: int32(hostPort), ContainerPort: 80, Protocol: "tcp"}}),
		gocni.WithLabels(map[string]string{"IgnoreUnknown": "true", "NOMAD_ALLOC_ID": allocID, "NOMAD_JOB_ID": "web", "NOMAD_GROUP_NAME": "web", "NOMAD_NAMESPACE": "default", "NOMAD_REGION": "global"}),
	}
}

// nomadDelOpts are those of Nomad's Teardown: the port mappings alone, no
// CNI_ARGS (client/allocrunner/networking_cni.go).
func nomadDelOpts(hostPort int) []gocni.NamespaceOpts {
	return nomadOpts("", hostPort)[:1]
}

// TestNomadBuiltinBridgeWithThePluginInstalledAsBridge: with the plugin
// installed as `bridge` in a directory listed first in Nomad's cni_path,
// Nomad's own bridge network (the conflist it generates, "type": "bridge",
// no key of ours) gets the plugin with no job change: leases in the
// plugin's tmpfs dataDir with a record, a working container, and after a
// lost namespace Nomad's re-ADD succeeds where the reference bridge fails
// with "duplicate allocation". Nomad's fingerprint of `bridge` reads the
// reference bridge's version first.
func TestNomadBuiltinBridgeWithThePluginInstalledAsBridge(t *testing.T) {
	for _, bare := range []bool{false, true} {
		name := "installed-as-bridge"
		if bare {
			name = "control-reference-bridge"
		}
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			cniPath := e.bin
			if !bare {
				cniPath = e.frontDir(t) + ":" + e.bin
				assertFingerprint(t, strings.SplitN(cniPath, ":", 2)[0], cniPath)
			}
			alloc := podUID(t)
			ns := e.podNetns(t, "alloc", alloc)
			port := randomHostPort()
			nomad := e.nomadCNI(t, cniPath)
			ctx := runtimeCtx(t)
			leaseDir := filepath.Join(pluginDefaultDataDir, e.netName)

			res, err := nomad.Setup(ctx, alloc, ns.path, nomadOpts(alloc, port)...)
			if err != nil {
				t.Fatalf("Setup: %v", err)
			}
			p1, gw := goCNIResult(t, res).addrIn(t, e.subnet4)
			assertLeases(t, leaseDir, map[netip.Addr]string{p1.Addr(): leaseContent(alloc)})
			assertAddrOnIf(t, ns, p1)
			ping(t, ns, gw)
			e.assertReaches(t, ns, netip.AddrPortFrom(gw, uint16(port)))
			recordPath := filepath.Join(pluginDefaultDataDir, recordDirName, e.netName, alloc+"@"+ifName)
			if _, err := os.Stat(recordPath); (err == nil) == bare {
				t.Errorf("record %s: stat error %v (bare bridge keeps none, the plugin one)", recordPath, err)
			}

			// The host lost the namespace (crash, or a reboot with /var/run
			// not on tmpfs): Nomad re-creates it and sends ADD, no DEL.
			e.restoreNetns(t, ns)
			res, err = nomad.Setup(ctx, alloc, ns.path, nomadOpts(alloc, port)...)
			if bare {
				assertControlFails(t, res, err, duplicateAllocation)
				return
			}
			if err != nil {
				t.Fatalf("re-ADD after the namespace was lost: %v", err)
			}
			p2, gw := goCNIResult(t, res).addrIn(t, e.subnet4)
			if p2 != p1 {
				t.Errorf("restored with %s, first %s: a restore in place keeps its free address", p2, p1)
			}
			assertLeases(t, leaseDir, map[netip.Addr]string{p2.Addr(): leaseContent(alloc)})
			ping(t, ns, gw)
			e.assertReaches(t, ns, netip.AddrPortFrom(gw, uint16(port)))

			if err := nomad.Remove(ctx, alloc, ns.path, nomadDelOpts(port)...); err != nil {
				t.Fatalf("Remove: %v", err)
			}
			assertLeases(t, leaseDir, nil)
			if _, err := os.Stat(recordPath); !os.IsNotExist(err) {
				t.Errorf("record %s left after DEL (%v)", recordPath, err)
			}
			e.assertNetworkNATEmpty(t)
		})
	}
}

// assertFingerprint runs front/bridge with no arguments, as Nomad's
// fingerprint does (stdout and stderr together), and checks that the first
// version in it is the reference bridge's.
func assertFingerprint(t *testing.T, front, cniPath string) {
	t.Helper()
	r := cniexec.Run(t, filepath.Join(front, "bridge"), invoke.Args{}, cniexec.Opts{Env: []string{"CNI_PATH=" + cniPath}, Combined: true})
	out := r.Stdout
	if r.Err != nil {
		t.Fatalf("%s/bridge with no arguments: %v", front, r.Err)
	}
	fields := strings.Fields(string(out))
	if len(fields) < 4 || strings.Join(fields[:4], " ") != "CNI bridge plugin v1.10.0" || !strings.Contains(string(out), "nomad-bridge-cni") {
		t.Errorf("fingerprint of the installed bridge:\n%s\nwant the reference bridge's line first, then the plugin's", out)
	}
}

// TestInstalledAsBridgePassesOtherIPAMThrough: installed as bridge, the
// plugin also receives bridge networks it does not manage (static IPAM
// here): they work as with the reference bridge, and the plugin leaves no
// state for them. With nothing but itself under that name in CNI_PATH, it
// fails with a configuration error instead of calling itself.
func TestInstalledAsBridgePassesOtherIPAMThrough(t *testing.T) {
	e := newEnv(t)
	testhost.RequireBinaries(t, e.bin, "static")
	front := e.frontDir(t)
	addr := netip.PrefixFrom(e.hostAddr(7), 24)
	conf := map[string]any{
		"cniVersion": "1.0.0", "name": e.netName,
		"plugins": []any{map[string]any{
			"type": "bridge", "bridge": e.bridge, "isGateway": true,
			"ipam": map[string]any{"type": "static", "addresses": []any{map[string]any{"address": addr.String(), "gateway": e.hostAddr(1).String()}}},
		}},
	}
	e.writeConflist(t, conf)
	ns := e.addNetns(t, "static")
	stdout, stderr, err := e.cnitoolEnv("add", ns, "CNI_PATH="+front+":"+e.bin)
	if err != nil {
		t.Fatalf("ADD through the installed bridge: %v\n%s", err, stderr)
	}
	var res struct {
		IPs []struct {
			Address string `json:"address"`
		} `json:"ips"`
	}
	if err := json.Unmarshal([]byte(stdout), &res); err != nil || len(res.IPs) != 1 || res.IPs[0].Address != addr.String() {
		t.Fatalf("result %s (%v), want %s", stdout, err, addr)
	}
	assertAddrOnIf(t, ns, addr)
	ping(t, ns, e.hostAddr(1))
	for _, dir := range []string{filepath.Join(pluginDefaultDataDir, e.netName), filepath.Join(pluginDefaultDataDir, recordDirName, e.netName)} {
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("passed-through network left %s (%v)", dir, err)
		}
	}
	if _, stderr, err := e.cnitoolEnv("del", ns, "CNI_PATH="+front+":"+e.bin); err != nil {
		t.Fatalf("DEL: %v\n%s", err, stderr)
	}

	// Only itself under the name: refused, not recursed into.
	_, _, err = e.cnitoolEnv("add", e.addNetns(t, "loop"), "CNI_PATH="+front)
	if err == nil || !strings.Contains(err.Error(), "names this plugin itself") {
		t.Fatalf("ADD with no other bridge in CNI_PATH = %v, want the loop refused", err)
	}
}

// Both install modes on one host: with the front copy first in CNI_PATH, a
// one-word conflist's delegate "bridge" is the front copy. It must act as
// the reference bridge it stands in front of (the plugin calling it is
// doing the work), not wrap the network a second time: one lease, one
// record, both in the conflist's dataDir, nothing under the front copy's
// default dataDir, and DEL leaves nothing.
func TestOneWordConflistBehindTheFrontCopy(t *testing.T) {
	e := newEnv(t)
	e.requirePlugin(t)
	front := e.frontDir(t)
	conf := e.reclaimConf(t, "nomad.conflist")
	e.writeConflist(t, conf)
	ns := e.addNetns(t, "both")
	path := "CNI_PATH=" + front + ":" + e.bin
	stdout, stderr, err := e.cnitoolEnv("add", ns, path)
	if err != nil {
		t.Fatalf("ADD: %v\n%s", err, stderr)
	}
	p, gw := parseResult(t, stdout).addrIn(t, e.subnet4)
	assertLeases(t, e.leaseDir(), map[netip.Addr]string{p.Addr(): leaseContent(ns.cid)})
	e.assertRecord(t, ns, p.Addr())
	ping(t, ns, gw)
	for _, dir := range []string{filepath.Join(pluginDefaultDataDir, e.netName), filepath.Join(pluginDefaultDataDir, recordDirName, e.netName)} {
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("the front copy wrapped the network again: %s exists (%v)", dir, err)
		}
	}
	if _, stderr, err := e.cnitoolEnv("check", ns, path); err != nil {
		t.Fatalf("CHECK: %v\n%s", err, stderr)
	}
	if _, stderr, err := e.cnitoolEnv("del", ns, path); err != nil {
		t.Fatalf("DEL: %v\n%s", err, stderr)
	}
	assertLeases(t, e.leaseDir(), nil)
	e.assertNoRecord(t, ns.cid)
	e.assertNetworkNATEmpty(t)
}

// Two copies of the plugin installed as `bridge` in one path (an operator
// who ran install-as-bridge into two directories), or one behind a script
// of that name, must never call each other: each copy's lookup skipped only
// its own file, so /a/bridge ran /b/bridge, which ran /a/bridge, each in a
// process group of its own that no timeout above could stop (regression: a
// fork bomb). Past the copies the reference bridge is found and used; with
// none, the ADD fails at once, saying why.
func TestCopiesOfThePluginNeverCallEachOther(t *testing.T) {
	e := newEnv(t)
	first, second := e.frontDir(t), e.frontDir(t)
	script := filepath.Join(t.TempDir(), "bridge")
	if err := os.WriteFile(script, []byte("#!/bin/sh\nexec "+e.binary(pluginType)+" \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	// The chain's other plugins, without bridge.
	others := t.TempDir()
	for _, p := range []string{"loopback", "host-local", "firewall", "portmap"} {
		if err := os.Symlink(e.binary(p), filepath.Join(others, p)); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name, cniPath string
		says          string // "" when the ADD must succeed
	}{
		{"two-copies-then-bridge", first + ":" + second + ":" + e.bin, ""},
		{"two-copies-only", first + ":" + second + ":" + others, "is nomad-bridge-cni"},
		{"copy-behind-a-script", filepath.Dir(script) + ":" + e.bin, "copies of itself"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			alloc := podUID(t)
			ns := e.podNetns(t, tc.name, alloc)
			nomad := e.nomadCNI(t, tc.cniPath)
			ctx := runtimeCtx(t)
			port := randomHostPort()
			start := time.Now()
			res, err := nomad.Setup(ctx, alloc, ns.path, nomadOpts(alloc, port)...)
			if took := time.Since(start); took > 20*time.Second {
				t.Errorf("Setup took %v", took)
			}
			if tc.says == "" {
				if err != nil {
					t.Fatalf("Setup past two copies: %v", err)
				}
				p, gw := goCNIResult(t, res).addrIn(t, e.subnet4)
				assertLease(t, filepath.Join(pluginDefaultDataDir, e.netName), p.Addr(), alloc)
				ping(t, ns, gw)
				assertFingerprint(t, first, tc.cniPath)
			} else if err == nil || !strings.Contains(err.Error(), tc.says) {
				t.Errorf("Setup = %v, want a refusal saying %q", err, tc.says)
			}
			if err := nomad.Remove(ctx, alloc, ns.path, nomadDelOpts(port)...); err != nil && tc.says == "" {
				t.Errorf("Remove: %v", err)
			}
			assertLeases(t, filepath.Join(pluginDefaultDataDir, e.netName), nil)
		})
	}
}

// Nomad sends an allocation's ADD up to three times, a second or two
// apart, with no DEL between (networking_cni.go's retry for racing bridge
// creations); after the last failure it kills the tasks, and its network
// hook's Postrun sends DEL. Here the firewall fails every ADD after bridge
// succeeded (an admin chain name iptables refuses): the retries are
// refused as the live duplicate they are, one lease is held throughout,
// and the DEL leaves nothing of the allocation.
func TestNomadRetriesAFailedADDThenDELs(t *testing.T) {
	e := newEnv(t)
	e.requirePlugin(t)
	cniPath := e.frontDir(t) + ":" + e.bin
	tooLong := strconv.Quote(e.adminChain + "-longer-than-iptables-takes")
	conflist := strings.Replace(string(e.nomadBridgeConflist()), strconv.Quote(e.adminChain), tooLong, 1)
	nomad := e.goCNI(t, gocni.WithPluginDir(filepath.SplitList(cniPath)), gocni.WithInterfacePrefix("eth"), gocni.WithConfListBytes([]byte(conflist)))
	alloc := podUID(t)
	ns := e.podNetns(t, "alloc", alloc)
	port := randomHostPort()
	ctx := runtimeCtx(t)
	leaseDir := filepath.Join(pluginDefaultDataDir, e.netName)

	var held map[netip.Addr]string
	for attempt := 1; attempt <= 3; attempt++ {
		_, err := nomad.Setup(ctx, alloc, ns.path, nomadOpts(alloc, port)...)
		switch {
		case err == nil:
			t.Fatalf("ADD %d succeeded through a firewall that cannot make its admin chain", attempt)
		case attempt == 1 && !strings.Contains(err.Error(), `type="firewall"`):
			t.Fatalf("ADD 1: %v, want the firewall's error", err)
		case attempt > 1 && !strings.Contains(err.Error(), "already attached"):
			t.Errorf("ADD %d (Nomad's retry): %v, want the live duplicate refused", attempt, err)
		}
		leases := readLeases(t, leaseDir)
		if len(leases) != 1 || (held != nil && !maps.Equal(leases, held)) {
			t.Fatalf("leases after ADD %d: %v, want the first ADD's one (%v)", attempt, leases, held)
		}
		held = leases
	}
	if err := nomad.Remove(ctx, alloc, ns.path, nomadDelOpts(port)...); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	assertLeases(t, leaseDir, nil)
	if recordPath := filepath.Join(pluginDefaultDataDir, recordDirName, e.netName, alloc+"@"+ifName); statefile.Exists(recordPath) {
		t.Errorf("record %s left after DEL", recordPath)
	}
	e.assertNetworkNATEmpty(t)
	enter := ns.enter()
	if out, err := output(enter[0], append(enter[1:], "ip", "link", "show", "dev", ifName)...); err == nil {
		t.Errorf("%s left in %s after DEL: %s", ifName, ns.name, out)
	}
}
