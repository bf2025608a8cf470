#!/usr/bin/env bash
# scripts/deps.sh GROUP...: installs the Debian packages that the make
# targets of GROUP need, the one list of them (make demo, make test and its
# parts, and .ci/run all call it). Does nothing when every command is there;
# otherwise says what it installs and why, runs `apt-get update` once, then
# `apt-get install`. Needs root to install; on a host without apt-get it
# names the packages and stops.
#
# Groups: demo, unit, e2e, podman, containerd, release, prom, ci (every group, and
# what .ci/run itself uses).
set -euo pipefail

# group: command package why
LIST='
demo       ip                       iproute2          network namespaces, veths and addresses
demo       iptables                 iptables          the bridge plugin'"'"'s masquerade rules
demo       ping                     iputils-ping      the demo pings the gateway from a namespace
demo       update-ca-certificates   ca-certificates   Go downloads modules over HTTPS
unit       ip                       iproute2          tests make network namespaces
unit       iptables                 iptables          NAT rule tests
unit       ip6tables                iptables          NAT rule tests (IPv6)
unit       nft                      nftables          nftables rule tests
unit       update-ca-certificates   ca-certificates   Go downloads modules over HTTPS
unit       mkfs.ext4                e2fsprogs         tests that need a directory off tmpfs make one
unit       strace                   strace            a re-ADD test fails a directory listing (getdents64) by fault injection
e2e        ip                       iproute2          network namespaces, veths and addresses
e2e        iptables                 iptables          bridge, portmap and firewall rules
e2e        ip6tables                iptables          bridge, portmap and firewall rules (IPv6)
e2e        nft                      nftables          the nftables backends
e2e        ping                     iputils-ping      pings from the namespaces
e2e        nsenter                  util-linux        commands inside a namespace
e2e        strace                   strace            the crash tests kill iptables at its exec
podman     podman                   podman            real podman containers (CNI backend)
podman     runc                     runc              podman'"'"'s runtime (crun refuses hybrid cgroup hosts)
podman     busybox                  busybox-static    the containers'"'"' image
podman     newuidmap                uidmap            rootless podman
podman     newgidmap                uidmap            rootless podman
podman     slirp4netns              slirp4netns       rootless podman'"'"'s network
containerd containerd               containerd        a real containerd driven through CRI
containerd ctr                      containerd        imports the test'"'"'s pause image
containerd containerd-shim-runc-v2  containerd        containerd'"'"'s runc shim
containerd runc                     runc              containerd'"'"'s runtime
release    dpkg-deb                 dpkg              reads the .deb
release    rpm                      rpm               reads and installs the .rpm
release    deb-systemd-helper       init-system-helpers  runs the .deb'"'"'s maintainer scripts
release    systemd-analyze          systemd           checks the systemd units
prom       promtool                 prometheus        checks and unit-tests the alerting rules; the e2e test runs a Prometheus of its own
prom       prometheus               prometheus        the e2e test'"'"'s Prometheus, on a loopback port of its own (not the Debian service)
prom       prometheus-node-exporter prometheus-node-exporter  the e2e test'"'"'s node_exporter, reading the metrics textfile
ci         git                      git               clones and versions
ci         make                     make              the build
'

[[ $# -gt 0 ]] || { echo "usage: $0 GROUP... (demo unit e2e podman containerd release prom ci)" >&2; exit 2; }
want=" $* "
[[ $want == *" ci "* ]] && want=" demo unit e2e podman containerd release prom ci "

declare -A why=()
missing=()
while read -r group cmd pkg reason; do
	[[ -n $group && $want == *" $group "* ]] || continue
	command -v "$cmd" >/dev/null 2>&1 && continue
	[[ -n ${why[$pkg]:-} ]] || missing+=("$pkg")
	why[$pkg]="${why[$pkg]:+${why[$pkg]}; }$cmd: $reason"
done <<<"$LIST"

[[ ${#missing[@]} -gt 0 ]] || exit 0

echo "==> Debian packages needed by $*:"
for pkg in "${missing[@]}"; do printf '    %-20s %s\n' "$pkg" "${why[$pkg]}"; done
if ! command -v apt-get >/dev/null 2>&1; then
	echo "deps: no apt-get on this host: install the packages above (or their equivalents) yourself, then run make again" >&2
	exit 1
fi
if [[ $(id -u) -ne 0 ]]; then
	echo "deps: installing them needs root (apt-get install): run make as root, e.g. sudo make ${MAKECMDGOALS:-demo}" >&2
	exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
while read -r group cmd pkg reason; do
	[[ -n $group && $want == *" $group "* ]] || continue
	command -v "$cmd" >/dev/null 2>&1 || { echo "deps: '$cmd' is still missing after installing $pkg" >&2; exit 1; }
done <<<"$LIST"
