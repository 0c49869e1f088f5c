#!/bin/bash
# torchlab entrypoint. tini (PID 1) runs it, as root or (--user, Kubernetes runAsNonRoot,
# OpenShift, rootless Podman) as the user itself; it reads top to bottom:
#   1. read and validate every variable: bad input stops here, before anything starts
#   2. the user: as root, name, group, UID/GID (adopting /workspace's owner), sudo, home, chowns;
#      as a user, a passwd entry for its UID, and one line for each thing that needs root
#   3. SSH: authorized keys, per-container host keys, the container's environment for sessions
#   4. Jupyter auth: a token or an argon2-hashed password, never none
#   5. hooks, then either the given command as the user, or sshd + Jupyter supervised
#      (jupyterhub-singleuser in place of the standalone server when a JupyterHub spawned it)
# Every variable is documented in README.md. Files other parts read, all in /run/torchlab:
#   services             exists while the services are meant to run (the healthcheck's cue);
#                        under JupyterHub it holds the URL of Jupyter's /api (the hub's prefix)
#   session-env.sh       the container's environment for SSH sessions (/etc/profile.d/torchlab.sh
#                        and /etc/bash.bashrc source it)
#   authorized_keys/USER keys from SSH_PUBLIC_KEY / PUBLIC_KEY (sshd's AuthorizedKeysFile)
#   sshd_config.d/*.conf sshd drop-ins written at start (host keys)
set -euo pipefail

# Messages go to stderr: stdout belongs to the command, when one is given.
log() { printf 'torchlab: %s\n' "$*" >&2; }
# One line, whatever the bad value held: control characters are shown as '?'.
die() {
    local message="$*"
    printf 'torchlab: error: %s\n' "${message//[[:cntrl:]]/?}" >&2
    exit 2
}

# ---------------------------------------------------------------- 1. read and validate
if [ "$(id -u)" = 0 ]; then as_root=yes; else as_root=no; fi

# A JupyterHub spawner (DockerSpawner, KubeSpawner) sets JUPYTERHUB_API_TOKEN and the URL to
# serve at: then jupyterhub-singleuser, with the hub's auth, stands in for the standalone server.
# The spawner's command `jupyterhub-singleuser` (KubeSpawner's default; DockerSpawner needs
# c.DockerSpawner.cmd, as the image's CMD is empty) means that server with the services, and its
# arguments, like options alone (c.Spawner.args), go to it; anything else is a command, as always.
hub_args=()
if [ -n "${JUPYTERHUB_API_TOKEN:-}" ]; then
    hub=yes
    [ -n "${JUPYTERHUB_SERVICE_URL:-}" ] ||
        die "JUPYTERHUB_API_TOKEN is set but JUPYTERHUB_SERVICE_URL is not: expected both (a JupyterHub spawner sets them), or neither"
    [[ $JUPYTERHUB_SERVICE_URL =~ ^(https?)://(\[[^]/]*\]|[^]/:[]*)(:([0-9]{1,5}))?(/|$) ]] ||
        die "JUPYTERHUB_SERVICE_URL='$JUPYTERHUB_SERVICE_URL': expected the URL to serve at, such as http://0.0.0.0:8888/user/NAME/"
    hub_scheme=${BASH_REMATCH[1]} hub_port=${BASH_REMATCH[4]}
    [ -n "$hub_port" ] || { [ "$hub_scheme" = http ] && hub_port=80; } || hub_port=443
    case "${1:-}" in
        jupyterhub-singleuser) shift && hub_args=("$@") && set -- ;;
        -*) hub_args=("$@") && set -- ;;
    esac
else
    hub=no
fi

# VAR_FILE variants let secrets come from Docker secrets instead of the environment.
read_file_var() {  # NAME: if NAME_FILE is set, NAME takes the file's content
    local file_var="${1}_FILE"
    [ -n "${!file_var:-}" ] || return 0
    [ -z "${!1:-}" ] || die "$1 and $file_var are both set; set one"
    [ -r "${!file_var}" ] || die "$file_var=${!file_var}: no readable file there (expected the path of a mounted secret)"
    printf -v "$1" '%s' "$(cat -- "${!file_var}")"
    unset "$file_var"
}
read_file_var JUPYTER_TOKEN
read_file_var JUPYTER_PASSWORD
read_file_var SSH_PUBLIC_KEY
read_file_var PUBLIC_KEY
# PUBLIC_KEY is the name GPU clouds (RunPod, Vast.ai) use.
key_var=SSH_PUBLIC_KEY
if [ -n "${PUBLIC_KEY:-}" ]; then
    [ -z "${SSH_PUBLIC_KEY:-}" ] || die "SSH_PUBLIC_KEY and PUBLIC_KEY are both set; set one"
    SSH_PUBLIC_KEY=$PUBLIC_KEY key_var=PUBLIC_KEY
