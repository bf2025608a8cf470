package e2e

import (
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	gocni "github.com/containerd/go-cni"
)

// TestRestoreInPlaceKeepsTheAddress is Nomad's lost-namespace restore
// through go-cni as Nomad calls it (Setup with its CNI_ARGS and port
// mappings, the namespace re-created at the same path, Setup again, no
// Remove between): the allocation gets its old address back when it is
// still free. When another lease holds it, or it is outside the range
// now, the allocation gets another one, and nothing of the attempt that
// asked for it is left (one lease, one address in the namespace, the NAT
// rules of the new address only).
func TestRestoreInPlaceKeepsTheAddress(t *testing.T) {
	for _, tc := range []string{"kept", "taken", "out-of-range"} {
		t.Run(tc, func(t *testing.T) {
			e := newEnv(t)
			e.requirePlugin(t)
			conf := e.confFor(t, "nomad.conflist")
			alloc := podUID(t)
			ns := e.podNetns(t, "alloc", alloc)
			port := randomHostPort()
			ctx := runtimeCtx(t)
			nomad := e.goCNI(t, gocni.WithConfListBytes(mustJSON(t, conf)))

			res, err := nomad.Setup(ctx, alloc, ns.path, nomadOpts(alloc, port)...)
			if err != nil {
				t.Fatalf("Setup: %v", err)
			}
			p1, _ := goCNIResult(t, res).addrIn(t, e.subnet4)

			e.restoreNetns(t, ns)
			want := map[netip.Addr]string{}
			switch tc {
			case "taken":
				// Its lease names another container now (as if handed out
				// in between): the release leaves it.
				planted := filepath.Join(e.leaseDir(), p1.Addr().String())
				if err := os.WriteFile(planted, []byte(leaseContent("someone-else")), 0o600); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { os.Remove(planted) })
				want[p1.Addr()] = leaseContent("someone-else")
			case "out-of-range":
				var again map[string]any
				if err := json.Unmarshal(mustJSON(t, conf), &again); err != nil {
					t.Fatal(err)
				}
				setRange(t, again, e.hostAddr(100), e.hostAddr(120))
				nomad = e.goCNI(t, gocni.WithConfListBytes(mustJSON(t, again)))
			}
			res, err = nomad.Setup(ctx, alloc, ns.path, nomadOpts(alloc, port)...)
			if err != nil {
				t.Fatalf("Setup after the namespace was lost: %v", err)
			}
			p2, gw := goCNIResult(t, res).addrIn(t, e.subnet4)
			if kept := p2 == p1; kept != (tc == "kept") {
				t.Errorf("restored with %s, first %s: want the same address only when it was free and in range", p2, p1)
			}
			want[p2.Addr()] = leaseContent(alloc)
			assertLeases(t, e.leaseDir(), want)
			assertOnlyAddrOnIf(t, ns, p2)
			ping(t, ns, gw)
			e.assertNAT(t, alloc, natWant{Masq: []netip.Addr{p2.Addr()}, DNAT: []portMap{{port, p2.Addr()}}})

			if err := nomad.Remove(ctx, alloc, ns.path, nomadDelOpts(port)...); err != nil {
				t.Fatalf("Remove: %v", err)
			}
			delete(want, p2.Addr())
			assertLeases(t, e.leaseDir(), want)
			e.assertRecordsExactly(t)
			e.assertNetworkNATEmpty(t)
		})
	}
}

// assertOnlyAddrOnIf checks that the namespace's interface carries addr
// and no other IPv4 address: an attempt that was undone left none.
func assertOnlyAddrOnIf(t *testing.T, ns netns, addr netip.Prefix) {
	t.Helper()
	assertAddrOnIf(t, ns, addr)
	enter := ns.enter()
	out, err := output(enter[0], append(enter[1:], "ip", "-j", "-4", "addr", "show")...)
	if err != nil {
		t.Fatal(err)
	}
	var links []struct {
		IfName   string `json:"ifname"`
		AddrInfo []struct {
			Local string `json:"local"`
		} `json:"addr_info"`
	}
	if err := json.Unmarshal([]byte(out), &links); err != nil {
		t.Fatalf("parse ip addr: %v", err)
	}
	for _, l := range links {
		for _, a := range l.AddrInfo {
			if l.IfName != "lo" && a.Local != addr.Addr().String() {
				t.Errorf("%s in %s also carries %s", l.IfName, ns.name, a.Local)
			}
		}
	}
}

