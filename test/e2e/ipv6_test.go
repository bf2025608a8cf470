package e2e

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

// TestIPv6Sweeps: on a dual-stack network (conflist/dual-stack.conflist:
// bridge with ipMasq, portmap) and an IPv6-only one, a container that died
// without a DEL is seen stale with every address of both families by
// `leases` and `metrics`, and `gc` releases its leases, its ip6tables (and
// iptables) ipMasq jump and chain and its portmap DNAT rules; a live
// container keeps all of its own, and its DEL leaves the network empty.
func TestIPv6Sweeps(t *testing.T) {
	for _, family := range []string{"dual-stack", "ipv6-only"} {
		t.Run(family, func(t *testing.T) {
			e := newEnv(t)
			e.requirePlugin(t)
			conf := e.confFor(t, "dual-stack.conflist")
			if family == "ipv6-only" {
				ipam := entryOfType(t, conf, pluginType)["ipam"].(map[string]any)
				ipam["ranges"] = []any{[]any{map[string]any{"subnet": e.subnet6.String()}}}
				ipam["routes"] = []any{map[string]any{"dst": "::/0"}}
			}
			e.writeConflist(t, conf)
			live, dead := e.addNetns(t, "live"), e.addNetns(t, "dead")
			livePort, deadPort := randomHostPort(), randomHostPort()
			for deadPort == livePort {
				deadPort = randomHostPort()
			}
			addrs := func(out string) []netip.Addr {
				res := parseResult(t, out)
				var as []netip.Addr
				a6, _ := res.addrIn(t, e.subnet6)
				if family == "dual-stack" {
					a4, _ := res.addrIn(t, e.subnet4)
					as = append(as, a4.Addr())
				}
				return append(as, a6.Addr())
			}
			nat := func(as []netip.Addr, port int) natWant {
				w := natWant{Masq: as}
				for _, a := range as {
					w.DNAT = append(w.DNAT, portMap{port, a})
				}
				return w
			}
			liveAddrs := addrs(e.mustCNI(t, "add", live, portMappings(livePort)))
			deadAddrs := addrs(e.mustCNI(t, "add", dead, portMappings(deadPort)))
			e.assertNAT(t, dead.cid, nat(deadAddrs, deadPort))
			e.destroyNetns(t, dead)

			doc := e.leasesJSON(t)
			shown := map[string][]string{}
			for _, l := range doc.Leases {
				shown[l.ContainerID] = append(shown[l.ContainerID], l.IP+" "+l.State)
			}
			for cid, as := range map[string][]netip.Addr{live.cid: liveAddrs, dead.cid: deadAddrs} {
				state := map[bool]string{true: "live", false: "stale"}[cid == live.cid]
				var want []string
				for _, a := range as {
					want = append(want, a.String()+" "+state)
				}
				slices.Sort(want)
				got := slices.Sorted(slices.Values(shown[cid]))
				if !slices.Equal(got, want) {
					t.Errorf("leases shows %s as %q, want %q", cid, got, want)
				}
			}
			metrics, _, err := e.operator(t, "metrics", "--data-dir", e.dataDir)
			if err != nil {
				t.Fatal(err)
			}
			for _, want := range []string{
				fmt.Sprintf("nomad_bridge_cni_leases{network=%q} %d", e.netName, len(liveAddrs)+len(deadAddrs)),
				fmt.Sprintf("nomad_bridge_cni_attachments{network=%q,state=\"stale\"} 1", e.netName),
			} {
				if !strings.Contains(metrics, want) {
					t.Errorf("metrics lack %s:\n%s", want, metrics)
				}
			}

			e.operatorSweep(t)
			want := map[netip.Addr]string{}
			for _, a := range liveAddrs {
				want[a] = leaseContent(live.cid)
			}
			assertLeases(t, e.leaseDir(), want)
			e.assertNAT(t, dead.cid, natWant{})
			e.assertNAT(t, live.cid, nat(liveAddrs, livePort))

			e.mustCNI(t, "del", live, portMappings(livePort))
			e.assertNetworkEmpty(t, e.leaseDir())
		})
	}
}
