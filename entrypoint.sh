#!/bin/bash
# torchlab entrypoint. tini (PID 1) runs it, as root or (--user, Kubernetes runAsNonRoot,
# OpenShift, rootless Podman) as the user itself. It sources the parts in start/ (in the image
# /usr/local/lib/torchlab/start), each a concern of its own, and reads top to bottom:
#   1. read and validate every variable: bad input stops here, before anything starts
#   2. the user: as root, name, group, UID/GID (adopting /workspace's owner), sudo, home, chowns;
#      as a user, a passwd entry for its UID, and one line for each thing that needs root
#   3. SSH: authorized keys, per-container host keys, the container's environment for sessions
#   4. Jupyter auth: a token or an argon2-hashed password, never none
#   5. checks and hooks, then either the given command as the user, or sshd + Jupyter supervised
#      (jupyterhub-singleuser in place of the standalone server when a JupyterHub spawned it)
# Bad input exits 2; how the services stop, and the exit status then, is said in supervise.sh.
# Every variable is documented in README.md. Files other parts read, all in /run/torchlab:
#   services             exists while the services are meant to run (the healthcheck's cue);
#                        under JupyterHub it holds the URL of Jupyter's /api (the hub's prefix)
#   session-env.sh       the container's environment for SSH sessions (/etc/profile.d/torchlab.sh
#                        and /etc/bash.bashrc source it)
#   authorized_keys/USER keys from SSH_PUBLIC_KEY / PUBLIC_KEY (sshd's AuthorizedKeysFile)
#   sshd_config.d/*.conf sshd drop-ins written at start (host keys)
set -euo pipefail
start_dir=/usr/local/lib/torchlab/start

# Helpers, functions alone: log and die, the hook runner, the services' supervisor.
# shellcheck source=start/log.sh
source "$start_dir/log.sh"
# shellcheck source=start/hooks.sh
source "$start_dir/hooks.sh"
# shellcheck source=start/supervise.sh
source "$start_dir/supervise.sh"

# shellcheck source=start/10-validate.sh
source "$start_dir/10-validate.sh"
# shellcheck source=start/20-user.sh
source "$start_dir/20-user.sh"
# shellcheck source=start/30-ssh.sh
source "$start_dir/30-ssh.sh"
# shellcheck source=start/40-jupyter-auth.sh
source "$start_dir/40-jupyter-auth.sh"

# 5. checks, hooks, start
# For the services' sessions: a command (torchlab train) has the loader fit itself to /dev/shm and say so.
# An INFO line: Docker's default 64 MB is what a plain `docker run` gets, and docker-stacks' contract
# is that a plain start logs no WARNING; the doctor's report flags it too.
if [ $# -eq 0 ]; then
    shm_mb=$(($(df -Pk /dev/shm | awk 'NR == 2 {print $2}') / 1024))
    ((shm_mb >= SHM_WARN_MB)) ||
        log "/dev/shm is only ${shm_mb} MB; multi-worker DataLoaders die of it with a bus error. Run with --shm-size=8g (or --ipc=host)."
fi
export NB_USER NB_UID NB_GID SSH_PORT JUPYTER_PORT
# What the services, their sessions and the command create gets NB_UMASK's permissions.
[ -z "$NB_UMASK" ] || umask "$NB_UMASK"
run_hooks /usr/local/bin/before-notebook.d
# Gone from Jupyter's and the command's environment (and from SSH sessions, above).
[ ${#vars_to_unset[@]} -eq 0 ] || unset "${vars_to_unset[@]}"

# No command: sshd and Jupyter, until the container stops (supervise_services exits).
[ $# -gt 0 ] || supervise_services
# A command runs in the working directory Docker gave (WORKDIR /workspace, or -w).
exec "${as_user[@]}" "$@"
