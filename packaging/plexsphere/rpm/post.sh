# plexsphere %post ($1: 1 install, 2 upgrade), %systemd_post written out without the preset:
# neither unit is enabled on install (fill in /etc/plexsphere/plexsphere.env or relay.env
# first, then `systemctl enable --now ...`).
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null 2>&1 || :
fi
