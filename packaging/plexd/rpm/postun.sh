# plexd %postun ($1: 0 erase, 1 upgrade), %systemd_postun_with_restart written out: systemd
# re-reads the units; an upgrade restarts a plexd that runs. rpm has no purge: the identity in
# /var/lib/plexd and the files in /etc/plexd stay after an erase (`plexd uninstall --purge`
# before the erase removes them and leaves the mesh).
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null 2>&1 || :
	if [ "$1" -ge 1 ]; then
		systemctl try-restart plexd.service >/dev/null 2>&1 || :
	fi
fi
