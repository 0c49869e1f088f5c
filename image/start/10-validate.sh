# shellcheck shell=bash
# shellcheck disable=SC2034  # jupyter_args, SHM_WARN_MB, ui_path: read by the parts after this one
# 1. Read and validate every variable: bad input stops here (die, exit 2), before anything starts.
# Reads the command line ("$@"): under a JupyterHub, the spawner's jupyterhub-singleuser and its
# options become jupyter_args and the command line is emptied (so do docker-stacks' start scripts'). Sets, for the files after it: as_root,
# hub, jupyter_args (NOTEBOOK_ARGS' words included), base_url, the variables' normalised values, ui_path,
# chown_extra_paths, vars_to_unset;
# as a user, a passwd entry for the UID; /run/torchlab and its services marker.
if [ "$(id -u)" = 0 ]; then as_root=yes; else as_root=no; fi

# A JupyterHub spawner (DockerSpawner, KubeSpawner) sets JUPYTERHUB_API_TOKEN and the URL to
# serve at: then jupyterhub-singleuser, with the hub's auth, stands in for the standalone server.
# The spawner's command `jupyterhub-singleuser` (KubeSpawner's default; DockerSpawner needs
# c.DockerSpawner.cmd, as the image's CMD is empty) means that server with the services, and its
# arguments, like options alone (c.Spawner.args), go to it; anything else is a command, as always.
# docker-stacks' start scripts named as the command (compose files and spawner settings written for
# its images): this entrypoint stands for all of them. `start.sh CMD` runs CMD; start-notebook.*
# and start-singleuser.* are the services, their options going to the Jupyter server.
jupyter_args=()
case "${1:-}" in
    start.sh) shift ;;
    start-notebook.py | start-notebook.sh | start-singleuser.py | start-singleuser.sh) shift && jupyter_args=("$@") && set -- ;;
esac
if [ -n "${JUPYTERHUB_API_TOKEN:-}" ]; then
    hub=yes
    [ -n "${JUPYTERHUB_SERVICE_URL:-}" ] ||
        die "JUPYTERHUB_API_TOKEN is set but JUPYTERHUB_SERVICE_URL is not: expected both (a JupyterHub spawner sets them), or neither"
    [[ $JUPYTERHUB_SERVICE_URL =~ ^(https?)://(\[[^]/]*\]|[^]/:[]*)(:([0-9]{1,5}))?(/|$) ]] ||
        die "JUPYTERHUB_SERVICE_URL='$JUPYTERHUB_SERVICE_URL': expected the URL to serve at, such as http://0.0.0.0:8888/user/NAME/"
    hub_scheme=${BASH_REMATCH[1]} hub_port=${BASH_REMATCH[4]}
    [ -n "$hub_port" ] || { [ "$hub_scheme" = http ] && hub_port=80; } || hub_port=443
    case "${1:-}" in
        jupyterhub-singleuser) shift && jupyter_args=("$@") && set -- ;;
        -*) jupyter_args=("$@") && set -- ;;
    esac
else
    hub=no
fi

# VAR_FILE variants let secrets come from Docker secrets instead of the environment.
read_file_var() {  # NAME: if NAME_FILE is set, NAME takes the file's content
    local file_var="${1}_FILE"
    [ -n "${!file_var:-}" ] || return 0
    [ -z "${!1:-}" ] || die "$1 and $file_var are both set; set one"
    no_link_in_path "$file_var" "${!file_var}"
    [ -r "${!file_var}" ] || die "$file_var=${!file_var}: no readable file there (expected the path of a mounted secret)"
    printf -v "$1" '%s' "$(cat -- "${!file_var}")"
    unset "$file_var"
}
read_file_var JUPYTER_TOKEN
read_file_var JUPYTER_PASSWORD
read_file_var SSH_PUBLIC_KEY
read_file_var PUBLIC_KEY
# /run/torchlab is root's on a root start (the healthcheck and root's shells read it); a start as a
# user needs it writable (the image's is; with --read-only, a tmpfs).
if [ "$as_root" = yes ]; then
    install -d -m 0755 -o root -g root /run/torchlab /run/torchlab/authorized_keys /run/torchlab/sshd_config.d \
        /run/sshd  # sshd's privilege separation directory
