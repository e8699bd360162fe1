# plexd %post ($1: 1 install, 2 upgrade), %systemd_post written out without the preset: the
# unit is not enabled on install (the node has no token yet: write it, run `plexd install`,
# then `systemctl enable --now plexd`).
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null 2>&1 || :
fi
