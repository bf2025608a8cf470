#!/usr/bin/env bash
# test/reboot/run.sh: what `make test-reboot` runs.
#
# A real host reboot, in a virtual machine: the seed's reproduction steps ("reboot the
# client host; make sure the alloc is restored and networking works"), automated.
#
#   1. builds a small Debian guest once (build-image.sh: debootstrap --variant=minbase,
#      the stock kernel via apt-get download, a tiny initramfs, mkfs.ext4 -d) and caches
#      it outside the repo, under ${TMPDIR:-/tmp}/nomad-bridge-cni-reboot-<hash of the
#      image's inputs>;
#   2. boots it with qemu-system-x86_64 -accel tcg -nographic on a per-run sparse copy of
#      the image (the cache stays pristine), sharing $BIN and the test driver read-only
#      over 9p; the guest reboots itself (reboot -f), -no-reboot turns that reset into
#      qemu's exit, and the second boot is a new qemu on the same disk;
#   3. the guest boots systemd, which runs guest-driver.sh at each boot as nomad.service
#      (standing in for the Nomad agent): phase 1 installs the release's .deb (built here
#      by scripts/release/release.sh; its postinst enables the units), ADDs Nomad's chain
#      (and copies of it whose dataDir is on the persistent disk, one of them for the
#      package's boot sweep) and reboots for real; phase 2 checks that the boot sweep ran
#      before nomad.service and released what it was given, restores, sweeps what the old
#      boot left (leases, gc, CHECK), checks, DELs and verifies nothing is left;
#   4. watches the serial console for the driver's markers, each boot and phase under its
#      own timeout, and prints the verdict; on failure, the whole guest log.
# qemu is always killed on exit (trap, and `timeout` around it as a last resort).
#
# Needs root (debootstrap, apt-get) on a Debian/Ubuntu host; installs what it misses
# (qemu-system-x86, debootstrap, e2fsprogs, cpio, debian-archive-keyring) with apt-get.
#
# Environment:
#   BIN            directory with nomad-bridge-cni, bridge, host-local, loopback,
#                  firewall, portmap and cnitool (default: <repo>/bin)
#   MIRROR         Debian mirror for the guest (default: the host's apt sources)
#   VERBOSE=1      print the whole guest log also when the test passes
#   NBC_REBOOT_CACHE   where the image cache lives (default: ${TMPDIR:-/tmp})
#   BOOT_TIMEOUT, PHASE_TIMEOUT   seconds per boot / per phase (default 90 / 180)
#   GUEST_APPEND   extra kernel arguments instead of "quiet" (e.g. GUEST_APPEND=loglevel=7)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
BIN=${BIN:-$REPO/bin}
CONFLIST=$REPO/conflist/nomad.conflist
SUITE=bookworm
BOOT_TIMEOUT=${BOOT_TIMEOUT:-90}
PHASE_TIMEOUT=${PHASE_TIMEOUT:-180}
CACHE_ROOT=${NBC_REBOOT_CACHE:-${TMPDIR:-/tmp}}
START=$SECONDS

say() { printf 'test-reboot: %s\n' "$*"; }
elapsed() { printf '[%3ds]' $((SECONDS - START)); }
REPORTED=
die() {
	printf 'test-reboot: ERROR: %s\n' "$*" >&2
	REPORTED=1
	exit 1
}
trap 'rc=$?; [[ $rc == 0 || -n $REPORTED ]] || echo "test-reboot: FAILED (exit $rc)" >&2' EXIT

# ----------------------------------------------------------- arguments ---
[[ -d $BIN ]] || die "BIN=$BIN is not a directory; build with: make build plugins"
BIN=$(cd "$BIN" && pwd)
for p in nomad-bridge-cni bridge host-local loopback firewall portmap cnitool; do
	[[ -x $BIN/$p ]] || die "$BIN/$p is missing; build with: make build plugins"
done
[[ -r $CONFLIST ]] || die "$CONFLIST not found"

