package e2e

import (
	"net/netip"
	"testing"

	gocni "github.com/containerd/go-cni"
)

// TestNerdctlDelBeforeAdd reproduces nerdctl's OCI hook (pkg/ocihook
// applyNetworkSettings, nerdctl v2.x) on conflist/10-containerd-net.conflist
// (`nerdctl run --net containerd-net`): go-cni loaded with the conflist's
// bytes, container ID "<namespace>-<id>", the namespace as
// /proc/<pid>/ns/net, CNI_ARGS IgnoreUnknown=1 and
// NERDCTL_CNI_DHCP_HOSTNAME, portMappings; and, since nerdctl#3355, a Remove
// with an empty netns path before every Setup. The scenario is #3355's:
// containerd is bounced, the container's process and namespace die without
// the postStop hook's DEL, and the restarted container goes through
// createRuntime again under the same ID.
func TestNerdctlDelBeforeAdd(t *testing.T) {
	for _, tc := range []struct {
		name      string
		preRemove bool
		bare      bool
	}{
		{name: "nomad-bridge-cni", preRemove: true},
		{name: "without-pre-remove", preRemove: false},
		{name: "control-bare-bridge", preRemove: true, bare: true},
		{name: "control-bare-bridge-without-pre-remove", preRemove: false, bare: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			conf := e.reclaimConf(t, "10-containerd-net.conflist")
			leaseDir := e.chooseChain(t, conf, tc.bare)
			e.writeConflist(t, conf)
			netPlugin := e.goCNI(t, gocni.WithConfListBytes(mustJSON(t, conf)))
			fullID := "default-" + sandboxID(t)
			e.track(fullID)
			hostPort := randomHostPort()
			opts := []gocni.NamespaceOpts{
				gocni.WithCapabilityPortMap([]gocni.PortMapping{{HostPort: int32(hostPort), ContainerPort: mappedPort, Protocol: "tcp"}}),
				gocni.WithLabels(map[string]string{"IgnoreUnknown": "1"}),
				gocni.WithArgs("NERDCTL_CNI_DHCP_HOSTNAME", "web"),
			}
			ctx := runtimeCtx(t)
			// createRuntime: the empty DEL (since nerdctl#3355), which must
			// release everything a dead container held, then Setup.
			createRuntime := func(c *container) (cniResult, error) {
				t.Helper()
				c.ns.cid = fullID
				if tc.preRemove {
					if err := netPlugin.Remove(ctx, fullID, "", opts...); err != nil {
						t.Fatalf("Remove with an empty netns path: %v", err)
					}
					assertLeases(t, leaseDir, nil)
					if !tc.bare {
						e.assertNAT(t, fullID, natWant{})
						e.assertNoRecord(t, fullID)
					}
				}
				res, err := netPlugin.Setup(ctx, fullID, c.proc, opts...)
				if err != nil {
					return cniResult{}, err
				}
				return goCNIResult(t, res), nil
			}
			natOf := func(r cniResult) natWant {
				a4, _ := r.addrIn(t, e.subnet4)
				a6, _ := r.addrIn(t, e.subnet6)
				assertLeases(t, leaseDir, map[netip.Addr]string{a4.Addr(): leaseContent(fullID), a6.Addr(): leaseContent(fullID)})
				return natWant{Masq: []netip.Addr{a4.Addr(), a6.Addr()}, DNAT: []portMap{{hostPort, a4.Addr()}, {hostPort, a6.Addr()}}}
			}

			c1 := e.startContainer(t, e.addNetns(t, "c1"))
			r1, err := createRuntime(c1)
			if err != nil {
				t.Fatalf("Setup: %v", err)
			}
			e.assertNAT(t, fullID, natOf(r1))

			// containerd bounced: no postStop, the namespace is gone.
			e.crash(t, c1)

			// createRuntime of the restarted container.
			c2 := e.startContainer(t, e.addNetns(t, "c2"))
			r2, err := createRuntime(c2)
			if tc.bare && !tc.preRemove {
				assertControlFails(t, r2, err, duplicateAllocation)
				return
			}
			if err != nil {
				t.Fatalf("Setup of the restarted container: %v", err)
			}
			nat := natOf(r2)
			if tc.bare {
				if j := e.readNAT(t, fullID)["iptables"].masqJumps; len(j) < 2 {
					t.Fatalf("control: bare bridge left no duplicate ipMasq jump (%d jumps); the test no longer shows the gap:\n%s", len(j), rulesString(j))
				}
				t.Logf("control: bare bridge duplicated the ipMasq jumps of %s, as upstream does", fullID)
				return
			}
			e.assertNAT(t, fullID, nat)
			b4, gw4 := r2.addrIn(t, e.subnet4)
			e.assertRecord(t, c2.ns, b4.Addr())
			ping(t, c2.ns, gw4)

			// postStop.
			if err := netPlugin.Remove(ctx, fullID, c2.proc, opts...); err != nil {
				t.Fatalf("Remove: %v", err)
			}
			e.assertNetworkEmpty(t, leaseDir)
			c2.stop()
		})
	}
}
