package e2e

import (
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
)

// TestFirewallRulesGoWithTheirAttachment: the firewall plugin's
// per-address CNI-FORWARD rules (no comment: only the address names them)
// of an attachment released without a DEL go with it when no other
// network leases the address, and stay when one does: here a second
// network, misconfigured onto the same subnet and data dir, whose first
// container got the same address (a working container, whose rules they
// are too). The release says so, `metrics` counts it.
func TestFirewallRulesGoWithTheirAttachment(t *testing.T) {
	for _, shared := range []bool{false, true} {
		name := map[bool]string{false: "address-free", true: "address-leased-by-another-network"}[shared]
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			ns, a1 := e.addWithFirewall(t)

			var other libcniNet
			var rt *libcni.RuntimeConf
			if shared {
				conf := e.confFor(t, "nomad.conflist")
				conf["name"] = e.netName + "-twin"
				bridge := "nbct" + e.id
				entryOfType(t, conf, pluginType)["bridge"] = bridge
				t.Cleanup(func() {
					if linkExists(bridge) {
						_ = run("ip", "link", "delete", bridge)
					}
				})
				other = e.libcniNet(t, conf)
				twin := e.addNetns(t, "twin")
				cid := "twin-" + e.id
				e.track(cid)
				rt = &libcni.RuntimeConf{ContainerID: cid, NetNS: twin.path, IfName: ifName}
				t.Cleanup(func() { _ = other.cfg.DelNetworkList(other.ctx, other.list, rt) })
				addr, _ := other.mustAdd(t, rt).addrIn(t, e.subnet4)
				if addr.Addr() != a1 {
					t.Fatalf("the twin network's container got %s, the first %s: the test needs the same address", addr, a1)
				}
			}

			e.mustKillNetns(t, ns)
			out := e.operatorSweep(t)
			assertLeases(t, e.leaseDir(), nil)
			rules := firewallRules(t, a1)
			if shared {
				if len(rules) != 2 {
					t.Errorf("the twin's firewall rules for %s went with the released attachment:\n%s", a1, rulesString(rules))
				}
				if !strings.Contains(out, "firewall rules of "+a1.String()+" kept: "+a1.String()+" is leased in network "+e.netName+"-twin") {
					t.Errorf("gc did not say what it kept:\n%s", out)
				}
				metrics, _, err := e.operator(t, "metrics", "--data-dir", e.dataDir)
				if err != nil {
					t.Fatal(err)
				}
				if want := `nomad_bridge_cni_firewall_rules_kept_total{network="` + e.netName + `"} 1`; !strings.Contains(metrics, want) {
					t.Errorf("metrics lack %s:\n%s", want, metrics)
				}
				if err := other.cfg.DelNetworkList(other.ctx, other.list, rt); err != nil {
					t.Fatal(err)
				}
			} else {
				if len(rules) != 0 {
					t.Errorf("firewall rules of the released %s left:\n%s", a1, rulesString(rules))
				}
				if !strings.Contains(out, "firewall rules of "+a1.String()+" in CNI-FORWARD (2)") {
					t.Errorf("gc did not say it removed them:\n%s", out)
				}
			}
			assertNoFirewall(t, a1)
			e.assertNetworkEmpty(t, e.leaseDir())
		})
	}
}

// TestDelWithoutCachedResultTakesTheFirewallRules: a runtime killed while
// it wrote its cached result of an ADD (libcni's cache: the syskill sample
// caught cnitool killed at that write) DELs with no prevResult, as libcni
// does when the cache cannot be read; the firewall plugin, which finds its
// per-address CNI-FORWARD rules only through prevResult, then leaves them.
// The plugin's DEL takes them with the attachment: nothing of it is left.
func TestDelWithoutCachedResultTakesTheFirewallRules(t *testing.T) {
	for _, how := range []string{"empty", "missing"} {
		t.Run(how, func(t *testing.T) {
			e := newEnv(t)
			ns, addr := e.addWithFirewall(t)
			cache := e.cachedResult(cnitoolCacheDir, ns.cid)
			var err error
			if how == "empty" {
				err = os.Truncate(cache, 0)
			} else {
				err = os.Remove(cache)
			}
			if err != nil {
				t.Fatalf("the runtime's cached result: %v", err)
			}
			e.mustCNI(t, "del", ns, "")
			assertNoFirewall(t, addr)
			e.assertNoTrace(t, ns.cid)
		})
	}
}

// addWithFirewall runs cnitool's ADD of Nomad's chain into a new
// namespace and checks the firewall plugin's rules of its address.
func (e *testEnv) addWithFirewall(t *testing.T) (netns, netip.Addr) {
	t.Helper()
	e.requirePlugin(t)
	e.writeConflist(t, e.confFor(t, "nomad.conflist"))
	ns := e.addNetns(t, "a")
	p, _ := parseResult(t, e.mustCNI(t, "add", ns, "")).addrIn(t, e.subnet4)
	e.assertFirewall(t, p.Addr())
	return ns, p.Addr()
}