else
    { mkdir -p /run/torchlab/authorized_keys /run/torchlab/sshd_config.d 2>/dev/null && [ -w /run/torchlab ]; } ||
        die "/run/torchlab is not writable by UID $(id -u): expected the image's own, or with --read-only a tmpfs there (--tmpfs /run/torchlab:uid=$(id -u),gid=$(id -g))"
fi
# As a user (docker run --user, runAsNonRoot, OpenShift's arbitrary UIDs): sshd, ssh-keygen, git and
# pip need a passwd entry for the UID. /etc/passwd stays read-only (a writable one would let a user name
# itself root to sudo): the entry comes from nss_wrapper, preloaded for the user's processes alone and
# ignored by setuid programs, with a copy of passwd and group in /run/torchlab/nss.
ensure_passwd_entry() {
    local uid gid home nss=/run/torchlab/nss
    uid=$(id -u) gid=$(id -g)
    id -un >/dev/null 2>&1 && return 0
    mkdir -p "$nss"
    home=/home/jovyan
    [ -w "$home" ] || [ ! -w /workspace ] || home=/workspace
    # The image's jovyan gives way to the UID's entry.
    { grep -v "^$NB_USER:" /etc/passwd; printf '%s:x:%s:%s:torchlab user:%s:/bin/bash\n' "$NB_USER" "$uid" "$gid" "$home"; } \
        >"$nss/passwd"
    { cat /etc/group; getent group "$gid" >/dev/null || printf '%s:x:%s:\n' "$NB_USER" "$gid"; } >"$nss/group"
    export LD_PRELOAD=libnss_wrapper.so${LD_PRELOAD:+ $LD_PRELOAD} NSS_WRAPPER_PASSWD=$nss/passwd NSS_WRAPPER_GROUP=$nss/group
    user_env+=("LD_PRELOAD=$LD_PRELOAD" "NSS_WRAPPER_PASSWD=$nss/passwd" "NSS_WRAPPER_GROUP=$nss/group")
    log "UID $uid had no passwd entry: it is now $NB_USER, home $home"
}
# The entry comes first (ssh-keygen, which checks the keys, needs one), with the name it is given.
NB_USER=${NB_USER:-jovyan}
check_variable NB_USER name
[ "$as_root" = yes ] || ensure_passwd_entry
# Each variable's default and check (variables.tsv).
check_variables
# PUBLIC_KEY is the name GPU clouds (RunPod, Vast.ai) use.
if [ -n "${PUBLIC_KEY:-}" ]; then
    [ -z "$SSH_PUBLIC_KEY" ] || die "SSH_PUBLIC_KEY and PUBLIC_KEY are both set; set one"
    SSH_PUBLIC_KEY=$PUBLIC_KEY
fi
# DOCKER_STACKS_JUPYTER_CMD is docker-stacks' name for JUPYTER_UI (its lab and notebook).
JUPYTER_UI=${JUPYTER_UI:-${DOCKER_STACKS_JUPYTER_CMD:-notebook}}
ui_path=$([ "$JUPYTER_UI" = lab ] && echo /lab || echo /tree)
SHM_WARN_MB=1024
IFS=, read -ra chown_extra_paths <<<"$CHOWN_EXTRA"
IFS=, read -ra vars_to_unset <<<"$JUPYTER_ENV_VARS_TO_UNSET"
existing_uid=$(id -u "$NB_USER" 2>/dev/null || true)
[ -z "$existing_uid" ] || ((existing_uid >= 1000)) ||
    die "NB_USER='$NB_USER' is a system account of the image: expected another name, such as jovyan"
