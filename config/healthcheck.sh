#!/bin/bash
# Docker HEALTHCHECK: healthy while both services answer. A container started with a
# command of its own (no services) has nothing to check.
[ -e /run/torchlab/services ] || exit 0
# sshd answers with its version banner.
exec 3<>"/dev/tcp/127.0.0.1/${SSH_PORT:-2222}" || exit 1
IFS= read -r -t 3 banner <&3 || exit 1
exec 3<&-
[[ $banner == SSH-2.0-* ]] || exit 1
# Jupyter's /api answers without auth (a readiness probe that reveals nothing); under JupyterHub
# the entrypoint wrote its URL (the hub's port and prefix). The probe is to 127.0.0.1, so a
# hub's internal TLS certificate, made for another name, is not checked.
read -r url </run/torchlab/services || true
python -c "import ssl, sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=3, context=ssl._create_unverified_context())" \
    "${url:-http://127.0.0.1:${JUPYTER_PORT:-8888}/api}" || exit 1
