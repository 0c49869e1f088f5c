# shellcheck shell=bash
# The trust boundary of the start-up. Root runs: this entrypoint's root phase (hooks included), the
# HEALTHCHECK (torchlab-healthcheck), `docker exec` (the image's USER is root), sshd's listener, and
# all of it again at every restart. None of it may run code, read files or follow links that the user
# can write or make:
#   - PATH is ROOT_PATH (root-owned system folders) and Python starts with no user site, no PYTHONPATH
#     and no LD_* preload: the image's ENV names no user-writable place, and the entrypoint drops the
#     operator's PYTHON*/LD_* variables for its root phase (the user gets them back at the drop).
#   - Files the root phase reads are root's (/run/torchlab is root's 0755 in a root start) or the
#     operator's (the *_FILE secrets, hooks); a path it chowns or reads by name must not be, or pass
#     through, a symbolic link (no_link_in_path); recursive chowns never follow links (find -P, chown -h).
#   - Profiles (/etc/profile.d/torchlab.sh) apply the session environment to non-root shells only.
# The user's side is built at the one privilege drop (make_as_user in user.sh): the operator's
# environment, the user's folders on PATH and PYTHONUSERBASE (user_env), less the secrets.
# Secrets (the token, the password, the keys, JUPYTER_ENV_VARS_TO_UNSET's names) never reach PID 1's
# environment or the entrypoint's (both readable by the user in a start without root): see hand_off.

# True in a start as root, the root phase; false in a start as a user (--user, runAsNonRoot).
root_start() {
    ((EUID == 0))
}

ROOT_PATH=/opt/env/bin:/opt/conda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
RUNTIME_DIR=/run/torchlab/jupyter  # Jupyter's runtime files (make_runtime_dir)
# The secrets (variables.tsv), consumed by the entrypoint and passed on only where needed (Jupyter's auth,
# the hub's token).
readarray -t SECRET_VARIABLES < <(table_names 4 yes)
# The entrypoint's own variables, which JUPYTER_ENV_VARS_TO_UNSET may not name (with PATH, LD_*, PYTHON*).
OWN_VARIABLES=" $(table_names | tr '\n' ' ')TORCHLAB_SECRETS_FD HOME USER SHELL "

protected_variable() {  # NAME: true for a name JUPYTER_ENV_VARS_TO_UNSET may not remove
    [[ $1 == PATH || $1 == LD_* || $1 == PYTHON* || $1 == NSS_WRAPPER_* || $OWN_VARIABLES == *[[:space:]]"$1"[[:space:]]* ]]
}

# The names JUPYTER_ENV_VARS_TO_UNSET gives that are well formed and not protected (check_variables
# refuses the others with one line).
names_to_unset() {
    local names name
    IFS=, read -ra names <<<"${JUPYTER_ENV_VARS_TO_UNSET:-}"
    for name in "${names[@]}"; do
        [[ $name =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] && ! protected_variable "$name" && printf '%s\n' "$name"
    done
    return 0
}

# hand_off "$@": the first run of this script re-runs it with the secrets out of its environment, read
# back from a pipe (fd 3) that is empty once read; as PID 1 it hands PID 1 to tini on the way, so that
# /proc/1/environ holds none of them either. JUPYTER_ENV_VARS_TO_UNSET's names are dropped for good.
hand_off() {
    local name present=() drop=() exposed=()
    for name in "${SECRET_VARIABLES[@]}"; do
        [ -z "${!name+set}" ] || present+=("$name") drop+=(-u "$name")
    done
    [ -z "${JUPYTER_PASSWORD:-}" ] || exposed+=(JUPYTER_PASSWORD)
    while IFS= read -r name; do
        drop+=(-u "$name")
        [ -z "${!name+set}" ] || exposed+=("$name")
    done < <(names_to_unset)
    exec 3< <(
        for name in "${present[@]}"; do printf '%s=%q\n' "$name" "${!name}"; done
        printf 'secrets_in_environment=%q\n' "${exposed[*]}"
    )
    [ $$ != 1 ] || exec /usr/bin/env "${drop[@]}" TORCHLAB_SECRETS_FD=3 /usr/bin/tini -g -- "$0" "$@"
    exec /usr/bin/env "${drop[@]}" TORCHLAB_SECRETS_FD=3 "$0" "$@"
}

# The root phase's environment: a fixed PATH of system folders and no variable that makes Python, bash
# or the loader read a user's file. Sets given_path to the operator's PATH and user_env to the operator's
# values of what is dropped, both restored at the drop for the user's processes alone.
secure_environment() {
    local name
    given_path=${PATH:-$ROOT_PATH}
    user_env=()
    for name in $(compgen -e); do
        case $name in
            PYTHON* | LD_* | BASH_ENV | ENV) user_env+=("$name=${!name}") && unset "$name" ;;
        esac
    done
    export PATH=$ROOT_PATH PYTHONNOUSERSITE=1
}

