#!/bin/bash
# torchlab entrypoint. Docker starts it as PID 1; it hands PID 1 to tini (with the secrets out of its
# environment) and runs again under it, as root or (--user, Kubernetes runAsNonRoot, OpenShift,
# rootless Podman) as the user itself. It sources the parts in start/ (in the image
# /usr/local/lib/torchlab/start), each a concern of its own, and reads top to bottom:
#   0. the trust boundary (start/boundary.sh says what runs as root and what it may read)
#   1. read and validate every variable: bad input stops here, before anything starts
#   2. the user: as root, name, group, UID/GID (adopting /workspace's owner), sudo, home, chowns;
#      as a user, a passwd entry for its UID, and one line for each thing that needs root
#   3. SSH: authorized keys, per-container host keys, the container's environment for sessions
#   4. Jupyter auth: a token or an argon2-hashed password, never none
#   5. checks and hooks, then either the given command as the user, or sshd + Jupyter supervised
#      (jupyterhub-singleuser in place of the standalone server when a JupyterHub spawned it)
# Bad input exits 2; how the services stop, and the exit status then, is said in supervise.sh.
# Every variable is in start/variables.tsv (its default, check, secret, sessions), README.md's table made
# from it. Files other parts read, all in /run/torchlab:
#   services             exists while the services are meant to run (the healthcheck's cue);
#                        under JupyterHub it holds the URL of Jupyter's /api (the hub's prefix)
#   session-env.sh       the container's environment for SSH sessions (/etc/profile.d/torchlab.sh
#                        and /etc/bash.bashrc source it, in non-root shells only)
#   nss/passwd, nss/group a start as a UID with no passwd entry: its entry, through nss_wrapper
#   authorized_keys/USER keys from SSH_PUBLIC_KEY / PUBLIC_KEY (sshd's AuthorizedKeysFile)
#   sshd_config.d/*.conf sshd drop-ins written at start (host keys)
set -euo pipefail
start_dir=/usr/local/lib/torchlab/start

# Helpers: log and die, the table of variables, the trust boundary, the hook runner, the supervisor.
# shellcheck source=image/start/log.sh
source "$start_dir/log.sh"
# shellcheck source=image/start/variables.sh
source "$start_dir/variables.sh"
# shellcheck source=image/start/boundary.sh
source "$start_dir/boundary.sh"
# shellcheck source=image/start/hooks.sh
source "$start_dir/hooks.sh"
# shellcheck source=image/start/supervise.sh
source "$start_dir/supervise.sh"

# 0. The secrets come back from the pipe the first run left (hand_off); then the root phase's environment.
if [ -z "${TORCHLAB_SECRETS_FD:-}" ]; then hand_off "$@"; fi
# shellcheck disable=SC1090  # what hand_off wrote: NAME=VALUE lines, quoted with %q
source "/dev/fd/$TORCHLAB_SECRETS_FD"
exec 3<&-
unset TORCHLAB_SECRETS_FD
secure_environment

# shellcheck source=image/start/10-validate.sh
source "$start_dir/10-validate.sh"
# shellcheck source=image/start/20-user.sh
source "$start_dir/20-user.sh"
# shellcheck source=image/start/30-ssh.sh
source "$start_dir/30-ssh.sh"
# shellcheck source=image/start/40-jupyter-auth.sh
source "$start_dir/40-jupyter-auth.sh"

# 5. checks, hooks, start
# For the services' sessions: a command (torchlab train) has the loader fit itself to /dev/shm and say so.
# An INFO line: Docker's default 64 MB is what a plain `docker run` gets, and docker-stacks' contract
# is that a plain start logs no WARNING; the doctor's report flags it too.
if [ $# -eq 0 ]; then
    shm_mb=$(($(df -Pk /dev/shm | awk 'NR == 2 {print $2}') / 1024))
    ((shm_mb >= SHM_WARN_MB)) ||
        log "/dev/shm is only ${shm_mb} MB: train.py's decode threads need none, but DataLoader worker processes (--loader processes, your own num_workers) die of it with a bus error; for those, run with --shm-size=8g (or --ipc=host)."
fi
warn_of_secrets_in_the_environment
export NB_USER NB_UID NB_GID SSH_PORT JUPYTER_PORT
# What the services, their sessions and the command create gets NB_UMASK's permissions.
[ -z "$NB_UMASK" ] || umask "$NB_UMASK"
run_hooks /usr/local/bin/before-notebook.d

# No command: sshd and Jupyter, until the container stops (supervise_services exits).
[ $# -gt 0 ] || supervise_services
# A command runs in the working directory Docker gave (WORKDIR /workspace, or -w).
exec "${as_user[@]}" "$@"