fi

NB_USER=${NB_USER:-jovyan}
SSH_PORT=${SSH_PORT:-2222}
JUPYTER_PORT=${JUPYTER_PORT:-8888}
JUPYTER_TOKEN=${JUPYTER_TOKEN:-}
JUPYTER_PASSWORD=${JUPYTER_PASSWORD:-}
SSH_PUBLIC_KEY=${SSH_PUBLIC_KEY:-}
GRANT_SUDO=${GRANT_SUDO:-no}
CHOWN_HOME=${CHOWN_HOME:-no}
CHOWN_HOME_OPTS=${CHOWN_HOME_OPTS:-}
CHOWN_EXTRA=${CHOWN_EXTRA:-}
CHOWN_EXTRA_OPTS=${CHOWN_EXTRA_OPTS:-}
JUPYTER_ENV_VARS_TO_UNSET=${JUPYTER_ENV_VARS_TO_UNSET:-}
DOCTOR_AT_START=${DOCTOR_AT_START:-yes}
JUPYTER_UI=${JUPYTER_UI:-notebook}
SHM_WARN_MB=1024

for var in NB_USER NB_GROUP; do
    [ -z "${!var+set}" ] || [[ ${!var} =~ ^[a-z_][a-z0-9_-]{0,31}$ ]] ||
        die "$var='${!var}': expected a Linux $([ "$var" = NB_USER ] && echo user || echo group) name (lower-case letters, digits, _ or -, at most 32)"
done
# As a user (docker run --user, runAsNonRoot, OpenShift's arbitrary UIDs): sshd, ssh-keygen, git
# and pip need a passwd entry for the UID. The image lets groups 0 (as docker-stacks does) and
# users (100) write /etc/passwd for this.
ensure_passwd_entry() {
    local uid gid home
    uid=$(id -u) gid=$(id -g)
    id -un >/dev/null 2>&1 && return 0
    if [ ! -w /etc/passwd ]; then
        # A command may do without a name; sshd cannot.
        local why="UID $uid has no passwd entry and /etc/passwd is not writable"
        local fix="start with GID 0 or 100 (--user $uid:0) on a writable root file system, or with a UID of the image such as 1000"
        [ "$#" -gt 0 ] || die "$why: expected to $fix"
        log "warning: $why, so ssh, git and pip --user may fail: $fix"
        return 0
    fi
    home=/home/jovyan
    [ -w "$home" ] || [ ! -w /workspace ] || home=/workspace
    # sed -i would need to write a temporary file in /etc; the image's jovyan gives way.
    sed "/^$NB_USER:/d" /etc/passwd >/tmp/torchlab-passwd
    printf '%s:x:%s:%s:torchlab user:%s:/bin/bash\n' "$NB_USER" "$uid" "$gid" "$home" >>/tmp/torchlab-passwd
    cat /tmp/torchlab-passwd >/etc/passwd && rm -f /tmp/torchlab-passwd
    log "UID $uid had no passwd entry: it is now $NB_USER, home $home"
}
[ "$as_root" = yes ] || ensure_passwd_entry "$@"
existing_uid=$(id -u "$NB_USER" 2>/dev/null || true)
[ -z "$existing_uid" ] || ((existing_uid >= 1000)) ||
    die "NB_USER='$NB_USER' is a system account of the image: expected another name, such as jovyan"
