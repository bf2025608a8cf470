package podman

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/utils"

	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/hostcmd"
	"github.com/nomad-bridge-cni/nomad-bridge-cni/test/kit/iptstate"
)

// checkServes checks container c on network n, through interface ifname:
// it runs, podman reports an address in n's subnet, that address is on
// ifname in the container's namespace, host-local leased it to c (and the
// plugin recorded the attachment), and the container's httpd answers on
// it, and on the published host port through 127.0.0.1. It returns the
// address.
func (e *env) checkServes(t *testing.T, c *container, n *network, ifname string) netip.Addr {
	t.Helper()
	return e.checkServesIn(t, c, n, ifname, e.leaseDir(n), e.adoption.plugin())
}

// checkServesIn is checkServes with the lease in leaseDir, and a record
// of the plugin's only if recorded: before a network adopts the plugin,
// plain bridge keeps its leases in host-local's directory.
//
// A rootless container's namespace path is a mount in podman's own mount
// namespace, so its namespace is entered through its process; its
// address is on a bridge in podman's rootless network namespace, out of
// the host's reach, so it is only asked through the published port
// (podman's rootlessport, which connects to that address).
func (e *env) checkServesIn(t *testing.T, c *container, n *network, ifname, leaseDir string, recorded bool) netip.Addr {
	t.Helper()
	ins := e.mustInspect(t, c.id)
	if ins.State.Status != "running" {
		t.Fatalf("container %s is %q, want running", c.name, ins.State.Status)
	}
	att, ok := ins.NetworkSettings.Networks[n.name]
	if !ok {
		t.Fatalf("podman inspect: container %s is not on network %s: %+v", c.name, n.name, ins.NetworkSettings.Networks)
	}
	addr, err := netip.ParseAddr(att.IPAddress)
	if err != nil || !n.subnet.Contains(addr) || att.IPPrefixLen != n.subnet.Bits() {
		t.Fatalf("podman inspect: container %s on %s has %q/%d, want an address in %s", c.name, n.name, att.IPAddress, att.IPPrefixLen, n.subnet)
	}
	if gw, err := netip.ParseAddr(att.Gateway); err != nil || gw != n.gateway {
		t.Errorf("podman inspect: gateway %q, want %s", att.Gateway, n.gateway)
	}
	nsPath := ins.NetworkSettings.SandboxKey
	if e.user != nil {
		nsPath = fmt.Sprintf("/proc/%d/ns/net", ins.State.Pid)
	}
	assertAddrOnIf(t, nsPath, ifname, netip.PrefixFrom(addr, n.subnet.Bits()))
	assertLeaseIn(t, leaseDir, addr, c.id, ifname)
	if recorded {
		e.assertRecord(t, n, c.id, ifname, true)
	}
	if e.user == nil {
		assertServes(t, netip.AddrPortFrom(addr, 80).String(), e.token)
	} else if c.hostPort == 0 {
		t.Fatalf("rootless container %s has no published port to reach it through", c.name)
	}
	if c.hostPort != 0 {
		assertServes(t, "127.0.0.1:"+strconv.Itoa(c.hostPort), e.token)
	}
	return addr
}

// assertAddrOnIf checks that ifname in the namespace at nsPath has addr.
func assertAddrOnIf(t *testing.T, nsPath, ifname string, addr netip.Prefix) {
	t.Helper()
	out, err := hostcmd.Output(cmdTimeout, "nsenter", "--net="+nsPath, "ip", "-j", "-4", "addr", "show", "dev", ifname)
	if err != nil {
		t.Fatalf("addresses of %s in %s: %v", ifname, nsPath, err)
	}
	var links []struct {
		AddrInfo []struct {
			Local     string `json:"local"`
			PrefixLen int    `json:"prefixlen"`
		} `json:"addr_info"`
	}
	if err := json.Unmarshal([]byte(out), &links); err != nil {
		t.Fatalf("parse ip addr: %v: %s", err, out)
	}
	for _, l := range links {
		for _, a := range l.AddrInfo {
			if a.Local == addr.Addr().String() && a.PrefixLen == addr.Bits() {
				return
			}
		}
	}
	t.Fatalf("%s in %s does not have %s: %s", ifname, nsPath, addr, out)
}

// assertNoIf checks that the namespace at nsPath has no interface ifname.
func assertNoIf(t *testing.T, nsPath, ifname string) {
	t.Helper()
	if _, err := hostcmd.Output(cmdTimeout, "nsenter", "--net="+nsPath, "ip", "link", "show", "dev", ifname); err == nil {
		t.Fatalf("%s still has %s", nsPath, ifname)
	}
}

func assertServes(t *testing.T, addr, token string) {
	t.Helper()
	body, err := fetch(addr)
	if err != nil {
		t.Fatalf("GET http://%s/: %v", addr, err)
	}
	if strings.TrimSpace(body) != token {
		t.Fatalf("GET http://%s/ answered %q, want %q (another listener?)", addr, body, token)
	}
}

