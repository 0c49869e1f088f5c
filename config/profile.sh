# shellcheck shell=sh
# torchlab: Debian's /etc/profile resets PATH for login shells; restore the container's
# environment (the env first on PATH, ...), as the entrypoint wrote it at start.
# shellcheck disable=SC1091
[ -r /run/torchlab/session-env.sh ] && . /run/torchlab/session-env.sh