for var in NB_UID NB_GID; do
    value=${!var:-}
    if [ -n "$value" ] && { ! [[ $value =~ ^[0-9]{1,10}$ ]] || ((10#$value > 4294967294)); }; then
        die "$var='$value': expected a numeric ID such as 1000"
    fi
    [ -z "$value" ] || printf -v "$var" '%d' "$((10#$value))"
done
[ "${NB_UID:-1}" != 0 ] || die "NB_UID=0: Jupyter and logins never run as root; expected a non-root UID such as 1000"
for var in SSH_PORT JUPYTER_PORT; do
    value=${!var}
    if ! [[ $value =~ ^[0-9]{1,5}$ ]] || ((10#$value < 1 || 10#$value > 65535)); then
        die "$var='$value': expected a TCP port number from 1 to 65535"
    fi
done
((10#$SSH_PORT != 10#$JUPYTER_PORT)) ||
    die "SSH_PORT and JUPYTER_PORT are both $SSH_PORT: expected two different ports"
SSH_PORT=$((10#$SSH_PORT)) JUPYTER_PORT=$((10#$JUPYTER_PORT))
# What the healthcheck asks under a hub: Jupyter's /api at the hub's port and prefix (without a
# hub it asks JUPYTER_PORT's /api).
hub_probe=""
[ "$hub" = no ] || hub_probe=$hub_scheme://127.0.0.1:$hub_port${JUPYTERHUB_SERVICE_PREFIX:-/}api
for var in GRANT_SUDO CHOWN_HOME DOCTOR_AT_START; do
    case "${!var}" in
        yes | 1 | true) printf -v "$var" yes ;;
        no | 0 | false | "") printf -v "$var" no ;;
        *) die "$var='${!var}': expected yes or no" ;;
    esac
done
for var in CHOWN_HOME_OPTS CHOWN_EXTRA_OPTS; do
    read -ra words <<<"${!var}"
    for word in "${words[@]}"; do
        case $word in
            -R | --recursive | -h | --no-dereference | -c | --changes | -f | --silent | --quiet | -v | --verbose) ;;
            *) die "$var='${!var}': expected chown options from -R, -h, -c, -f and -v" ;;
        esac
    done
done
case "$JUPYTER_UI" in
    notebook) ui_path=/tree ;;
    lab) ui_path=/lab ;;
    *) die "JUPYTER_UI='$JUPYTER_UI': expected notebook or lab" ;;
esac
IFS=, read -ra chown_extra_paths <<<"$CHOWN_EXTRA"
for path in "${chown_extra_paths[@]}"; do
    [[ $path == /* ]] || die "CHOWN_EXTRA='$CHOWN_EXTRA': expected absolute paths separated by commas, such as /opt/data,/srv/cache"
done
IFS=, read -ra vars_to_unset <<<"$JUPYTER_ENV_VARS_TO_UNSET"
for name in "${vars_to_unset[@]}"; do
    [[ $name =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] ||
        die "JUPYTER_ENV_VARS_TO_UNSET='$JUPYTER_ENV_VARS_TO_UNSET': expected variable names separated by commas, such as HF_TOKEN,WANDB_API_KEY"
done
[ -z "$JUPYTER_TOKEN" ] || [ -z "$JUPYTER_PASSWORD" ] ||
    die "JUPYTER_TOKEN and JUPYTER_PASSWORD are both set: expected one of them (or neither, for a random token)"
[[ $JUPYTER_TOKEN =~ ^[[:graph:]]*$ ]] ||
    die "JUPYTER_TOKEN: expected printable characters without spaces"
if [ -n "$SSH_PUBLIC_KEY" ]; then
    # One key per line; ssh-keygen is the judge of what a valid public key is.
    keyfile=$(mktemp)
    line_no=0
    while IFS= read -r line; do
        line_no=$((line_no + 1))
        [[ -z ${line//[[:space:]]/} || $line == \#* ]] && continue
        printf '%s\n' "$line" >"$keyfile"
        ssh-keygen -l -f "$keyfile" >/dev/null 2>&1 ||
            die "$key_var line $line_no is not an OpenSSH public key: expected one key per line like 'ssh-ed25519 AAAAC3... you@laptop' (the .pub file, not the private key)"
    done <<<"$SSH_PUBLIC_KEY"
    rm -f "$keyfile"
fi
unset PUBLIC_KEY

# From here the healthcheck expects the services (until they answer, unhealthy); a container
# given a command of its own runs none, and has nothing to check. /run/torchlab is root's on a
# root start; a start as a user needs it writable (the image's is; with --read-only, a tmpfs).
if [ "$as_root" = yes ]; then
    install -d -m 0755 -o root -g root /run/torchlab /run/torchlab/authorized_keys /run/torchlab/sshd_config.d \
        /run/sshd  # sshd's privilege separation directory
else
    { mkdir -p /run/torchlab/authorized_keys /run/torchlab/sshd_config.d 2>/dev/null && [ -w /run/torchlab ]; } ||
        die "/run/torchlab is not writable by UID $(id -u): expected the image's own, or with --read-only a tmpfs there (--tmpfs /run/torchlab:uid=$(id -u),gid=$(id -g))"
fi
rm -f /run/torchlab/services
[ $# -gt 0 ] || printf '%s\n' "$hub_probe" >/run/torchlab/services

run_hooks() {  # DIR: *.sh files are sourced, other executables run; in name order
    local f
    for f in "$1"/*; do
        [ -f "$f" ] || continue
        case "$f" in
            *.sh) log "hook: sourcing $f"; # shellcheck disable=SC1090
                source "$f" ;;
            *) if [ -x "$f" ]; then log "hook: running $f"; "$f"; else log "hook: ignoring $f (not executable)"; fi ;;
        esac
    done
}

# A mounted folder holds someone's files: a start never moves, deletes or recursively chowns
# what is inside a mount point unless that path was named (CHOWN_HOME for the home,
# CHOWN_EXTRA). mounts_under PATH lists the mount points at or below PATH.
mounts_under() {
    local path=${1%/} point
    while read -r _ _ _ _ point _; do
        printf -v point '%b' "$point"  # mountinfo writes a space as \040
        [[ $point == "$path" || $point == "$path"/* ]] && printf '%s\n' "$point"
    done </proc/self/mountinfo
}
# chown_tree OWNER PATH [CHOWN_OPTION...] [-- FIND_TEST...]: chown PATH and what lies below it
# (and passes the tests), without entering a mount point below PATH.
chown_tree() {
    local owner=$1 path point options=() prune=()
    path=$(realpath -e "$2") && shift 2 || return 1
    while [ $# -gt 0 ] && [ "$1" != -- ]; do options+=("$1") && shift; done
    [ $# -eq 0 ] || shift
    while IFS= read -r point; do
        [ "$point" = "$path" ] && continue
        point=${point//\\/\\\\} point=${point//\*/\\*} point=${point//\?/\\?} point=${point//\[/\\[}
        prune+=(-path "$point" -prune -o)
    done < <(mounts_under "$path")
    find "$path" "${prune[@]}" "$@" -exec chown --no-dereference "${options[@]}" "$owner" {} +
}
# chown_named OPTIONS OWNER PATH: chown as asked for by name; -R stops at mount points below PATH.
chown_named() {
    local words options=() recursive=no word
    read -ra words <<<"$1"
    for word in "${words[@]}"; do
        case $word in -R | --recursive) recursive=yes ;; *) options+=("$word") ;; esac
    done
    [ -e "$3" ] || die "CHOWN_EXTRA: $3 does not exist; expected existing paths"
    if [ "$recursive" = yes ]; then
        chown_tree "$2" "$3" "${options[@]}"
    else
        chown "${options[@]}" "$2" "$3"
    fi
}