# /run/torchlab, where the start writes what other processes read (the entrypoint's header lists it), is
# root's on a root start (the healthcheck and root's shells read it); a start as a user needs it
# writable (the image's is; with --read-only, a tmpfs), and empties it first: what the user left there (a FIFO
# where a file goes, a folder where the start removes a file) could otherwise hang or stop the start.
make_run_dir() {
    if root_start; then
        install -d -m 0755 -o root -g root /run/torchlab /run/torchlab/authorized_keys /run/torchlab/sshd_config.d \
            /run/sshd  # sshd's privilege separation directory
    else
        # What the user left there, their chmod 000 of a folder included, goes: its modes first (-R changes a
        # folder's before entering it, and follows no link), so that nothing stays unreadable, then everything.
        chmod -R u+rwx /run/torchlab 2>/dev/null || true
        find /run/torchlab -mindepth 1 -delete 2>/dev/null || true
        { mkdir -p /run/torchlab/authorized_keys /run/torchlab/sshd_config.d 2>/dev/null && [ -w /run/torchlab ]; } ||
            die "/run/torchlab is not writable by UID $(id -u): expected the image's own, or with --read-only a tmpfs there (--tmpfs /run/torchlab:uid=$(id -u),gid=$(id -g))"
    fi
}

# Jupyter's runtime folder, made anew at every start, the user's alone (0700) inside /run/torchlab, whose entry
# the user cannot replace in a root start. rm -r follows no link in it.
make_runtime_dir() {
    rm -rf "$RUNTIME_DIR"
    if root_start; then
        install -d -m 0700 -o "$NB_UID" -g "$NB_GID" "$RUNTIME_DIR"
    else
        install -d -m 0700 "$RUNTIME_DIR"
    fi
}

# no_link_in_path WHAT PATH: fails (one ERROR line, exit 2) when PATH is, or passes through, a symbolic
# link: as root, a link the user made would redirect a chown or a read to a file of root's.
no_link_in_path() {
    local part="" name names
    IFS=/ read -ra names <<<"${2#/}"
    for name in "${names[@]}"; do
        part+=/$name
        [ ! -L "$part" ] ||
            die "$1: $part is a symbolic link; expected a path with no link in it (a link the user can make would redirect what root does)"
    done
}

# Docker gives every `docker exec`, the healthcheck included, the container's configured environment: a
# secret given with -e reaches any process an admin starts as the user with `docker exec -u`, and in a
# start without root every exec and the probe run as the user. One line, in every start mode, names them
# and what to do instead: a WARNING where JUPYTER_PASSWORD is among them (docs/security.md calls that
# unsafe), else an INFO (JUPYTER_ENV_VARS_TO_UNSET's names alone: docker-stacks' documented use, which
# starts with no WARNING there). Reads secrets_in_environment (hand_off's names of those given with -e).
warn_of_secrets_in_the_environment() {
    local given=${secrets_in_environment:-} instead say=log
    [ -n "$given" ] || return 0
    [[ " $given " != *" JUPYTER_PASSWORD "* ]] || say=warn
    instead="give JUPYTER_PASSWORD as JUPYTER_PASSWORD_FILE and the others as mounted files"
    if root_start; then
        $say "$given came in the container's environment, which Docker gives to every docker exec: docker exec -u $NB_USER hands them to the user (/proc/PID/environ); $instead, and run commands as the user with docker exec CONTAINER runuser -l $NB_USER -c 'COMMAND', which starts them without it (docs/security.md)"
    else
        $say "$given came in the container's environment: in a start without root, docker exec and the healthcheck run as UID $(id -u) with it, so the user can read them there; $instead (which the user can read too: nothing is hidden from the UID that runs everything), or start as root (docs/security.md)"
    fi
}
