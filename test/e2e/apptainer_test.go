package e2e

import (
	"net/netip"
	"strconv"
	"testing"

	"github.com/containernetworking/cni/libcni"
)

// apptainerPortMap is Apptainer's pkg/network PortMapEntry.
type apptainerPortMap struct {
	HostPort      int    `json:"hostPort"`
	ContainerPort int    `json:"containerPort"`
	Protocol      string `json:"protocol"`
	HostIP        string `json:"hostIP,omitempty"`
}

// apptainerRT is the runtime config Apptainer's pkg/network builds: the
// container ID is the container's PID, the namespace /proc/<pid>/ns/net, the
// interface eth0, CNI_ARGS IgnoreUnknown=1 (SetArgs always adds it) and, for
// --network-args "portmap=H:80/tcp", the portMappings capability.
func apptainerRT(cid, nsPath string, hostPort int) *libcni.RuntimeConf {
	rt := &libcni.RuntimeConf{
		ContainerID:    cid,
		NetNS:          nsPath,
		IfName:         ifName,
		Args:           [][2]string{{"IgnoreUnknown", "1"}},
		CapabilityArgs: map[string]any{},
	}
	if hostPort > 0 {
		rt.CapabilityArgs["portMappings"] = []apptainerPortMap{{HostPort: hostPort, ContainerPort: mappedPort, Protocol: "tcp"}}
	}
	return rt
}

// TestApptainerConflist drives conflist/00_bridge.conflist (Apptainer
// etc/network/00_bridge.conflist: legacy host-local "subnet" form, firewall,
// portmap with snat) through libcni as Apptainer's pkg/network does, at
// Apptainer 1.x's cniVersion 1.0.0 and Singularity 3.x's 0.4.0.
func TestApptainerConflist(t *testing.T) {
	for _, v := range []string{"1.0.0", "0.4.0"} {
		t.Run("add-check-del-"+v, func(t *testing.T) {
			e := newEnv(t)
			e.requirePlugin(t)
			conf := e.reclaimConf(t, "00_bridge.conflist")
			conf["cniVersion"] = v
			cni := e.libcniNet(t, conf)
			c := e.startContainer(t, e.addNetns(t, "c1"))
			cid := strconv.Itoa(c.pid)
			c.ns.cid = cid
			e.track(cid)
			hostPort := randomHostPort()
			rt := apptainerRT(cid, c.proc, hostPort)

			res := cni.mustAdd(t, rt)
			if res.CNIVersion != v {
				t.Errorf("result cniVersion %q, want %q", res.CNIVersion, v)
			}
			addr, gw := res.addrIn(t, e.subnet4)
			assertLeases(t, e.leaseDir(), map[netip.Addr]string{addr.Addr(): leaseContent(cid)})
			e.assertDefaultDirsUntouched(t)
			e.assertRecord(t, c.ns, addr.Addr())
			assertAddrOnIf(t, c.ns, addr)
			ping(t, c.ns, gw)
			e.assertNAT(t, cid, natWant{Masq: []netip.Addr{addr.Addr()}, DNAT: []portMap{{hostPort, addr.Addr()}}})
			e.assertFirewall(t, addr.Addr())
			e.assertReaches(t, c.ns, netip.AddrPortFrom(gw, uint16(hostPort)))

			cni.mustCheckDel(t, rt)
			e.assertNetworkEmpty(t, e.leaseDir())
			assertNoFirewall(t, addr.Addr())
			c.stop()
		})
	}

	// Apptainer's container ID is the container's PID. A container killed
	// with SIGKILL never runs its DEL; the next container that gets the same
	// PID (PIDs are reused, and start over at every boot) is ADDed under the
	// same ID and the same path /proc/<pid>/ns/net, which now names another
	// namespace. The test gets the kernel to hand out the dead PID again
	// (ns_last_pid); if another fork on the host takes it first, it reuses
	// the ID with the new PID's path, which exercises the "namespace gone"
	// rule instead of "namespace replaced". Bare bridge refuses with
	// "duplicate allocation"; the plugin releases the dead attachment and
	// succeeds.
	for _, bare := range []bool{false, true} {
		name := "crash-pid-reuse"
		if bare {
			name = "control-bare-bridge-crash-pid-reuse"
		}
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			conf := e.reclaimConf(t, "00_bridge.conflist")
			leaseDir := e.chooseChain(t, conf, bare)
			cni := e.libcniNet(t, conf)
			hostPort := randomHostPort()

			c1 := e.startContainer(t, e.addNetns(t, "c1"))
			cid := strconv.Itoa(c1.pid)
			e.track(cid)
			addr1, _ := cni.mustAdd(t, apptainerRT(cid, c1.proc, hostPort)).addrIn(t, e.subnet4)
			assertLeases(t, leaseDir, map[netip.Addr]string{addr1.Addr(): leaseContent(cid)})

			e.crash(t, c1)

			c2, reused := e.startContainerAtPID(t, e.addNetns(t, "c2"), c1.pid)
			c2.ns.cid = cid
			if reused {
				t.Logf("the new container got the dead one's PID %d: same ID, same path %s, another namespace", c1.pid, c2.proc)
			} else {
				t.Logf("PID %d was taken by another fork; the new container (PID %d) reuses the ID with its own path", c1.pid, c2.pid)
			}
			rt2 := apptainerRT(cid, c2.proc, hostPort)
			res, err := cni.add(t, rt2)
			if bare {
				assertControlFails(t, res, err, duplicateAllocation)
				return
			}
			if err != nil {
				t.Fatalf("ADD under the reused container ID: %v", err)
			}
			addr2, gw2 := res.addrIn(t, e.subnet4)
			assertLeases(t, leaseDir, map[netip.Addr]string{addr2.Addr(): leaseContent(cid)})
			e.assertRecord(t, c2.ns, addr2.Addr())
			ping(t, c2.ns, gw2)
			e.assertNAT(t, cid, natWant{Masq: []netip.Addr{addr2.Addr()}, DNAT: []portMap{{hostPort, addr2.Addr()}}})
			e.assertFirewall(t, addr2.Addr())
			if addr1 != addr2 {
				// The re-ADD released the dead attachment's firewall rules
				// with it (its address is leased nowhere else).
				assertNoFirewall(t, addr1.Addr())
			}

			if err := cni.cfg.DelNetworkList(cni.ctx, cni.list, rt2); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			e.assertNetworkEmpty(t, leaseDir)
			c2.stop()
		})
	}
}
