package e2e

import (
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// bridgePorts lists the links enslaved to the test's bridge.
func (e *testEnv) bridgePorts(t *testing.T) []string {
	t.Helper()
	out, err := output("ip", "-j", "link", "show", "master", e.bridge)
	if err != nil {
		t.Fatalf("%v", err)
	}
	var links []struct {
		Ifname string `json:"ifname"`
	}
	if err := json.Unmarshal([]byte(out), &links); err != nil {
		t.Fatalf("parse ports of %s: %v", e.bridge, err)
	}
	var names []string
	for _, l := range links {
		names = append(names, l.Ifname)
	}
	return names
}

// assertHairpin checks that every port of the bridge has hairpin mode on
// (bridge's hairpinMode), as the kernel reports it.
func (e *testEnv) assertHairpin(t *testing.T, want bool) {
	t.Helper()
	ports := e.bridgePorts(t)
	if len(ports) == 0 {
		t.Fatalf("bridge %s has no ports", e.bridge)
	}
	for _, p := range ports {
		raw, err := os.ReadFile(filepath.Join("/sys/class/net", p, "brport", "hairpin_mode"))
		if err != nil {
			t.Fatalf("hairpin mode of %s: %v", p, err)
		}
		if got := strings.TrimSpace(string(raw)) == "1"; got != want {
			t.Errorf("port %s of %s: hairpin_mode %q, want on=%v", p, e.bridge, strings.TrimSpace(string(raw)), want)
		}
	}
}

// linkFlags returns the flags and MTU of a link (in ns when nsName is set).
func linkInfo(t *testing.T, nsName, link string) (flags []string, mtu int) {
	t.Helper()
	args := []string{"-j"}
	if nsName != "" {
		args = append(args, "-n", nsName)
	}
	out, err := output("ip", append(args, "link", "show", "dev", link)...)
	if err != nil {
		t.Fatalf("%v", err)
	}
	var links []struct {
		Flags []string `json:"flags"`
		MTU   int      `json:"mtu"`
	}
	if err := json.Unmarshal([]byte(out), &links); err != nil || len(links) != 1 {
		t.Fatalf("parse ip link: %v: %s", err, out)
	}
	return links[0].Flags, links[0].MTU
}

// hostAddrs returns the addresses of a host link in the given family.
func hostAddrs(t *testing.T, link, fam string) []netip.Addr {
	t.Helper()
	out, err := output("ip", "-j", fam, "addr", "show", "dev", link)
	if err != nil {
		t.Fatalf("%v", err)
	}
	var links []struct {
		AddrInfo []struct {
			Local string `json:"local"`
		} `json:"addr_info"`
	}
	if err := json.Unmarshal([]byte(out), &links); err != nil {
		t.Fatalf("parse ip addr: %v", err)
	}
	var addrs []netip.Addr
	for _, l := range links {
		for _, a := range l.AddrInfo {
			if p, err := netip.ParseAddr(a.Local); err == nil {
				addrs = append(addrs, p)
			}
		}
	}
	return addrs
}

// nsRoutes returns the IPv4 routes inside a namespace as dst -> gateway
// ("" for on-link routes).
func nsRoutes(t *testing.T, ns netns) map[string]string {
	t.Helper()
	out, err := output("ip", "-j", "-4", "-n", ns.name, "route", "show")
	if err != nil {
		t.Fatalf("%v", err)
	}
	var routes []struct {
		Dst     string `json:"dst"`
		Gateway string `json:"gateway"`
	}
	if err := json.Unmarshal([]byte(out), &routes); err != nil {
		t.Fatalf("parse ip route: %v", err)
	}
	m := map[string]string{}
	for _, r := range routes {
		m[r.Dst] = r.Gateway
	}
	return m
}
