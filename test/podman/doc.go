// Package podman runs real podman (4.x, CNI network backend) containers on
// networks that use nomad-bridge-cni, both ways it can be adopted, next to
// a control on the reference bridge alone:
//
//   - one word: the network's conflist, as `podman network create` wrote
//     it, with "type": "nomad-bridge-cni" instead of "bridge" (and the
//     plugin's dataDir on a tmpfs the test mounts);
//   - as bridge: the plugin installed as `bridge` in a directory listed
//     before the reference plugins in cni_plugin_dirs, the conflist's
//     "type": "bridge" unchanged (leases in the plugin's default
//     /var/run/cni/<network>);
//   - bare bridge: the control, the reference bridge with host-local's
//     leases in a plain directory of the test. Where the plugin exists to
//     help (a reboot, a lost namespace, a static address after a reboot)
//     the control must fail.
//
// Two scenarios stand apart. A network podman created as plain bridge is
// switched to the one word while its containers run (its leases in
// host-local's default /var/lib/cni/networks/<network>, under a name of the
// test's own): the plugin adopts their leases, and podman, which tears
// them down with the configuration it cached at ADD, can still stop,
// start and remove them. And rootless podman: a throw-away system user
// with subordinate IDs (removed at the end, the account files checked and
// their backups put back) runs the one-word network in podman's rootless
// network namespace, with the plugin's dataDir in its XDG_RUNTIME_DIR (a
// tmpfs), and the operator commands are checked from the host and from
// inside that namespace.
//
// A reboot is simulated without one: podman's conmon and the container are
// killed without podman's cleanup (so nothing sends DEL), the namespaces,
// bridges, NAT rules and mounts of the test go, podman's per-boot state
// (its runroot and tmpdir: the alive file and the locks) is wiped, and so
// is the plugin's tmpfs; then `podman start` restores the same container.
//
// Each test runs podman with its own configuration (CONTAINERS_CONF,
// CONTAINERS_STORAGE_CONF, CONTAINERS_REGISTRIES_CONF), storage, runroot,
// tmpdir, network config dir, file locks instead of /dev/shm, and an image
// imported from busybox-static: the host's podman configuration is only
// read, and the package checks that it is unchanged at the end. Every test
// removes its containers, namespaces, bridges, iptables rules, mounts and
// lease directories, on success and failure alike.
//
// The tests need root, podman, runc, busybox-static, ip, iptables and
// nsenter, and the rootless test also useradd, newuidmap (uidmap) and
// slirp4netns (.ci/run installs them; the rootless test opens /dev/net/tun
// to other users for its duration where no udev rule did). Without them
// they skip, saying why; with CI set in the environment a missing
// prerequisite is a failure. Run them with
//
//	make test-podman
//
// or NBC_BIN_DIR=$PWD/bin go test -count=1 -p 1 -v ./test/podman/, with
// the plugin and the reference plugins (bridge, host-local, portmap,
// firewall, tuning) built into NBC_BIN_DIR by `make build plugins`.
package podman
