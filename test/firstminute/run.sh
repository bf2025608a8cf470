#!/usr/bin/env bash
# test/firstminute/run.sh: a user's first minute, proved on a root where the
# system packages are absent. In a private mount namespace, an overlay of /
# (writes go to a tmpfs, the host's / is untouched) gets the packages of
# scripts/deps.sh's demo and unit groups purged; then, chrooted there, a
# fresh clone of this repository runs `make demo` and `make test-unit`,
# which must install what they need themselves. A missing install step
# fails here instead of hiding behind packages an earlier CI step installed.
#
# Needs root, unshare and an overlayfs-capable kernel. The host's network
# namespace is shared (apt-get reaches Debian's mirrors, the demo makes its
# namespaces and rules, and removes them); /proc, /sys, /dev and /run are the
# host's, /tmp a tmpfs of its own (as Debian 13 mounts it).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
die() {
	printf '\nFIRST MINUTE FAILED: %s\n' "$*" >&2
	exit 1
}
[[ $(id -u) -eq 0 ]] || die "must run as root (mounts, chroot, apt-get)"
command -v unshare >/dev/null || die "unshare (util-linux) is missing"

if [[ ${1:-} != --inside ]]; then
	exec unshare --mount --propagation private bash "$0" --inside
fi

# ---- inside the private mount namespace ----
W=$(mktemp -d /dev/shm/nbc-firstminute.XXXXXX 2>/dev/null || mktemp -d)
trap 'umount -R "$W" 2>/dev/null; rm -rf "$W"' EXIT
mount -t tmpfs -o size=4g tmpfs "$W"
mkdir -p "$W/upper" "$W/work" "$W/root"
mount -t overlay overlay -o "lowerdir=/,upperdir=$W/upper,workdir=$W/work" "$W/root"
R=$W/root
for d in proc sys dev run; do mount --rbind "/$d" "$R/$d"; done
mount -t tmpfs -o size=6g tmpfs "$R/tmp"

# The packages make demo and make test-unit need, as a fresh machine lacks
# them. dpkg leaves what depends on them with a missing dependency, which
# installing them again (what make must do) resolves.
mapfile -t pkgs < <(sed -n "/^LIST='/,/^'/p" "$REPO/scripts/deps.sh" | awk '$1 == "demo" || $1 == "unit" { print $3 }' | sort -u)
installed=()
for p in "${pkgs[@]}"; do
	chroot "$R" dpkg-query -W -f '${Status}' "$p" 2>/dev/null | grep -q "ok installed" && installed+=("$p")
done
printf '==> purging in the throw-away root: %s\n' "${installed[*]}"
chroot "$R" env DEBIAN_FRONTEND=noninteractive dpkg --purge --force-depends "${installed[@]}" >/dev/null
for cmd in iptables ping nft mkfs.ext4; do
	! chroot "$R" sh -c "command -v $cmd" >/dev/null || die "$cmd is still there after the purge"
done

# Empty Go caches, as on a new machine: every module is downloaded, and
# the release packager's tree must not be.
printf '==> a fresh clone runs make demo and make test-unit, with empty Go caches\n'
git clone -q "$REPO" "$R/tmp/nbc"
in_root() {
	chroot "$R" env -i HOME=/root PATH=/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
		GOMODCACHE=/tmp/gomod GOCACHE=/tmp/gocache GOFLAGS=-modcacherw CI=true TERM=dumb bash -c "cd /tmp/nbc && $1"
}
start=$SECONDS
in_root 'make demo' || die "make demo failed on a root without the packages"
printf '==> make demo took %d s, package installs and module downloads included\n' $((SECONDS - start))
in_root 'make test-unit' || die "make test-unit failed on a root without the packages"
if [[ -e $R/tmp/gomod/github.com/goreleaser ]]; then
	die "make demo or make test-unit downloaded the release packager's modules (nfpm): they belong to make release only"
fi
printf '==> first minute: make demo and make test-unit installed what they needed and passed\n'
