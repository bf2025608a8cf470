package e2e

import (
	"errors"
	"io/fs"
	"net/netip"
	"os"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
)

// crioRT is the runtime config CRI-O's ocicni builds for a pod sandbox: the
// sandbox ID, its namespace path, eth0 and the K8S_* CNI_ARGS with
// IgnoreUnknown.
func crioRT(t *testing.T, ns netns) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{
		ContainerID:    ns.cid,
		NetNS:          ns.path,
		IfName:         ifName,
		Args:           k8sArgs(t, ns.cid),
		CapabilityArgs: map[string]any{},
	}
}

// TestCRIOConflist drives conflist/11-crio-ipv4-bridge.conflist (CRI-O
// contrib/cni/11-crio-ipv4-bridge.conflist, CRI-O >= 1.27: cniVersion
// 1.0.0, hairpinMode) through libcni as CRI-O's ocicni does, including
// CRI-O's garbage collection at start-up.
func TestCRIOConflist(t *testing.T) {
	t.Run("add-check-del", func(t *testing.T) {
		e := newEnv(t)
		e.requirePlugin(t)
		cni := e.libcniNet(t, e.reclaimConf(t, "11-crio-ipv4-bridge.conflist"))
		ns := e.podNetns(t, "pod", sandboxID(t))
		rt := crioRT(t, ns)

		res := cni.mustAdd(t, rt)
		if res.CNIVersion != "1.0.0" {
			t.Errorf("result cniVersion %q, want 1.0.0", res.CNIVersion)
		}
		addr, gw := res.addrIn(t, e.subnet4)
		assertLeases(t, e.leaseDir(), map[netip.Addr]string{addr.Addr(): leaseContent(ns.cid)})
		e.assertDefaultDirsUntouched(t)
		e.assertRecord(t, ns, addr.Addr())
		assertAddrOnIf(t, ns, addr)
		ping(t, ns, gw)
		e.assertNAT(t, ns.cid, natWant{Masq: []netip.Addr{addr.Addr()}})
		e.assertHairpin(t, true)

		cni.mustCheckDel(t, rt)
		e.assertNetworkEmpty(t, e.leaseDir())
	})

	// CRI-O's start-up garbage collection (ocicni GC -> libcni
	// GCNetworkList with the pods it still knows as the valid list): first a
	// DEL replayed from libcni's cache for every cached attachment not in the
	// list, with the namespace path recorded at ADD, which no longer exists;
	// then, at cniVersion 1.1.0, the GC verb itself. Pod "kept" is valid and
	// must keep everything; "gone1" and "gone2" died while CRI-O was down;
	// at 1.1.0 "uncached" also died and lost its cache entry, so only the GC
	// verb can release it. The control runs bare bridge: its replayed DEL
	// releases the lease but leaves the ipMasq rules, which proves the
	// assertion can fail.
	for _, tc := range []struct {
		name, version string
		bare          bool
	}{
		{name: "startup-gc-1.0.0", version: "1.0.0"},
		{name: "startup-gc-1.1.0", version: "1.1.0"},
		{name: "control-bare-bridge-startup-gc-1.0.0", version: "1.0.0", bare: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			conf := e.reclaimConf(t, "11-crio-ipv4-bridge.conflist")
			conf["cniVersion"] = tc.version
			leaseDir := e.chooseChain(t, conf, tc.bare)
			cni := e.libcniNet(t, conf)

			names := []string{"kept", "gone1", "gone2"}
			if tc.version == "1.1.0" {
				names = append(names, "uncached")
			}
			pods := map[string]netns{}
			addrs := map[string]netip.Addr{}
			for _, name := range names {
				ns := e.podNetns(t, name, sandboxID(t))
				a, _ := cni.mustAdd(t, crioRT(t, ns)).addrIn(t, e.subnet4)
				pods[name], addrs[name] = ns, a.Addr()
				e.assertNAT(t, ns.cid, natWant{Masq: []netip.Addr{a.Addr()}})
			}
			for _, name := range names[1:] {
				e.mustKillNetns(t, pods[name])
			}
			if tc.version == "1.1.0" {
				cache := e.cachedResult(e.cacheDir, pods["uncached"].cid)
				if err := os.Remove(cache); err != nil {
					t.Fatalf("drop the cache entry of uncached: %v", err)
				}
			}

			kept := pods["kept"]
			err := cni.cfg.GCNetworkList(cni.ctx, cni.list, &libcni.GCArgs{ValidAttachments: []types.GCAttachment{{ContainerID: kept.cid, IfName: ifName}}})
			if err != nil {
				t.Fatalf("GC with the valid list [kept]: %v", err)
			}
			for _, name := range []string{"gone1", "gone2"} {
				if _, err := os.Stat(e.cachedResult(e.cacheDir, pods[name].cid)); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("libcni did not replay a successful DEL for %s: its cache entry is still there (stat: %v)", name, err)
				}
			}
			assertLeases(t, leaseDir, map[netip.Addr]string{addrs["kept"]: leaseContent(kept.cid)})
			if tc.bare {
				if len(e.readNAT(t, pods["gone1"].cid)["iptables"].masqJumps) == 0 {
					t.Fatalf("control: bare bridge removed the ipMasq rules of a DEL replayed with a dead netns path; the test no longer shows the gap")
				}
				t.Logf("control: bare bridge's replayed DELs left the ipMasq rules of gone1 and gone2, as upstream does")
				return
			}

			for _, name := range names[1:] {
				e.assertNAT(t, pods[name].cid, natWant{})
			}
			e.assertRecordsExactly(t, kept.cid)
			e.assertRecord(t, kept, addrs["kept"])
			e.assertNAT(t, kept.cid, natWant{Masq: []netip.Addr{addrs["kept"]}})
			if _, err := os.Stat(e.cachedResult(e.cacheDir, kept.cid)); err != nil {
				t.Errorf("the valid pod lost its cache entry: %v", err)
			}
			if tc.version == "1.1.0" {
				if err := cni.cfg.GetStatusNetworkList(cni.ctx, cni.list); err != nil {
					t.Errorf("STATUS after GC: %v", err)
				}
			}

			// The kept pod still works, and goes cleanly.
			ping(t, kept, e.hostAddr(1))
			cni.mustCheckDel(t, crioRT(t, kept))
			e.assertNetworkEmpty(t, leaseDir)
		})
	}
}
