# shellcheck shell=sh
# torchlab: the container's environment in SSH sessions, as the entrypoint wrote it at start.
# Login shells read this file (Debian's /etc/profile resets PATH before it); /etc/bash.bashrc
# reads it once per SSH session for `ssh host CMD`, which reads no profile.
# shellcheck disable=SC1091
[ -r /run/torchlab/session-env.sh ] && . /run/torchlab/session-env.sh
export TORCHLAB_SESSION_ENV=1
