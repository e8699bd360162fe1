# plexsphere %preun ($1: 0 erase, 1 upgrade), %systemd_preun written out: on erase, stop and
# disable both units; an upgrade leaves them running (%postun restarts them).
if [ "$1" -eq 0 ] && [ -d /run/systemd/system ]; then
	systemctl --no-reload disable --now plexsphere.service plexsphere-relay.service >/dev/null 2>&1 || :
fi
