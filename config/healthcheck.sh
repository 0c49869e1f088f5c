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
# hub's internal TLS certificate, made for another name, is not checked; nor is any HTTP(S)_PROXY
# the container was given followed, which would not reach 127.0.0.1.
read -r url </run/torchlab/services || true
python - "${url:-http://127.0.0.1:${JUPYTER_PORT:-8888}/api}" <<'PROBE' || exit 1
import ssl, sys, urllib.request
no_proxy = urllib.request.ProxyHandler({})
unverified = urllib.request.HTTPSHandler(context=ssl._create_unverified_context())
urllib.request.build_opener(no_proxy, unverified).open(sys.argv[1], timeout=3)
PROBE