// leases reads host-local's lease files of network n: address -> content
// ("<container ID>\r\n<ifname>").
func (e *env) leases(t *testing.T, n *network) map[netip.Addr]string {
	t.Helper()
	return leasesIn(t, e.leaseDir(n))
}

// leasesIn reads the lease files of host-local's directory dir.
func leasesIn(t *testing.T, dir string) map[netip.Addr]string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatalf("read leases: %v", err)
	}
	out := map[netip.Addr]string{}
	for _, ent := range entries {
		addr, err := netip.ParseAddr(ent.Name())
		if err != nil {
			continue // lock, last_reserved_ip.0
		}
		raw, err := os.ReadFile(filepath.Join(dir, ent.Name()))
		if err != nil {
			t.Fatalf("read lease: %v", err)
		}
		out[addr] = string(raw)
	}
	return out
}

func (e *env) assertLease(t *testing.T, n *network, addr netip.Addr, id, ifname string) {
	t.Helper()
	assertLeaseIn(t, e.leaseDir(n), addr, id, ifname)
}

func assertLeaseIn(t *testing.T, dir string, addr netip.Addr, id, ifname string) {
	t.Helper()
	leases := leasesIn(t, dir)
	if got, want := leases[addr], id+"\r\n"+ifname; got != want {
		t.Fatalf("lease of %s in %s is %q, want %q (all: %q)", addr, dir, got, want, leases)
	}
}

// leasesOf lists the addresses leased in dir to container id.
func leasesOf(t *testing.T, dir, id string) []netip.Addr {
	t.Helper()
	var out []netip.Addr
	for addr, owner := range leasesIn(t, dir) {
		if strings.HasPrefix(owner, id+"\r\n") {
			out = append(out, addr)
		}
	}
	return out
}

// assertReleased checks that network n holds no lease of container id and,
// with the plugin, no record of it either.
func (e *env) assertReleased(t *testing.T, n *network, id, ifname string) {
	t.Helper()
	for addr, owner := range e.leases(t, n) {
		if strings.HasPrefix(owner, id+"\r\n") {
			t.Errorf("lease %s of %s left in %s: %q", addr, id, e.leaseDir(n), owner)
		}
	}
	e.assertRecord(t, n, id, ifname, false)
}

// assertRecord checks that the plugin has (or has not) a record of the
// attachment; there is none to check for the control.
func (e *env) assertRecord(t *testing.T, n *network, id, ifname string, want bool) {
	t.Helper()
	if !e.adoption.plugin() {
		return
	}
	path := filepath.Join(e.recordDir(n), id+"@"+ifname)
	_, err := os.Stat(path)
	switch {
	case want && err != nil:
		t.Errorf("attachment record %s: %v", path, err)
	case !want && err == nil:
		t.Errorf("attachment record %s left", path)
	}
}

// assertNoRules checks that no bridge or portmap rule of container id on
// network n is left.
func assertNoRules(t *testing.T, n *network, id string) {
	t.Helper()
	chains := containerChains(n.name, id)
	errs := iptstate.EachTable(func(fam, table string, tb iptstate.Table) []error {
		var errs []error
		for _, r := range tb.Rules {
			if strings.Contains(r.Comment(), fmt.Sprintf("name: %q id: %q", n.name, id)) {
				errs = append(errs, fmt.Errorf("%s -t %s: rule left: %s", fam, table, r))
			}
		}
		for _, c := range chains {
			if tb.Chains[c] {
				errs = append(errs, fmt.Errorf("%s -t %s: chain left: %s", fam, table, c))
			}
		}
		return errs
	})
	if len(errs) > 0 {
		t.Error(errors.Join(errs...))
	}
}

// assertMasqFrom checks that bridge's ipMasq jumps of container id on
// network n (POSTROUTING, commented with both) come from addr alone: none
// is left from an earlier attachment, none is doubled.
func assertMasqFrom(t *testing.T, n *network, id string, addr netip.Addr) {
	t.Helper()
	nat, err := iptstate.Read("iptables", "nat")
	if err != nil {
		t.Fatal(err)
	}
	comment := utils.FormatComment(n.name, id)
	var jumps []string
	for _, r := range nat.RulesIn("POSTROUTING") {
		if r.Comment() == comment {
			jumps = append(jumps, r.String())
			if r.Value("-s") != addr.String()+"/32" {
				t.Errorf("ipMasq jump from another address than %s: %s", addr, r)
			}
		}
	}
	if len(jumps) != 1 {
		t.Errorf("%d ipMasq jumps for %s, want one from %s: %q", len(jumps), id, addr, jumps)
	}
}

// containerChains are the per-container chains bridge (ipMasq) and portmap
// name after a network and a container ID.
func containerChains(netName, id string) []string {
	return []string{
		utils.FormatChainName(netName, id),
		utils.MustFormatChainNameWithPrefix(netName, id, "DN-"),
		utils.MustFormatChainNameWithPrefix(netName, id, "SN-"),
	}
}