# The primary group: NB_GID's, named NB_GROUP when given (a new GID gets NB_GROUP, else NB_USER,
# as its name). The account keeps `users` (100) as a supplementary group, as in docker-stacks.
primary_group() {
    local existing
    existing=$(getent group "$NB_GID" | cut -d: -f1 || true)
    if [ -z "$existing" ]; then
        getent group "${NB_GROUP:-$NB_USER}" >/dev/null &&
            die "NB_GROUP='${NB_GROUP:-$NB_USER}' already names GID $(getent group "${NB_GROUP:-$NB_USER}" | cut -d: -f3), not NB_GID=$NB_GID: expected a new group name, or that GID"
        groupadd --gid "$NB_GID" "${NB_GROUP:-$NB_USER}"
    elif [ -n "${NB_GROUP:-}" ] && [ "$existing" != "$NB_GROUP" ]; then
        groupmod --new-name "$NB_GROUP" "$existing"
        log "NB_GROUP: GID $NB_GID is now named $NB_GROUP (was $existing)"
    fi
}

# As root: the image's user is jovyan (1000:100); rename and renumber it as asked.
setup_user_as_root() {
    local old_home old_uid groups=()
    old_home=$(getent passwd jovyan | cut -d: -f6 || true)
    if ! id -u "$NB_USER" >/dev/null 2>&1; then
        if [ -e "/home/$NB_USER" ]; then
            usermod --login "$NB_USER" --home "/home/$NB_USER" jovyan
        elif [ -n "$(mounts_under "$old_home")" ]; then
            # usermod --move-home copies a home that holds a mount, then deletes the original
            # through it: the folder stays where it is, and the new name points at it.
            usermod --login "$NB_USER" jovyan
            ln -s "$old_home" "/home/$NB_USER"
            log "NB_USER: renamed jovyan to $NB_USER; the home stays $old_home (it holds mounts), /home/$NB_USER links to it"
        else
            usermod --login "$NB_USER" --home "/home/$NB_USER" --move-home jovyan
        fi
    fi
    primary_group
    HOME_DIR=$(getent passwd "$NB_USER" | cut -d: -f6)
    old_uid=$(id -u "$NB_USER")
    if [ "$old_uid" != "$NB_UID" ] || [ "$(id -g "$NB_USER")" != "$NB_GID" ]; then
        # Not usermod --uid: it chowns the home's files itself, through any mount below it. The
        # image's own files in the home follow the new IDs; what is mounted keeps its owners.
        [ "$NB_GID" = 100 ] || groups=(--groups users)
        userdel "$NB_USER" 2>/dev/null  # it warns that a group named after the user stays: it should
        useradd --no-create-home --no-log-init --non-unique --home-dir "$HOME_DIR" --shell /bin/bash \
            --uid "$NB_UID" --gid "$NB_GID" "${groups[@]}" --password '*' "$NB_USER"
        if mountpoint -q "$HOME_DIR"; then
            log "the home $HOME_DIR is a mount: its files keep their owners (CHOWN_HOME=yes chowns it)"
        else
            chown_tree "$NB_UID:$NB_GID" "$HOME_DIR" -- -user "$old_uid"
        fi
    fi
    [ "$CHOWN_HOME" = no ] || chown_named "$CHOWN_HOME_OPTS" "$NB_UID:$NB_GID" "$HOME_DIR"
    for path in "${chown_extra_paths[@]}"; do
        chown_named "$CHOWN_EXTRA_OPTS" "$NB_UID:$NB_GID" "$path"
    done
    if [ "$GRANT_SUDO" = yes ]; then
        printf '%s ALL=(ALL) NOPASSWD:ALL\n' "$NB_USER" >/etc/sudoers.d/torchlab
        chmod 0440 /etc/sudoers.d/torchlab
        log "GRANT_SUDO: $NB_USER may use sudo without a password"
    else
        rm -f /etc/sudoers.d/torchlab
    fi
    # /etc/passwd is writable by groups 0 and users only for starts as a user (below); chmod also
    # sets the ACL's mask, so neither group keeps it.
    chmod 0644 /etc/passwd 2>/dev/null || true  # a read-only root keeps it unwritable anyway
    # A /workspace that Docker made for a bind mount is root's and empty; the image's own is
    # jovyan's (1000). Either way it becomes the user's; a mounted folder of someone else's is left.
    if [ -d /workspace ]; then
        local ws_uid
        ws_uid=$(stat -c %u /workspace)
        if { [ "$ws_uid" = 0 ] && [ -z "$(ls -A /workspace)" ]; } ||
            { [ "$ws_uid" = 1000 ] && ! mountpoint -q /workspace; }; then
            chown "$NB_UID:$NB_GID" /workspace
        fi
    fi
}

