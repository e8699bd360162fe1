# plexsphere %postun ($1: 0 erase, 1 upgrade), %systemd_postun_with_restart written out:
# systemd re-reads the units; an upgrade restarts the ones that run. The database and Domain
# keys in /var/lib/private/plexsphere stay after an erase.
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null 2>&1 || :
	if [ "$1" -ge 1 ]; then
		systemctl try-restart plexsphere.service plexsphere-relay.service >/dev/null 2>&1 || :
	fi
fi
