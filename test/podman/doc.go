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
// nsenter (.ci/run installs them). Without them they skip, saying why;
// with CI set in the environment a missing prerequisite is a failure. Run
// them with
//
//	make test-podman
//
// or NBC_BIN_DIR=$PWD/bin go test -count=1 -p 1 -v ./test/podman/, with
// the plugin and the reference plugins (bridge, host-local, portmap,
// firewall, tuning) built into NBC_BIN_DIR by `make build plugins`.
package podman
