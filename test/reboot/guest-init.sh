#!/bin/bash
# /sbin/nbc-init: the reboot test's guest at every boot, run by systemd (PID 1) as
# /etc/systemd/system/nomad.service (see build-image.sh): the driver stands in for the
# Nomad agent, so the plugin's units ordered before nomad.service have run by now.
# systemd did what an init system does for the parts that matter to the bug (/run is a
# fresh, empty tmpfs at every boot, /var/run -> /run, /var/lib is on the persistent root
# disk); this mounts the host's shares read-only (9p: the plugin binaries on tag
# "nbcbin" and the test driver and the package on tag "nbctest"), runs the driver, then
# does what the driver asked for:
#   exit 100  reboot for real (reboot(2): the kernel restarts, every namespace, link,
#             iptables rule and tmpfs is gone; the disk keeps its writes: qemu runs
#             with -no-reboot, so it exits, and run.sh boots the same disk again)
#   else      power off (qemu exits)
# It never waits for input.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root LANG=C.UTF-8
cd /

say() { echo "nbc-init: $*"; }

halt_vm() { # reboot|poweroff
	sync
	umount /mnt/nbc/test /mnt/nbc/bin 2>/dev/null
	sync
	# -f: reboot(2) at once, as a power cut would, not systemd's orderly shutdown.
	busybox "$1" -f
	sleep 5
	echo o >/proc/sysrq-trigger # poweroff if reboot(2) somehow returned
	sleep infinity
}

hostname nbc-reboot
ip link set lo up

say "boot_id $(cat /proc/sys/kernel/random/boot_id), kernel $(uname -r)"
modprobe -a 9pnet_virtio 9p || say "modprobe 9p failed"
ok=1
for tag in bin test; do
	mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144 "nbc$tag" "/mnt/nbc/$tag" || {
		say "cannot mount share nbc$tag"
		ok=0
	}
done

rc=1
if [[ $ok == 1 && -r /mnt/nbc/test/guest-driver.sh ]]; then
	# The driver has its own per-step timeouts; this one only bounds a boot's work.
	timeout -k 10 900 bash /mnt/nbc/test/guest-driver.sh
	rc=$?
else
	echo "NBC-RESULT: FAIL (the guest could not reach the test driver share)"
fi

if [[ $rc == 100 ]]; then
	say "rebooting (reboot -f)"
	halt_vm reboot
fi
say "driver exited $rc; powering off"
halt_vm poweroff
