# nomad-bridge-cni %preun: what %systemd_preun does: on an erase (not an
# upgrade), the units are disabled and stopped.
if [ "$1" -eq 0 ] && [ -x /usr/bin/systemctl ]; then
	systemctl --no-reload disable --now nomad-bridge-cni-gc.timer nomad-bridge-cni-metrics.timer nomad-bridge-cni-boot.service >/dev/null 2>&1 || :
fi
