#!/bin/bash
# Docker HEALTHCHECK: healthy while both services answer. A container started with a
# command of its own (no services) has nothing to check.
[ -e /run/torchlab/services ] || exit 0
# sshd answers with its version banner.
exec 3<>"/dev/tcp/127.0.0.1/${SSH_PORT:-2222}" || exit 1
IFS= read -r -t 3 banner <&3 || exit 1
exec 3<&-
[[ $banner == SSH-2.0-* ]] || exit 1
# Jupyter's /api answers without auth (a readiness probe that reveals nothing).
python -c "import sys, urllib.request; urllib.request.urlopen(f'http://127.0.0.1:{sys.argv[1]}/api', timeout=3)" \
    "${JUPYTER_PORT:-8888}" || exit 1
