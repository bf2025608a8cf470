#!/usr/bin/env bash
# test/reboot/build-image.sh OUTDIR MIRROR SUITE
#
# Builds the reboot test's guest from Debian packages only, into OUTDIR:
#   vmlinuz      the stock Debian kernel (linux-image-amd64's dependency, via `apt-get download`)
#   initrd.img   a tiny initramfs: static busybox + the modules the root disk needs
#                (virtio_pci, virtio_blk, ext4 and their dependencies); its /init
#                mounts /dev/vda and switches to /sbin/nbc-init
#   rootfs.img   ext4 image (`mkfs.ext4 -d`) of `debootstrap --variant=minbase` with
#                systemd (PID 1: the package's units run as on a real host), iproute2,
#                iptables, iputils-ping, kmod, busybox-static and jq, the kernel's modules
#                (display, sound, media... pruned), and /sbin/nbc-init run at every boot
#                by /etc/systemd/system/nomad.service: the test driver stands in for the
#                Nomad agent, which the plugin's boot sweep is ordered before
#
# Called by run.sh on a cache miss, as root (debootstrap and chroot need it). Everything
# it needs on the host (debootstrap, e2fsprogs, cpio, apt lists) run.sh has installed.
# The files this script and the two init scripts contain are part of the cache key: any
# change here rebuilds the image.
set -euo pipefail

OUT=${1:?usage: build-image.sh OUTDIR MIRROR SUITE}
MIRROR=${2:?mirror URL}
SUITE=${3:?suite}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# Packages of the root filesystem, on top of minbase (bash, coreutils, util-linux, mawk,
# sed, grep...). busybox-static gives `reboot -f`/`poweroff -f` (no systemd here) and
# httpd/wget for the port-mapping check; jq parses cnitool's results.
ROOT_PACKAGES=systemd,init-system-helpers,iproute2,iptables,iputils-ping,kmod,busybox-static,jq
# Modules the initramfs loads, in this order (dependencies are added before each one).
INITRAMFS_MODULES="virtio_pci virtio_blk crc32c_generic ext4"

log() { printf 'build-image: %s\n' "$*" >&2; }
die() {
	log "ERROR: $*"
	exit 1
}
safe_rm() { # remove a tree, never following a mount left inside it (debootstrap mounts /proc and /sys)
	local d=$1 m
	[[ -e $d ]] || return 0
	for m in $(findmnt -rn -o TARGET | grep -F "$d/" | sort -r); do umount -l "$m" 2>/dev/null || true; done
	rm -rf --one-file-system "$d"
}

[[ $(id -u) -eq 0 ]] || die "must run as root (debootstrap, chroot)"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$OUT/work
safe_rm "$WORK"
mkdir -p "$WORK"
ROOT=$WORK/rootfs
SECONDS=0

# ------------------------------------------------------------- rootfs ---
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
[[ -r $KEYRING ]] || die "$KEYRING missing (apt-get install debian-archive-keyring)"
log "debootstrap --variant=minbase $SUITE from $MIRROR (+$ROOT_PACKAGES)"
if ! debootstrap --variant=minbase --keyring="$KEYRING" --include="$ROOT_PACKAGES" \
	"$SUITE" "$ROOT" "$MIRROR" >"$WORK/debootstrap.log" 2>&1; then
	tail -n 40 "$WORK/debootstrap.log" >&2
	[[ -f $ROOT/debootstrap/debootstrap.log ]] && tail -n 40 "$ROOT/debootstrap/debootstrap.log" >&2
	die "debootstrap failed"
fi
log "debootstrap done (${SECONDS}s)"

# ------------------------------------------------------------- kernel ---
DEBS=$WORK/debs
mkdir -p "$DEBS"
KPKG=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ { print $2; exit }')
[[ -n $KPKG ]] || die "cannot resolve linux-image-amd64 to a kernel package (apt lists missing? run apt-get update)"
log "apt-get download $KPKG busybox-static"
(cd "$DEBS" && apt-get -q -o APT::Sandbox::User=root download "$KPKG" busybox-static >"$WORK/download.log" 2>&1) ||
	{
		cat "$WORK/download.log" >&2
		die "apt-get download failed"
	}
mkdir -p "$WORK/kernel" "$WORK/busybox"
dpkg-deb -x "$DEBS/$KPKG"_*.deb "$WORK/kernel"
dpkg-deb -x "$DEBS"/busybox-static_*.deb "$WORK/busybox"
KVER=$(ls "$WORK/kernel/lib/modules")
[[ -n $KVER && -f $WORK/kernel/boot/vmlinuz-$KVER ]] || die "unexpected layout of $KPKG"
cp "$WORK/kernel/boot/vmlinuz-$KVER" "$OUT/vmlinuz"

# The modules go to the root filesystem (the guest autoloads bridge, veth, nf_tables, 9p...).
# Copy into usr/lib: bookworm's /lib is a symlink to usr/lib.
MODS=$ROOT/usr/lib/modules/$KVER
mkdir -p "$ROOT/usr/lib/modules"
cp -a "$WORK/kernel/lib/modules/$KVER" "$MODS"
# Prune what a diskless, display-less VM never loads (about 250 MB); keep net, fs, lib,
# crypto, arch and the virtio, block and char drivers, and drivers/net's own modules
# (veth, dummy, virtio_net...) without its hardware subdirectories.
rm -rf "$MODS/kernel/sound"
for d in "$MODS"/kernel/drivers/*; do
	case ${d##*/} in
	virtio | block | char | net) ;;
	*) rm -rf "$d" ;;
	esac