# ------------------------------------------------------- host packages ---
APT_UPDATED=0
apt_update_once() {
	[[ $APT_UPDATED == 1 ]] && return 0
	say "apt-get update"
	local out
	out=$(DEBIAN_FRONTEND=noninteractive apt-get -q update 2>&1) || {
		printf '%s\n' "$out" | tail -n 20 >&2
		die "apt-get update failed"
	}
	APT_UPDATED=1
}
ensure_packages() { # "command-or-file:package"...
	local want=() spec thing pkg
	for spec in "$@"; do
		thing=${spec%%:*} pkg=${spec#*:}
		if [[ $thing == /* ]]; then [[ -e $thing ]] && continue; else command -v "$thing" >/dev/null 2>&1 && continue; fi
		want+=("$pkg")
	done
	[[ ${#want[@]} == 0 ]] && return 0
	[[ $(id -u) == 0 ]] || die "missing ${want[*]}; run as root (or apt-get install ${want[*]})"
	command -v apt-get >/dev/null || die "missing ${want[*]} and no apt-get to install them"
	apt_update_once
	say "apt-get install ${want[*]}"
	local out
	out=$(DEBIAN_FRONTEND=noninteractive apt-get -q install -y --no-install-recommends "${want[@]}" 2>&1) || {
		printf '%s\n' "$out" | tail -n 20 >&2
		die "apt-get install ${want[*]} failed"
	}
}
ensure_packages qemu-system-x86_64:qemu-system-x86 timeout:coreutils flock:util-linux

# --------------------------------------------------------------- mirror ---
# The guest's Debian mirror comes from the host's own apt sources: deb822 files first
# (the URIs of a stanza whose Suites include $SUITE), then one-line sources.list files.
host_mirror() {
	local f
	for f in /etc/apt/sources.list.d/*.sources; do
		[[ -r $f ]] || continue
		awk -v suite="$SUITE" '
			BEGIN { RS = ""; FS = "\n" }
			{
				uris = ""; suites = ""; types = ""; enabled = "yes"
				for (i = 1; i <= NF; i++) {
					line = $i
					if (line ~ /^[ \t]*#/) continue
					key = tolower(line); sub(/:.*/, "", key)
					val = line; sub(/^[^:]*:[ \t]*/, "", val)
					if (key == "uris") uris = val
					else if (key == "suites") suites = " " val " "
					else if (key == "types") types = " " val " "
					else if (key == "enabled") enabled = tolower(val)
				}
				if (enabled != "no" && types ~ / deb / && index(suites, " " suite " ")) {
					split(uris, u, /[ \t]+/); print u[1]; exit
				}
			}' "$f"
	done
	cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
		awk -v suite="$SUITE" '$1 == "deb" {
			i = 2
			if ($2 ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
			if ($(i + 1) == suite) { print $i; exit }
		}' || true
}
if [[ -z ${MIRROR:-} ]]; then MIRROR=$(host_mirror | head -n1) || true; fi
[[ -n $MIRROR ]] || die "no apt source for Debian $SUITE on this host (set MIRROR=<Debian mirror URL>)"

# ---------------------------------------------------------------- image ---
safe_rm() { # remove a tree, never following a mount left inside it (debootstrap mounts /proc, /sys, maybe /dev)
	local d=$1 m
	[[ -e $d ]] || return 0
	for m in $(findmnt -rn -o TARGET | grep -F "$d/" | sort -r); do umount -l "$m" 2>/dev/null || true; done
	rm -rf --one-file-system "$d"
}
KEY=$({
	cat "$HERE/build-image.sh" "$HERE/initramfs-init.sh" "$HERE/guest-init.sh"
	echo "$MIRROR $SUITE $(uname -m)"
} | sha256sum | cut -c1-16)
IMAGE=$CACHE_ROOT/nomad-bridge-cni-reboot-$KEY
mkdir -p "$CACHE_ROOT"
exec 9>"$CACHE_ROOT/nomad-bridge-cni-reboot.lock"
flock -w 900 9 || die "another run holds $CACHE_ROOT/nomad-bridge-cni-reboot.lock"
# Images of other inputs (an older version of these scripts) go after a week unused.
find "$CACHE_ROOT" -maxdepth 1 -type d -name 'nomad-bridge-cni-reboot-[0-9a-f]*' ! -name "${IMAGE##*/}" -mtime +7 \
	-exec test -f {}/ready \; -print 2>/dev/null | while read -r old; do safe_rm "$old"; done
if [[ -f $IMAGE/ready ]]; then
	touch "$IMAGE/ready" "$IMAGE"
	say "$(elapsed) guest image: cached at $IMAGE"
