#!/bin/bash
# Docker HEALTHCHECK: healthy while both services answer. It runs as root in a root start, so it
# trusts nothing the user can write (image/start/boundary.sh): system folders on PATH, Python with -I (no
# user site, no PYTHON* variables), and /run/torchlab/services, which is root's then. A container
# started with a command of its own (no services) has nothing to check.
# In a start without root it runs as the user, in the container's configured environment, which holds
# what was given with -e: it leaves that environment at once, so as not to keep it readable.
[ -n "${TORCHLAB_HEALTHCHECK:-}" ] || exec /usr/bin/env -i TORCHLAB_HEALTHCHECK=1 /bin/bash "$0"
PATH=/usr/sbin:/usr/bin:/sbin:/bin
[ -e /run/torchlab/services ] || exit 0
{ read -r url && read -r ssh_port; } </run/torchlab/services || exit 1
# sshd listens: asked of the kernel, since a connection to sshd makes it log two lines every probe.
[ -n "$(ss -Hltn "sport = :$ssh_port")" ] || exit 1
# Jupyter's /api answers without auth (a readiness probe that reveals nothing). The probe is to
# 127.0.0.1, so a hub's internal TLS certificate, made for another name, is not checked; nor is any
# HTTP(S)_PROXY the container was given followed, which would not reach 127.0.0.1.
exec /opt/env/bin/python -I - "$url" <<'PROBE'
import ssl, sys, urllib.request
no_proxy = urllib.request.ProxyHandler({})
unverified = urllib.request.HTTPSHandler(context=ssl._create_unverified_context())
urllib.request.build_opener(no_proxy, unverified).open(sys.argv[1], timeout=3)
PROBE