done
find "$MODS/kernel/drivers/net" -mindepth 1 -maxdepth 1 -type d -exec rm -rf {} +
chroot "$ROOT" /sbin/depmod -a "$KVER" 2>"$WORK/depmod.log" || {
	cat "$WORK/depmod.log" >&2
	die "depmod failed"
}

# ------------------------------------------------------ root settings ---
install -m 0755 "$HERE/guest-init.sh" "$ROOT/sbin/nbc-init"
# systemd is PID 1. The driver runs as nomad.service, on the serial console; what a
# test VM does not need is masked: logins on the console would write over the
# driver's output, and the timers of apt, dpkg and e2fsprogs must not run mid-test.
UNITS=$ROOT/etc/systemd/system
mkdir -p "$UNITS/multi-user.target.wants"
cat >"$UNITS/nomad.service" <<'UNIT'
[Unit]
Description=the reboot test's driver, in place of the Nomad agent
After=local-fs.target

[Service]
Type=simple
ExecStart=/sbin/nbc-init
StandardInput=null
StandardOutput=tty
StandardError=inherit
TTYPath=/dev/ttyS0
TTYReset=no
TTYVHangup=no

[Install]
WantedBy=multi-user.target
UNIT
ln -sf ../nomad.service "$UNITS/multi-user.target.wants/nomad.service"
for u in serial-getty@ttyS0.service getty@tty1.service getty.target systemd-logind.service \
	apt-daily.timer apt-daily-upgrade.timer dpkg-db-backup.timer e2scrub_all.timer e2scrub_reap.service \
	fstrim.timer systemd-tmpfiles-clean.timer; do
	ln -sf /dev/null "$UNITS/$u"
done
echo nbc-reboot >"$ROOT/etc/hostname"
printf '127.0.0.1\tlocalhost\n127.0.1.1\tnbc-reboot\n' >"$ROOT/etc/hosts"
printf '# the root is mounted rw by the initramfs; systemd mounts /run (a tmpfs)\n' >"$ROOT/etc/fstab"
mkdir -p "$ROOT/mnt/nbc/bin" "$ROOT/mnt/nbc/test"
# Smaller image, faster mkfs: nothing in the guest reads these.
rm -rf "$ROOT"/var/cache/apt/* "$ROOT"/var/lib/apt/lists/* "$ROOT"/usr/share/doc/* \
	"$ROOT"/usr/share/man/* "$ROOT"/usr/share/locale/* "$ROOT"/usr/share/info/*

# ---------------------------------------------------------- initramfs ---
IRD=$WORK/initramfs
mkdir -p "$IRD"/{bin,dev,proc,sys,root,modules}
cp "$WORK/busybox/bin/busybox" "$IRD/bin/busybox"
install -m 0755 "$HERE/initramfs-init.sh" "$IRD/init"
# Dependency closure from the modules.dep that depmod just wrote, dependencies first.
declare -A DEPS=() SEEN=()
while IFS=: read -r mod deps; do
	DEPS[$mod]=$deps
done <"$MODS/modules.dep"
ORDER=()
add_module() { # path relative to $MODS, as in modules.dep
	local m=$1 d
	[[ -n ${SEEN[$m]:-} ]] && return 0
	SEEN[$m]=1
	for d in ${DEPS[$m]}; do add_module "$d"; done
	ORDER+=("$m")
}
for want in $INITRAMFS_MODULES; do
	path=
	for m in "${!DEPS[@]}"; do
		[[ ${m##*/} == "$want.ko" ]] && path=$m && break
	done
	[[ -n $path ]] || die "module $want not found in $KPKG"
	add_module "$path"
done
: >"$IRD/modules/order"
for m in "${ORDER[@]}"; do
	cp "$MODS/$m" "$IRD/modules/"
	echo "${m##*/}" >>"$IRD/modules/order"
done
log "initramfs modules: $(tr '\n' ' ' <"$IRD/modules/order")"
(cd "$IRD" && find . -print0 | cpio --null -o -H newc --owner=0:0 --quiet | gzip -1) >"$OUT/initrd.img"

# -------------------------------------------------------------- image ---
SIZE_MB=$(($(du -sm "$ROOT" | cut -f1) + 256))
log "mkfs.ext4 -d rootfs (${SIZE_MB} MiB, sparse)"
rm -f "$OUT/rootfs.img"
truncate -s "${SIZE_MB}M" "$OUT/rootfs.img"
mkfs.ext4 -q -F -L nbcroot -d "$ROOT" "$OUT/rootfs.img" >"$WORK/mkfs.log" 2>&1 || {
	cat "$WORK/mkfs.log" >&2
	die "mkfs.ext4 -d failed"
}
echo "$KPKG" >"$OUT/kernel-package"
safe_rm "$WORK"
log "done in ${SECONDS}s: $OUT ($KPKG)"
