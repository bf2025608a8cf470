# nomad-bridge-cni %postun: what %systemd_postun does.
if [ -x /usr/bin/systemctl ] && [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null 2>&1 || :
fi