# As a user: what only root can do is skipped, one line each.
setup_user_as_self() {
    local uid gid name
    uid=$(id -u) gid=$(id -g) name=$(id -un 2>/dev/null || echo "$NB_USER")
    [ "$name" = "$NB_USER" ] || log "NB_USER=$NB_USER: skipped, UID $uid is already $name and renaming needs a root start (drop --user)"
    if [ "${NB_UID_GIVEN:-$uid}" != "$uid" ] || [ "${NB_GID_GIVEN:-$gid}" != "$gid" ]; then
        log "NB_UID/NB_GID: skipped, the container runs as $uid:$gid and changing IDs needs a root start; give them to --user instead"
    fi
    [ -z "${NB_GROUP:-}" ] || log "NB_GROUP: skipped, naming groups needs a root start (drop --user)"
    [ "$GRANT_SUDO" = no ] || log "GRANT_SUDO: skipped, the container started as UID $uid, not root; sudo needs a root start (drop --user)"
    if [ "$CHOWN_HOME" = yes ] || [ -n "$CHOWN_EXTRA" ]; then
        log "CHOWN_HOME/CHOWN_EXTRA: skipped, chown needs a root start; give the files to UID $uid on the host instead"
    fi
    NB_USER=$name NB_UID=$uid NB_GID=$gid
    HOME_DIR=$(getent passwd "$uid" | cut -d: -f6 || true)
    HOME_DIR=${HOME_DIR:-/home/jovyan}
}

# ---------------------------------------------------------------- 2. the user
# Files written to /workspace should belong to the person on the host: with no NB_UID
# given, a /workspace owned by a non-root user is adopted.
NB_UID_GIVEN=${NB_UID:-} NB_GID_GIVEN=${NB_GID:-}
if [ "$as_root" = yes ] && [ -z "${NB_UID:-}" ] && [ -d /workspace ]; then
    ws_uid=$(stat -c %u /workspace) ws_gid=$(stat -c %g /workspace)
    if [ "$ws_uid" != 0 ] && [ "$ws_uid" != 1000 ]; then
        NB_UID=$ws_uid
        NB_GID=${NB_GID:-$ws_gid}
        log "/workspace belongs to UID $ws_uid (GID $ws_gid): running as UID $NB_UID GID $NB_GID (set NB_UID to choose)"
    fi
