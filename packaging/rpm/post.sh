# nomad-bridge-cni %post: what %systemd_post does: on a first install, the
# units are enabled or not as the system's presets say (the package ships
# 80-nomad-bridge-cni.preset, which enables them), then the timers start
# on a host running systemd.
if [ "$1" -eq 1 ] && [ -x /usr/bin/systemctl ]; then
	systemctl --no-reload preset nomad-bridge-cni-gc.timer nomad-bridge-cni-metrics.timer nomad-bridge-cni-boot.service >/dev/null 2>&1 || :
	if [ -d /run/systemd/system ]; then
		systemctl daemon-reload >/dev/null 2>&1 || :
		systemctl start nomad-bridge-cni-gc.timer nomad-bridge-cni-metrics.timer >/dev/null 2>&1 || :
	fi
fi
