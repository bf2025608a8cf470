// Package containerd runs a real containerd (Debian's package, 1.6.x),
// driven through its CRI plugin by crictl as a kubelet would, on
// containerd's own 10-containerd-net.conflist with the one-word edit
// ("type": "nomad-bridge-cni"), and proves on the host's real state
// (host-local's lease files, the plugin's attachment records, the NAT rules
// bridge's ipMasq writes, the address inside the pod's namespace) that a
// pod's network is released whatever happens to the pod:
//
//   - a pod run, stopped and removed (crictl runp, stopp, rmp);
//   - containerd SIGKILLed and started again with pods running (their
//     shims survive): the pods keep their addresses and nothing leaks;
//   - a pod's namespace path lost while containerd runs, then the pod
//     stopped and removed: containerd's DEL has an empty netns;
//   - a simulated reboot: containerd, its shims and the pods' processes
//     killed, every namespace of the pods gone, containerd started again
//     (pods NotReady), then stopp and rmp.
//
// A control runs the lost-namespace scenario on the unedited conflist
// ("type": "bridge"): bare bridge must leave the pod's ipMasq rules behind,
// or the scenario would prove nothing.
//
// Each test starts its own containerd with its own root, state directory,
// socket and configuration (the CRI plugin's bin_dir is NBC_BIN_DIR,
// conf_dir a temporary directory, runc's state under the test's directory,
// the native snapshotter), and imports a pause image built from ./pause
// with `ctr images import`: no registry. The host's /etc/containerd,
// /var/lib/containerd and /run/containerd are never used, and TestMain
// checks that they are as they were (containerd 1.6's shims put their
// sockets in /run/containerd/s whatever the state directory; the tests
// remove their own). Every test removes its containerd, shims, pods,
// namespaces, bridge, iptables rules and directories, on success and on
// failure.
//
// The tests need root, containerd, ctr, containerd-shim-runc-v2, runc, ip,
// iptables and ip6tables, and crictl and the plugins in NBC_BIN_DIR
// (`make test-containerd` builds them; .ci/run installs the packages).
// Without the host prerequisites they skip, saying why; with CI set in the
// environment that is a failure.
package containerd