else
	say "$(elapsed) guest image: building into $IMAGE (Debian $SUITE from $MIRROR)"
	[[ $(id -u) == 0 ]] || die "building the guest image needs root (debootstrap)"
	ensure_packages debootstrap:debootstrap mkfs.ext4:e2fsprogs cpio:cpio gzip:gzip dpkg-deb:dpkg \
		/usr/share/keyrings/debian-archive-keyring.gpg:debian-archive-keyring
	# apt-get download needs package lists; a fresh machine may have none.
	if ! apt-cache show linux-image-amd64 >/dev/null 2>&1; then apt_update_once; fi
	safe_rm "$IMAGE.tmp"
	if ! bash "$HERE/build-image.sh" "$IMAGE.tmp" "$MIRROR" "$SUITE"; then
		safe_rm "$IMAGE.tmp"
		die "building the guest image failed"
	fi
	touch "$IMAGE.tmp/ready"
	safe_rm "$IMAGE"
	mv "$IMAGE.tmp" "$IMAGE"
	say "$(elapsed) guest image: built"
fi
flock -u 9

# ----------------------------------------------------------------- boot ---
RUN=$(mktemp -d "${TMPDIR:-/tmp}/nomad-bridge-cni-reboot-run.XXXXXX")
QPID=
stop_qemu() { # [seconds to let it power off by itself first]
	local grace=$(( ${1:-0} * 5 ))
	while ((grace-- > 0)) && [[ -n $QPID ]] && kill -0 "$QPID" 2>/dev/null; do sleep 0.2; done
	if [[ -n $QPID ]] && kill -0 "$QPID" 2>/dev/null; then
		kill "$QPID" 2>/dev/null || true # `timeout` passes it on to qemu
		for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$QPID" 2>/dev/null || break; sleep 0.2; done
		kill -9 "$QPID" 2>/dev/null || true
	fi
	[[ -n $QPID ]] && wait "$QPID" 2>/dev/null
	QPID=
	return 0
}
cleanup() {
	local rc=$?
	stop_qemu
	rm -rf "$RUN"
	[[ $rc == 0 || -n $REPORTED ]] || echo "test-reboot: FAILED (exit $rc)" >&2
	exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

mkdir -p "$RUN/share"
cp "$HERE/guest-driver.sh" "$CONFLIST" "$RUN/share/"
# The guest installs the .deb, as a user would: its units run under the guest's systemd.
say "$(elapsed) building the .deb the guest installs (scripts/release/release.sh)"
if ! DIST=$RUN/dist bash "$REPO/scripts/release/release.sh" >"$RUN/release.log" 2>&1; then
	tail -n 30 "$RUN/release.log" >&2
	die "building the release failed"
fi
cp "$RUN"/dist/nomad-bridge-cni_*_amd64.deb "$RUN/share/"
LOG=$RUN/serial.log
: >"$LOG"
# The guest's persistent disk for this run: a sparse copy of the cached image, so the
# cache stays pristine and the writes of the first boot are there for the second.
DISK=$RUN/disk.img
cp --sparse=always "$IMAGE/rootfs.img" "$DISK"

# One qemu process per boot. The guest reboots itself (reboot -f, i.e. reboot(2));
# -no-reboot turns that reset into qemu's exit, and the next boot is a new qemu process
# on the same disk: a cold start of the machine, with /var/lib as the guest left it.
# (A reset inside one qemu process also works, but TCG then stalls the next kernel's
# boot for 20-90 s, at random, which this test cannot afford.)
# no_timer_check: on a busy host, TCG's timer can miss the kernel's IO-APIC check, which
# then panics ("IO-APIC + timer doesn't work!").
boot() { # number
	printf '\n----- [host] boot %s: qemu-system-x86_64 -accel tcg -----\n' "$1" >>"$LOG"
	timeout -k 5 $((BOOT_TIMEOUT + PHASE_TIMEOUT + 30)) qemu-system-x86_64 \
		-accel tcg -machine pc -m 768 -smp 1 \
		-nographic -nodefaults -no-user-config -monitor none \
		-chardev "file,id=console,path=$LOG,append=on" -serial chardev:console \
		-no-reboot -nic none \
		-kernel "$IMAGE/vmlinuz" -initrd "$IMAGE/initrd.img" \
		-append "console=ttyS0 panic=0 no_timer_check ${GUEST_APPEND:-quiet}" \
		-drive "file=$DISK,format=raw,if=virtio" \
		-virtfs "local,path=$BIN,mount_tag=nbcbin,security_model=none,readonly=on" \
		-virtfs "local,path=$RUN/share,mount_tag=nbctest,security_model=none,readonly=on" \
		</dev/null >>"$RUN/qemu.out" 2>&1 &
	QPID=$!
}

guest_log() { sed -e 's/\x1b[[0-9;?]*[a-zA-Z]//g' -e 's/\r$//' "$LOG"; }
VERDICT=
summary() {
	local ok bad
	ok=$(grep -ac '^    OK ' "$LOG" || true)
	bad=$(grep -ac "^NBC-CHECK-FAIL" "$LOG" || true)
	# a failure no check recorded (a timeout, a crash) still counts as one
	if [[ $VERDICT != PASS && $bad == 0 ]]; then bad=1; fi
	echo "test-reboot: $ok passed, $bad failed"
}
fail_with_log() {
	REPORTED=1
	if [[ -n $VERDICT ]]; then stop_qemu 20; else stop_qemu; fi # a guest with a verdict powers itself off
	say "$(elapsed) FAILED: $*"
	echo "----- guest log (serial console) -----"
	guest_log
	echo "----- end of guest log -----"
	if [[ -s $RUN/qemu.out ]]; then
		echo "----- qemu output -----"
		cat "$RUN/qemu.out"
	fi
	summary
	exit 1
}
wait_for() { # marker, timeout, what: returns when the marker shows up; fails the test otherwise
	local marker=$1 limit=$2 what=$3 deadline=$((SECONDS + $2))
	while ((SECONDS < deadline)); do
		if grep -aq "^NBC-RESULT:" "$LOG"; then
			VERDICT=$(grep -a -m1 "^NBC-RESULT:" "$LOG" | tr -d '\r')
			[[ $VERDICT == "NBC-RESULT: PASS" && $marker == "NBC-RESULT:" ]] && VERDICT=PASS && return 0
			[[ $VERDICT == "NBC-RESULT: PASS" ]] && fail_with_log "the guest passed before $what"
			fail_with_log "the guest says: ${VERDICT#NBC-RESULT: }"
		fi
		grep -aq "^$marker" "$LOG" && return 0
		grep -aqE "Kernel panic|NBC-INITRAMFS-FAIL" "$LOG" && fail_with_log "the guest kernel or initramfs failed while waiting for $what"
		kill -0 "$QPID" 2>/dev/null || fail_with_log "qemu exited while waiting for $what"
		sleep 0.5
	done
	fail_with_log "timed out after ${limit}s waiting for $what"
}
wait_exit() { # timeout, what: qemu must exit by itself
	local deadline=$((SECONDS + $1))
	while kill -0 "$QPID" 2>/dev/null; do
		((SECONDS < deadline)) || fail_with_log "qemu did not exit within $1 s after $2"
		sleep 0.2
	done
	wait "$QPID" 2>/dev/null || true
	QPID=
}

say "$(elapsed) boot 1 (qemu-system-x86_64 -accel tcg; plugins from $BIN)"
boot 1
wait_for "NBC-PHASE 1 BEGIN" "$BOOT_TIMEOUT" "the first boot"
say "$(elapsed) phase 1: ADD through Nomad's chain, connectivity, CHECK, control ADD, GC steps on a persistent dataDir"
wait_for "NBC-PHASE 1 END" "$PHASE_TIMEOUT" "the end of phase 1"
wait_exit 60 "the guest's reboot"
grep -aq "reboot: Restarting system" "$LOG" || fail_with_log "the guest stopped without rebooting"
say "$(elapsed) the guest rebooted (reboot -f); boot 2 on the same disk"
boot 2
wait_for "NBC-PHASE 2 BEGIN" "$BOOT_TIMEOUT" "the second boot"
say "$(elapsed) phase 2: GC of the persistent dataDir, restore under the same container IDs, control re-ADD, CHECK, DEL, leftovers"
wait_for "NBC-RESULT:" "$PHASE_TIMEOUT" "the verdict"
wait_exit 30 "the verdict" # the guest powers itself off

if [[ ${VERBOSE:-0} == 1 ]]; then
	echo "----- guest log (serial console) -----"
	guest_log
	echo "----- end of guest log -----"
else
	guest_log | grep -aE '^\[phase [12] .*\] == |^    OK ' || true
fi
say "$(elapsed) PASSED: after a real reboot both allocations came back under the same container IDs, the sweeps reclaimed what a persistent dataDir kept, and DEL left nothing behind"
summary