[ "${NB_UID:-1}" != 0 ] || die "NB_UID=0: Jupyter and logins never run as root; expected a non-root UID such as 1000"
((SSH_PORT != JUPYTER_PORT)) || die "SSH_PORT and JUPYTER_PORT are both $SSH_PORT: expected two different ports"
# docker-stacks' NOTEBOOK_ARGS: options for the server, split into words as a shell would (shlex, as
# their start-notebook.py does; Python as root runs with -I), after the command's own.
if [ -n "${NOTEBOOK_ARGS:-}" ]; then
    split_words='import shlex, sys; sys.stdout.write("".join(word + "\0" for word in shlex.split(sys.argv[1])))'
    /opt/env/bin/python -I -c "$split_words" "$NOTEBOOK_ARGS" >/dev/null 2>&1 ||
        die "NOTEBOOK_ARGS='$NOTEBOOK_ARGS': expected options for the Jupyter server, quoted as in a shell, such as --ServerApp.base_url=/me"
    readarray -d '' -t words < <(/opt/env/bin/python -I -c "$split_words" "$NOTEBOOK_ARGS")
    jupyter_args+=("${words[@]}")
fi
# The server's base_url, wherever it came from: the healthcheck and the printed URLs follow it.
base_url=/
for i in "${!jupyter_args[@]}"; do
    case "${jupyter_args[i]}" in
        --ServerApp.base_url=* | --NotebookApp.base_url=*) base_url=${jupyter_args[i]#*=} ;;
        --ServerApp.base_url | --NotebookApp.base_url) base_url=${jupyter_args[i + 1]:-/} ;;
    esac
done
[ "$hub" = no ] || base_url=${JUPYTERHUB_SERVICE_PREFIX:-/}
base_url=/${base_url#/} && base_url=${base_url%/}/
# Jupyter never runs without auth by accident: an option that empties the token (with no password) is
# refused; JUPYTER_NO_AUTH=yes alone turns auth off, on purpose, with a warning at every start.
for i in "${!jupyter_args[@]}"; do
    case "${jupyter_args[i]}" in
        --*.token= | --*.token=\'\' | --*.token=\"\") empty_token=yes ;;
        --*.token) [[ ${jupyter_args[i + 1]-} =~ ^(\'\'|\"\")?$ ]] && empty_token=yes ;;
    esac
done
if [ "${empty_token:-no}" = yes ] && [ "$hub" = no ] && [ -z "$JUPYTER_PASSWORD" ] && [ "$JUPYTER_NO_AUTH" = no ]; then
    die "an option empties Jupyter's token, which would serve Jupyter without auth: expected a token or a password (JUPYTER_TOKEN, JUPYTER_PASSWORD), or JUPYTER_NO_AUTH=yes to turn auth off on purpose"
fi
[ "$JUPYTER_NO_AUTH" = no ] || [ -z "$JUPYTER_TOKEN$JUPYTER_PASSWORD" ] ||
    die "JUPYTER_NO_AUTH=yes and a JUPYTER_TOKEN or JUPYTER_PASSWORD: expected one of them, not both"
# What the healthcheck asks: Jupyter's /api under the base_url, at the hub's port under a hub.
health_url=http://127.0.0.1:$JUPYTER_PORT${base_url}api
[ "$hub" = no ] || health_url=$hub_scheme://127.0.0.1:$hub_port${base_url}api
[ -z "$JUPYTER_TOKEN" ] || [ -z "$JUPYTER_PASSWORD" ] ||
    die "JUPYTER_TOKEN and JUPYTER_PASSWORD are both set: expected one of them (or neither, for a random token)"
unset PUBLIC_KEY

# From here the healthcheck expects the services (until they answer, unhealthy): the URL it asks, and
# sshd's port. A container given a command of its own runs none, and has nothing to check.
rm -f /run/torchlab/services
[ $# -gt 0 ] || printf '%s\n' "$health_url" "$SSH_PORT" >/run/torchlab/services