fi
if [ -n "${NB_GROUP:-}" ] && [ -z "${NB_GID:-}" ] && getent group "$NB_GROUP" >/dev/null; then
    NB_GID=$(getent group "$NB_GROUP" | cut -d: -f3)
fi
NB_UID=${NB_UID:-1000}
NB_GID=${NB_GID:-100}
uid_owner=$(getent passwd "$NB_UID" | cut -d: -f1 || true)
case "$uid_owner" in
    "" | jovyan | "$NB_USER") ;;
    *) [ "$as_root" = no ] || die "NB_UID=$NB_UID belongs to the image's account '$uid_owner': expected a UID of no other account, such as 1000" ;;
esac

run_hooks /usr/local/bin/start-notebook.d
if [ "$as_root" = yes ]; then setup_user_as_root; else setup_user_as_self; fi

# Prefix that runs a command as NB_USER, keeping the container's environment.
as_user=(env HOME="$HOME_DIR" USER="$NB_USER" LOGNAME="$NB_USER" SHELL=/bin/bash)
[ "$as_root" = no ] || as_user=(setpriv --reuid="$NB_UID" --regid="$NB_GID" --init-groups "${as_user[@]}")


# What the image brings for the user, added only where nothing is: a user's files are never
# overwritten. The notebooks go to /workspace (Jupyter's root); `python train.py` works in the
# SSH login directory.
if [ -d /workspace ] && [ ! -e /workspace/notebooks ]; then
    "${as_user[@]}" cp -r /opt/torchlab/notebooks /workspace/notebooks ||
        log "warning: could not copy the notebooks into /workspace (is it writable by UID $NB_UID?)"
fi
# A link made by an image before 0.3 points at /opt/torchlab/train/train.py, which is gone: it is re-pointed.
if [ "$(readlink "$HOME_DIR/train.py" 2>/dev/null)" = /opt/torchlab/train/train.py ]; then
    "${as_user[@]}" rm -f "$HOME_DIR/train.py" 2>/dev/null || true
fi
if [ ! -e "$HOME_DIR/train.py" ] && [ ! -L "$HOME_DIR/train.py" ]; then
    "${as_user[@]}" ln -s /opt/torchlab/train.py "$HOME_DIR/train.py" 2>/dev/null || true
fi

