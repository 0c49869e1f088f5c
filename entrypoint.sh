#!/bin/bash
# torchlab entrypoint. Docker starts it as PID 1; it hands PID 1 to tini (with the secrets out of its
# environment) and runs again under it, as root or (--user, Kubernetes runAsNonRoot, OpenShift,
# rootless Podman) as the user itself. Its parts are in image/start/ (in the image
# /usr/local/lib/torchlab/start), one concern each, as functions; this file calls them in order:
#   0. the trust boundary (boundary.sh says what runs as root and what it may read)
#   1. read and check the command line and every variable: bad input stops here, before anything starts
#   2. the user: as root, name, group, UID/GID (adopting /workspace's owner), sudo, home, chowns;
#      as a user, a passwd entry for its UID, and one line for each thing that needs root
#   3. SSH: authorized keys, per-container host keys, the container's environment for sessions
#   4. Jupyter auth: a token or an argon2-hashed password, never none
#   5. hooks, then either the given command as the user, or sshd + Jupyter supervised
#      (jupyterhub-singleuser in place of the standalone server when a JupyterHub spawned it)
# Bad input exits 2; how the services stop, and the exit status then, is said in supervise.sh.
# Every variable is in variables.tsv (its default, check, secret, sessions), docs/configuration.md's table made
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

# shellcheck source=image/start/log.sh
source "$start_dir/log.sh"
# shellcheck source=image/start/variables.sh
source "$start_dir/variables.sh"
# shellcheck source=image/start/boundary.sh
source "$start_dir/boundary.sh"
# shellcheck source=image/start/hooks.sh
source "$start_dir/hooks.sh"
# shellcheck source=image/start/validate.sh
source "$start_dir/validate.sh"
# shellcheck source=image/start/user.sh
source "$start_dir/user.sh"
# shellcheck source=image/start/ssh.sh
source "$start_dir/ssh.sh"
# shellcheck source=image/start/jupyter-auth.sh
source "$start_dir/jupyter-auth.sh"
# shellcheck source=image/start/supervise.sh
source "$start_dir/supervise.sh"

# What the parts share, each set by the function named and read by the parts after it. Everything
# else a part reads is a variable of the table (variables.tsv) or its own.
user_command=()     # what runs as the user in place of the services; empty: the services (read_command_line)
jupyter_args=()     # the Jupyter server's options: the command line's, NOTEBOOK_ARGS', auth's
user_env=()         # what the user's processes get on top of the container's environment (secure_environment,
                    # add_passwd_entry, make_as_user)
given_path=         # the operator's PATH, the user's with their own folder added last (secure_environment)
home_dir=           # the user's home (set_up_account, skip_what_needs_root)
work_dir=           # where the user's work goes: /workspace, or a home that is a volume (choose_work_dir)
as_user=()          # the prefix that runs a command as the user: the one privilege drop (make_as_user)
as_user_system=()   # the same, with the system's PATH and no user site: the image's own steps (make_as_user)
jupyter_auth=()     # the variables of Jupyter's auth, for its environment alone (choose_jupyter_auth)
token_generated=no  # yes when Jupyter's token is random, and so printed (choose_jupyter_auth)

# 0. The secrets come back from the pipe the first run left (hand_off); then the root phase's environment.
if [ -z "${TORCHLAB_SECRETS_FD:-}" ]; then hand_off "$@"; fi
# shellcheck disable=SC1090  # what hand_off wrote: NAME=VALUE lines, quoted with %q
source "/dev/fd/$TORCHLAB_SECRETS_FD"
exec 3<&-
unset TORCHLAB_SECRETS_FD
secure_environment

# 1. The command line and every variable. The passwd entry comes before the table's checks (ssh-keygen,
# which checks the keys, needs one), with the name it is given.
read_command_line "$@"
set -- "${user_command[@]}"
for name in JUPYTER_TOKEN JUPYTER_PASSWORD SSH_PUBLIC_KEY PUBLIC_KEY; do read_secret_file "$name"; done
make_run_dir
NB_USER=${NB_USER:-jovyan}
check_variable NB_USER name
if ! root_start; then add_passwd_entry; fi
check_variables
merge_other_names
check_account_and_ports
add_notebook_args
add_prefix_arg
check_jupyter_auth
rm -f /run/torchlab/services
[ $# -gt 0 ] || expect_services

# 2. The user. NB_UID and NB_GID as given: a start as a user says which of them it cannot have.
ids_given=("${NB_UID:-}" "${NB_GID:-}")
choose_ids
run_hooks /usr/local/bin/start-notebook.d
if root_start; then set_up_account; else skip_what_needs_root "${ids_given[@]}"; fi
choose_work_dir
make_runtime_dir
make_as_user
offer_image_files

# 3. SSH: a command runs no sshd, and needs neither host keys nor authorized keys.
if [ $# -eq 0 ]; then
    configure_sshd
    authorize_keys
fi
unset SSH_PUBLIC_KEY
write_session_env

# 4. Jupyter's auth.
choose_jupyter_auth

# 5. Hooks, then the services or the command.
[ $# -gt 0 ] || log_small_shm
warn_of_secrets_in_the_environment
export NB_USER NB_UID NB_GID SSH_PORT JUPYTER_PORT
# What the services, their sessions and the command create gets NB_UMASK's permissions.
[ -z "$NB_UMASK" ] || umask "$NB_UMASK"
run_hooks /usr/local/bin/before-notebook.d
# No command: sshd and Jupyter, until the container stops (supervise_services exits).
[ $# -gt 0 ] || supervise_services
# A command runs where -w puts it; in the WORKDIR, /, it runs in work_dir (root's docker exec alone stays in /).
[ "$PWD" != / ] || cd "$work_dir"
exec "${as_user[@]}" "$@"
