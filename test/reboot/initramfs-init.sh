#!/bin/busybox sh
# shellcheck shell=dash
# /init of the reboot test's initramfs (see build-image.sh): load the modules the root
# disk needs (the Debian kernel has virtio and ext4 as modules), mount /dev/vda and hand
# over to systemd on it (which runs /sbin/nbc-init as nomad.service). On any failure it says so on the console and powers the
# VM off, so the host sees qemu exit instead of waiting for its timeout.
/bin/busybox --install -s /bin
export PATH=/bin

fail() {
	echo "NBC-INITRAMFS-FAIL: $*"
	sleep 1
	poweroff -f
	sleep 10
}

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev

while read -r m; do
	insmod "/modules/$m" || echo "nbc-initramfs: insmod $m failed"
done </modules/order

i=0
while [ ! -b /dev/vda ]; do
	i=$((i + 1))
	[ $i -gt 300 ] && fail "/dev/vda did not appear within 30 s"
	sleep 0.1
done
mount -t ext4 -o rw /dev/vda /root || fail "cannot mount /dev/vda"
[ -x /root/lib/systemd/systemd ] || fail "/lib/systemd/systemd missing on the root disk"

mount --move /dev /root/dev
umount /sys
umount /proc
# shellcheck disable=SC2093 # exec only returns if switch_root failed
exec switch_root /root /lib/systemd/systemd
fail "switch_root failed"