# ---------------------------------------------------------------- 3. SSH
# Host keys are made at first start, never in the image. As root they live in /etc/ssh/host_keys
# (mount a volume there to keep them); a user's sshd takes the first place it can read or write.
host_keys_ready() {  # DIR: make the keys there if missing; fails where that is not possible
    local key type
    mkdir -p "$1" 2>/dev/null || return 1
    for type in ed25519 ecdsa rsa; do
        key=$1/ssh_host_${type}_key
        [ -r "$key" ] && continue
        { [ ! -e "$key" ] && [ -w "$1" ]; } || return 1
        ssh-keygen -q -t "$type" -N "" -C "torchlab host key" -f "$key"
        log "made SSH host key $(ssh-keygen -l -f "$key.pub" | cut -d' ' -f2) ($type) in $1"
    done
}
# A command runs no sshd: it needs neither host keys nor authorized keys.
if [ $# -eq 0 ]; then
    host_key_dir=""
    for dir in /etc/ssh/host_keys "$HOME_DIR/.ssh/host_keys" /run/torchlab/host_keys; do
        if host_keys_ready "$dir"; then host_key_dir=$dir && break; fi
        [ "$as_root" = no ] || die "could not make SSH host keys in $dir: expected a writable folder there"
    done
    [ -n "$host_key_dir" ] || die "could not make SSH host keys in /etc/ssh/host_keys, $HOME_DIR/.ssh or /run/torchlab: expected one of them writable by UID $NB_UID"
    [ "$host_key_dir" = /etc/ssh/host_keys ] ||
        log "SSH: host keys in $host_key_dir (UID $NB_UID cannot use /etc/ssh/host_keys; mount a volume there that UID $NB_UID owns to keep them)"
    printf 'HostKey %s/ssh_host_%s_key\n' "$host_key_dir" ed25519 "$host_key_dir" ecdsa "$host_key_dir" rsa \
        >/run/torchlab/sshd_config.d/host-keys.conf

    if [ -n "$SSH_PUBLIC_KEY" ]; then
        printf '%s\n' "$SSH_PUBLIC_KEY" >"/run/torchlab/authorized_keys/$NB_USER"
        chmod 0644 "/run/torchlab/authorized_keys/$NB_USER"
        log "SSH: $(grep -c '^[^#[:space:]]' "/run/torchlab/authorized_keys/$NB_USER") public key(s) for $NB_USER"
    else
        rm -f "/run/torchlab/authorized_keys/$NB_USER"
        [ -s "$HOME_DIR/.ssh/authorized_keys" ] ||
            log "SSH: no public key given, so nobody can log in yet: run with -e SSH_PUBLIC_KEY=\"\$(cat ~/.ssh/id_ed25519.pub)\", or mount a file as $HOME_DIR/.ssh/authorized_keys"
    fi
fi
unset SSH_PUBLIC_KEY

# sshd gives sessions a fresh environment: hand them every variable the container was started
# with (this process's own environment), as RunPod and Vast.ai do, except the secrets the
# entrypoint consumes, JUPYTER_ENV_VARS_TO_UNSET, and what belongs to each process.
# Login shells read it through /etc/profile.d, `ssh host CMD` through /etc/bash.bashrc.
not_for_sessions=" JUPYTER_TOKEN JUPYTER_TOKEN_FILE JUPYTER_PASSWORD JUPYTER_PASSWORD_FILE SSH_PUBLIC_KEY"
not_for_sessions+=" SSH_PUBLIC_KEY_FILE PUBLIC_KEY PUBLIC_KEY_FILE JUPYTERHUB_API_TOKEN JPY_API_TOKEN ${vars_to_unset[*]}"
not_for_sessions+=" HOSTNAME HOME PWD OLDPWD SHLVL _ USER LOGNAME SHELL TERM MAIL "
write_session_env() {
    local entry name value
    while IFS= read -r -d '' entry; do
        name=${entry%%=*} value=${entry#*=}
        [[ $not_for_sessions == *" $name "* ]] && continue
        if ! [[ $name =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]]; then
            log "SSH sessions: left out the variable '$name' (not a shell variable name)"
            continue
        fi
        printf "export %s='%s'\n" "$name" "${value//\'/\'\\\'\'}"  # single quotes keep every byte
    done </proc/$$/environ
}
write_session_env >/run/torchlab/session-env.sh.tmp
mv /run/torchlab/session-env.sh.tmp /run/torchlab/session-env.sh

# ---------------------------------------------------------------- 4. Jupyter auth
token_generated=no
if [ "$hub" = yes ]; then
    # The hub's OAuth (JupyterHubIdentityProvider) is the only way in; a token of our own would
    # be a second one.
    [ -z "$JUPYTER_TOKEN$JUPYTER_PASSWORD" ] ||
        log "JupyterHub: JUPYTER_TOKEN/JUPYTER_PASSWORD ignored, the hub's login applies"
    unset JUPYTER_TOKEN
elif [ -n "$JUPYTER_PASSWORD" ]; then
    # Only the argon2 hash reaches Jupyter; the password itself leaves the environment.
    TORCHLAB_JUPYTER_PASSWORD_HASH=$(printf '%s' "$JUPYTER_PASSWORD" |
        python -c 'import sys; from jupyter_server.auth import passwd; print(passwd(sys.stdin.read(), "argon2"))')
    export TORCHLAB_JUPYTER_PASSWORD_HASH
    unset JUPYTER_TOKEN
elif [ -n "$JUPYTER_TOKEN" ]; then
    export JUPYTER_TOKEN
else
    JUPYTER_TOKEN=$(python -c 'import secrets; print(secrets.token_hex(24))')
    export JUPYTER_TOKEN
    token_generated=yes
fi
unset JUPYTER_PASSWORD

# ---------------------------------------------------------------- 5. checks, hooks, start
shm_mb=$(($(df -Pk /dev/shm | awk 'NR == 2 {print $2}') / 1024))
if ((shm_mb < SHM_WARN_MB)); then
    log "warning: /dev/shm is only ${shm_mb} MB; multi-worker DataLoaders die of it with a bus error. Run with --shm-size=8g (or --ipc=host)."
fi
export NB_USER NB_UID NB_GID SSH_PORT JUPYTER_PORT
run_hooks /usr/local/bin/before-notebook.d
# Gone from Jupyter's and the command's environment (and from SSH sessions, above).
[ ${#vars_to_unset[@]} -eq 0 ] || unset "${vars_to_unset[@]}"

# A command runs in the working directory Docker gave (WORKDIR /workspace, or -w).
if [ $# -gt 0 ]; then
    exec "${as_user[@]}" "$@"
fi
cd /workspace

# sshd keeps no secret in its environment. A user's sshd serves that one account (OpenSSH's
# non-privileged mode); its key files live in /run/torchlab, which is the user's: StrictModes off.
sshd_options=(-o "Port=$SSH_PORT" -o PidFile=none)
[ "$as_root" = yes ] || sshd_options+=(-o StrictModes=no)
env -u JUPYTER_TOKEN -u TORCHLAB_JUPYTER_PASSWORD_HASH -u JUPYTERHUB_API_TOKEN -u JPY_API_TOKEN /usr/sbin/sshd -D -e "${sshd_options[@]}" &
sshd_pid=$!
# Notebook 7 and JupyterLab are one server either way (/tree and /lab); JUPYTER_UI picks what / opens.
# Under a hub, the hub's URL (ip, port, prefix) and auth win over jupyter_server_config.py; the
# hub admin's c.Spawner.default_url wins over JUPYTER_UI.
if [ "$hub" = yes ]; then
    jupyter_command=(jupyterhub-singleuser)
    [ -n "${JUPYTERHUB_DEFAULT_URL:-}" ] || jupyter_command+=(--ServerApp.default_url="$ui_path")
    jupyter_command+=("${hub_args[@]}")
else
    jupyter_command=(jupyter "$JUPYTER_UI" --ServerApp.port="$JUPYTER_PORT")
fi
"${as_user[@]}" "${jupyter_command[@]}" &
jupyter_pid=$!
# The doctor's report in the start log; in the background, as importing torch and counting a
# large /data take a while.
if [ "$DOCTOR_AT_START" = yes ]; then
    "${as_user[@]}" sh -c "torchlab doctor 2>&1 | sed 's/^/torchlab: doctor: /'" >&2 &
fi
log "SSH:     ssh -p $SSH_PORT $NB_USER@<host>"
if [ "$hub" = yes ]; then
    log "JupyterHub: JUPYTERHUB_API_TOKEN is set, so jupyterhub-singleuser serves $JUPYTERHUB_SERVICE_URL in place of the standalone server, with the hub's login"
elif [ "$token_generated" = yes ]; then
    log "Jupyter: http://127.0.0.1:$JUPYTER_PORT$ui_path?token=$JUPYTER_TOKEN"
else
    log "Jupyter: http://127.0.0.1:$JUPYTER_PORT$ui_path (log in with your JUPYTER_TOKEN or JUPYTER_PASSWORD)"
fi

# Supervise: when either service ends, stop the other and exit; docker stop (SIGTERM,
# sent to the whole group by tini -g) ends both and exits 0.
stopping=no
trap 'stopping=yes' TERM INT
status=0
wait -n -p ended "$sshd_pid" "$jupyter_pid" || status=$?
if [ "$stopping" = no ]; then
    name=$([ "${ended:-}" = "$sshd_pid" ] && echo sshd || echo Jupyter)
    log "$name exited with status $status; stopping the container"
    [ "$status" != 0 ] || status=1
fi
kill -TERM "$sshd_pid" "$jupyter_pid" 2>/dev/null || true
wait "$sshd_pid" "$jupyter_pid" 2>/dev/null || true
[ "$stopping" = yes ] || exit "$status"
# docker stop: what the user started over SSH (a nohup'd train.py) is in other process groups,
# out of tini's reach. Pass SIGTERM on so it can checkpoint, and wait for it; Docker's stop
# timeout (`docker stop -t`) bounds the wait. The user's processes are those of NB_UID other than
# tini and this script's own; only the top-level ones get SIGTERM (those whose parent is not among
# them): their children, such as DataLoader workers, are theirs to stop.
users_processes() {  # top | all
    ps -e -o pid=,ppid=,uid= | awk -v uid="$NB_UID" -v me=$$ -v which="$1" '
        { owner[$1] = $3; parent[$1] = $2 }
        function ours(pid) { while (pid > 1) { if (pid == me) return 1; pid = parent[pid] } return 0 }
        END {
            for (pid in owner) user[pid] = owner[pid] == uid && pid != 1 && !ours(pid)
            for (pid in user) if (user[pid] && (which == "all" || !user[parent[pid]])) print pid
        }'
}
top_level=$(users_processes top)
if [ -n "$top_level" ]; then
    log "stopping: sent SIGTERM to $NB_USER's processes; waiting for them to exit"
    # shellcheck disable=SC2086  # one PID per word
    kill -TERM $top_level 2>/dev/null || true
    while [ -n "$(users_processes all)" ]; do sleep 0.2; done
fi
exit 0