// One order Nomad can take on a client restart where one allocation lost
// its namespace: the others are restored with CHECK (whose sweep releases
// the lost one: its namespace was replaced) before the lost one's ADD,
// without a DEL. Nomad runs each restored allocation in a goroutine of its
// own (client/client.go: go ar.Run() over a map), and the one lock in
// client/allocrunner/networking.go only serialises their Setup and
// Teardown, so the ADD may come first too. The restored allocation must
// still get its address back (regression: it got the next free one
// whenever a CHECK swept first).
func TestRestoreAfterAnotherCHECKSweptKeepsTheAddress(t *testing.T) {
	e := newEnv(t)
	e.requirePlugin(t)
	nomad := e.goCNI(t, gocni.WithConfListBytes(mustJSON(t, e.confFor(t, "nomad.conflist"))))
	ctx := runtimeCtx(t)
	lost, kept := podUID(t), podUID(t)
	lostNS, keptNS := e.podNetns(t, "lost", lost), e.podNetns(t, "kept", kept)
	lostPort, keptPort := randomHostPort(), randomHostPort()
	res, err := nomad.Setup(ctx, lost, lostNS.path, nomadOpts(lost, lostPort)...)
	if err != nil {
		t.Fatalf("Setup: %v", err)
	}
	p1, _ := goCNIResult(t, res).addrIn(t, e.subnet4)
	if _, err := nomad.Setup(ctx, kept, keptNS.path, nomadOpts(kept, keptPort)...); err != nil {
		t.Fatalf("Setup: %v", err)
	}

	e.restoreNetns(t, lostNS)
	if err := nomad.Check(ctx, kept, keptNS.path, nomadOpts(kept, keptPort)...); err != nil {
		t.Fatalf("CHECK of the other allocation: %v", err)
	}
	if _, err := os.Stat(filepath.Join(e.dataDir, recordDirName, e.netName, lost+"@"+ifName)); !os.IsNotExist(err) {
		t.Fatalf("the CHECK's sweep did not release the lost allocation first (%v): the test shows nothing", err)
	}
	res, err = nomad.Setup(ctx, lost, lostNS.path, nomadOpts(lost, lostPort)...)
	if err != nil {
		t.Fatalf("Setup of the lost allocation: %v", err)
	}
	p2, gw := goCNIResult(t, res).addrIn(t, e.subnet4)
	if p2 != p1 {
		t.Errorf("restored with %s, first %s", p2, p1)
	}
	assertOnlyAddrOnIf(t, lostNS, p2)
	ping(t, lostNS, gw)
	for _, a := range []struct {
		id   string
		ns   netns
		port int
	}{{lost, lostNS, lostPort}, {kept, keptNS, keptPort}} {
		if err := nomad.Remove(ctx, a.id, a.ns.path, nomadDelOpts(a.port)...); err != nil {
			t.Fatalf("Remove: %v", err)
		}
	}
	e.assertNetworkEmpty(t, e.leaseDir())
}

// A dual-stack container restored in place after its IPv6 range changed
// in the conflist keeps its IPv4 address, still free and in range: only
// the address outside the ranges now is given up (regression: host-local
// refused the whole request, and the fallback asking for nothing gave the
// container the next free IPv4 address too).
func TestRestoreInPlaceKeepsTheAddressStillInRange(t *testing.T) {
	e := newEnv(t)
	e.requirePlugin(t)
	conf := e.confFor(t, "dual-stack.conflist")
	e.writeConflist(t, conf)
	ns := e.addNetns(t, "dual")
	addrs := func(out string) (netip.Prefix, netip.Prefix) {
		res := parseResult(t, out)
		a4, _ := res.addrIn(t, e.subnet4)
		a6, _ := res.addrIn(t, e.subnet6)
		return a4, a6
	}
	first4, first6 := addrs(e.mustCNI(t, "add", ns, ""))

	e.restoreNetns(t, ns)
	// The IPv6 range no longer holds the first IPv6 address.
	for _, set := range entryOfType(t, conf, pluginType)["ipam"].(map[string]any)["ranges"].([]any) {
		r := set.([]any)[0].(map[string]any)
		if p := netip.MustParsePrefix(r["subnet"].(string)); p.Addr().Is6() {
			start := first6.Addr().Next().Next().Next()
			r["rangeStart"], r["rangeEnd"] = start.String(), start.Next().Next().String()
		}
	}
	e.writeConflist(t, conf)
	again4, again6 := addrs(e.mustCNI(t, "add", ns, ""))
	if again4 != first4 || again6 == first6 {
		t.Errorf("restored with %s %s, first %s %s: want the IPv4 address kept, a new IPv6 one", again4, again6, first4, first6)
	}
	assertLeases(t, e.leaseDir(), map[netip.Addr]string{again4.Addr(): leaseContent(ns.cid), again6.Addr(): leaseContent(ns.cid)})
	e.mustCNI(t, "del", ns, "")
	e.assertNetworkEmpty(t, e.leaseDir())
}
