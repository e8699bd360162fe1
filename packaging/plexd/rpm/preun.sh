# plexd %preun ($1: 0 erase, 1 upgrade), %systemd_preun written out: on erase, stop and
# disable plexd; an upgrade leaves it running (%postun restarts it).
if [ "$1" -eq 0 ] && [ -d /run/systemd/system ]; then
	systemctl --no-reload disable --now plexd.service >/dev/null 2>&1 || :
fi
