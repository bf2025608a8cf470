package e2e

import (
	"context"
	"errors"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"

	gocni "github.com/containerd/go-cni"
)

// criOpts are the namespace options containerd's CRI plugin passes for a pod
// sandbox (internal/cri/server cniNamespaceOpts): the K8S_* labels with
// IgnoreUnknown as CNI_ARGS, the pod annotations capability and, when the pod
// has host ports, the portMappings capability.
func criOpts(t *testing.T, cid string, hostPort int) []gocni.NamespaceOpts {
	labels := map[string]string{}
	for _, kv := range k8sArgs(t, cid) {
		labels[kv[0]] = kv[1]
	}
	opts := []gocni.NamespaceOpts{
		gocni.WithLabels(labels),
		gocni.WithCapability("io.kubernetes.cri.pod-annotations", map[string]string{"kubernetes.io/config.source": "api"}),
	}
	if hostPort > 0 {
		opts = append(opts, gocni.WithCapabilityPortMap([]gocni.PortMapping{{HostPort: int32(hostPort), ContainerPort: mappedPort, Protocol: "tcp"}}))
	}
	return opts
}

// containerdSandbox is one pod sandbox set up through go-cni with
// conf/10-containerd-net.conflist, the way containerd's CRI plugin does.
type containerdSandbox struct {
	ns           netns
	netPlugin    gocni.CNI
	hostPort     int
	opts         []gocni.NamespaceOpts
	ctx          context.Context
	addr4, addr6 netip.Prefix
	gw4, gw6     netip.Addr
	nat          natWant
}

func (e *testEnv) containerdSandbox(t *testing.T) containerdSandbox {
	t.Helper()
	e.requirePlugin(t)
	path := e.writeConflist(t, e.reclaimConf(t, "10-containerd-net.conflist"))
	cid := sandboxID(t)
	sb := containerdSandbox{ns: e.podNetns(t, "pod", cid), hostPort: randomHostPort(), ctx: runtimeCtx(t)}
	sb.netPlugin = e.goCNI(t, gocni.WithConfListFile(path))
	sb.opts = criOpts(t, cid, sb.hostPort)
	res, err := sb.netPlugin.Setup(sb.ctx, cid, sb.ns.path, sb.opts...)
	if err != nil {
		t.Fatalf("Setup: %v", err)
	}
	r := goCNIResult(t, res)
	sb.addr4, sb.gw4 = r.addrIn(t, e.subnet4)
	sb.addr6, sb.gw6 = r.addrIn(t, e.subnet6)
	a4, a6 := sb.addr4.Addr(), sb.addr6.Addr()
	sb.nat = natWant{Masq: []netip.Addr{a4, a6}, DNAT: []portMap{{sb.hostPort, a4}, {sb.hostPort, a6}}}
	e.assertNAT(t, cid, sb.nat)
	return sb
}

// remove is StopPodSandbox's teardown of the sandbox's network.
func (sb containerdSandbox) remove(nsPath string) error {
	return sb.netPlugin.Remove(sb.ctx, sb.ns.cid, nsPath, sb.opts...)
}

// TestContainerdConflist drives conflist/10-containerd-net.conflist
// (containerd script/setup/install-cni, containerd v1.7/v2.x: bridge +
// portmap, cniVersion 1.0.0, dual-stack, promiscMode) through
// github.com/containerd/go-cni as containerd's CRI plugin does: a 64-hex
// sandbox ID, the K8S_* CNI_ARGS with IgnoreUnknown, the pod-annotations and
// portMappings capabilities, libcni's default cache.
func TestContainerdConflist(t *testing.T) {
	t.Run("setup-check-remove", func(t *testing.T) {
		e := newEnv(t)
		sb := e.containerdSandbox(t)
		ns, cid := sb.ns, sb.ns.cid
		assertLeases(t, e.leaseDir(), map[netip.Addr]string{sb.addr4.Addr(): leaseContent(cid), sb.addr6.Addr(): leaseContent(cid)})
		assertLeases(t, filepath.Join(e.persistDir, e.netName), nil)
		e.assertDefaultDirsUntouched(t)
		e.assertRecord(t, ns, sb.addr4.Addr())
		assertAddrOnIf(t, ns, sb.addr4)
		assertAddrOnIf(t, ns, sb.addr6)
		if flags, _ := linkInfo(t, "", e.bridge); !slices.Contains(flags, "PROMISC") {
			t.Errorf("promiscMode: bridge %s is not promiscuous: %v", e.bridge, flags)
		}
		ping(t, ns, sb.gw4)
		waitAddrSettled(t, sb.gw6)
		ping(t, ns, sb.gw6)
		e.assertReaches(t, ns, netip.AddrPortFrom(sb.gw4, uint16(sb.hostPort)))
		if _, err := os.Stat(e.cachedResult(cnitoolCacheDir, cid)); err != nil {
			t.Errorf("libcni cached no result for the sandbox: %v", err)
		}

		if err := sb.netPlugin.Check(sb.ctx, cid, ns.path, sb.opts...); err != nil {
			t.Fatalf("Check: %v", err)
		}
		if err := sb.remove(ns.path); err != nil {
			t.Fatalf("Remove: %v", err)
		}
		e.assertNetworkEmpty(t, e.leaseDir())
		if linkExistsIn(ns, ifName) {
			t.Errorf("%s still exists in %s after Remove", ifName, ns.name)
		}
		if _, err := os.Stat(e.cachedResult(cnitoolCacheDir, cid)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("libcni cache of the sandbox left after Remove (stat: %v)", err)
		}
		// StopPodSandbox is retried until it succeeds: Remove is idempotent.
		if err := sb.remove(ns.path); err != nil {
			t.Fatalf("second Remove: %v", err)
		}
		e.assertNetworkEmpty(t, e.leaseDir())
	})

	// StopPodSandbox after the sandbox's namespace is gone (reboot, killed
	// shim): containerd finds the netns closed and calls Remove with an
	// empty path. bridge then releases the leases but skips its ipMasq
	// teardown; every rule of the sandbox, IPv4 and IPv6, must still go.
	t.Run("remove-after-netns-lost", func(t *testing.T) {
		e := newEnv(t)
		sb := e.containerdSandbox(t)
		e.mustKillNetns(t, sb.ns)
		if err := sb.remove(""); err != nil {
			t.Fatalf("Remove with an empty netns path: %v", err)
		}
		e.assertNetworkEmpty(t, e.leaseDir())
	})
}
