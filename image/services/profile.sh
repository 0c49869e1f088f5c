# shellcheck shell=sh
# torchlab: the container's environment in SSH sessions, as the entrypoint wrote it at start.
# Login shells read this file (Debian's /etc/profile resets PATH before it); /etc/bash.bashrc
# reads it once per SSH session for `ssh host CMD`, which reads no profile. Root's shells (docker exec)
# never do: it names the user's folders, and in a start without root the file is the user's.
# shellcheck disable=SC1091
if [ "$(id -u)" != 0 ] && [ -r /run/torchlab/session-env.sh ]; then
    . /run/torchlab/session-env.sh
    # NB_UMASK, which sshd does not pass on (it forces 022 into its sessions).
    [ -z "${NB_UMASK:-}" ] || umask "$NB_UMASK"
fi
export TORCHLAB_SESSION_ENV=1
