# shellcheck shell=bash
# Reading the command line and checking every variable: bad input stops here (die, exit 2), before
# anything starts. Each variable's own default and check is in variables.tsv; these are the rest.

# True when a JupyterHub spawner (DockerSpawner, KubeSpawner) started the container: it sets
# JUPYTERHUB_API_TOKEN and the URL to serve at, and jupyterhub-singleuser, with the hub's auth, stands
# in for the standalone server.
spawned_by_hub() {
    [ -n "${JUPYTERHUB_API_TOKEN:-}" ]
}

# read_command_line ARG...: sets user_command (what runs in place of the services; empty: the services)
# and jupyter_args (the server's options given on the command line).
# docker-stacks' start scripts may be named as the command (compose files and spawner settings written
# for its images): this entrypoint stands for all of them. `start.sh CMD` runs CMD; start-notebook.* and
# start-singleuser.* are the services, their options going to the Jupyter server. Under a hub, the
# spawner's command `jupyterhub-singleuser` (KubeSpawner's default; DockerSpawner needs
# c.DockerSpawner.cmd, as the image's CMD is empty) means that server with the services, and its
# arguments, like options alone (c.Spawner.args), go to it; anything else is a command, as always.
read_command_line() {
    case "${1:-}" in
        start.sh) shift ;;
        start-notebook.py | start-notebook.sh | start-singleuser.py | start-singleuser.sh)
            shift && jupyter_args=("$@") && set -- ;;
    esac
    if spawned_by_hub; then
        hub_scheme_and_port >/dev/null
        case "${1:-}" in
            jupyterhub-singleuser) shift && jupyter_args=("$@") && set -- ;;
            -*) jupyter_args=("$@") && set -- ;;
        esac
    fi
    user_command=("$@")
}

# Prints JUPYTERHUB_SERVICE_URL's scheme and port (the scheme's own where the URL has none), or dies.
hub_scheme_and_port() {
    [ -n "${JUPYTERHUB_SERVICE_URL:-}" ] ||
        die "JUPYTERHUB_API_TOKEN is set but JUPYTERHUB_SERVICE_URL is not: expected both (a JupyterHub spawner sets them), or neither"
    [[ $JUPYTERHUB_SERVICE_URL =~ ^(https?)://(\[[^]/]*\]|[^]/:[]*)(:([0-9]{1,5}))?(/|$) ]] ||
        die "JUPYTERHUB_SERVICE_URL='$JUPYTERHUB_SERVICE_URL': expected the URL to serve at, such as http://0.0.0.0:8888/user/NAME/"
    local scheme=${BASH_REMATCH[1]} port=${BASH_REMATCH[4]}
    [ -n "$port" ] || { [ "$scheme" = http ] && port=80; } || port=443
    echo "$scheme $port"
}

# read_secret_file NAME: if NAME_FILE is set, NAME takes the file's content (Docker secrets, in place
# of the environment).
read_secret_file() {
    local file_var="${1}_FILE"
    [ -n "${!file_var:-}" ] || return 0
    [ -z "${!1:-}" ] || die "$1 and $file_var are both set; set one"
    no_link_in_path "$file_var" "${!file_var}"
    [ -r "${!file_var}" ] || die "$file_var=${!file_var}: no readable file there (expected the path of a mounted secret)"
    printf -v "$1" '%s' "$(cat -- "${!file_var}")"
    unset "$file_var"
}

# Sets SSH_PUBLIC_KEY and JUPYTER_UI from the other names they come under: PUBLIC_KEY (the name GPU
# clouds such as RunPod and Vast.ai use) and DOCKER_STACKS_JUPYTER_CMD (docker-stacks' lab or notebook).
# PUBLIC_KEY is unset.
merge_other_names() {
    if [ -n "${PUBLIC_KEY:-}" ]; then
        [ -z "$SSH_PUBLIC_KEY" ] || die "SSH_PUBLIC_KEY and PUBLIC_KEY are both set; set one"
        SSH_PUBLIC_KEY=$PUBLIC_KEY
    fi
    unset PUBLIC_KEY
    JUPYTER_UI=${JUPYTER_UI:-${DOCKER_STACKS_JUPYTER_CMD:-notebook}}
}

# Reads NB_USER, NB_UID, SSH_PORT and JUPYTER_PORT: what each may be given what the others are.
check_account_and_ports() {
    local existing_uid
    existing_uid=$(id -u "$NB_USER" 2>/dev/null || true)
    [ -z "$existing_uid" ] || ((existing_uid >= 1000)) ||
        die "NB_USER='$NB_USER' is a system account of the image: expected another name, such as jovyan"
    [ "${NB_UID:-1}" != 0 ] || die "NB_UID=0: Jupyter and logins never run as root; expected a non-root UID such as 1000"
    ((SSH_PORT != JUPYTER_PORT)) || die "SSH_PORT and JUPYTER_PORT are both $SSH_PORT: expected two different ports"
}

# Appends NOTEBOOK_ARGS (docker-stacks' options for the server) to jupyter_args, split into words as a
# shell would (shlex, as their start-notebook.py does; Python as root runs with -I).
add_notebook_args() {
    local split_words words
    [ -n "${NOTEBOOK_ARGS:-}" ] || return 0
    split_words='import shlex, sys; sys.stdout.write("".join(word + "\0" for word in shlex.split(sys.argv[1])))'
    /opt/env/bin/python -I -c "$split_words" "$NOTEBOOK_ARGS" >/dev/null 2>&1 ||
        die "NOTEBOOK_ARGS='$NOTEBOOK_ARGS': expected options for the Jupyter server, quoted as in a shell, such as --ServerApp.base_url=/me"
    readarray -d '' -t words < <(/opt/env/bin/python -I -c "$split_words" "$NOTEBOOK_ARGS")
    jupyter_args+=("${words[@]}")
}

# Kubeflow's NB_PREFIX is the server's base_url, unless NOTEBOOK_ARGS gave one.
add_prefix_arg() {
    [ -n "${NB_PREFIX:-}" ] && [ "$(server_base_url)" = / ] || return 0
    jupyter_args+=(--ServerApp.base_url="$NB_PREFIX")
}

# Reads jupyter_args, JUPYTER_TOKEN, JUPYTER_PASSWORD and JUPYTER_NO_AUTH. Jupyter never runs without
# auth by accident: an option that empties the token (with no password) is refused; JUPYTER_NO_AUTH=yes
# alone turns auth off, on purpose, with a warning at every start.
check_jupyter_auth() {
    local i empty_token=no
    for i in "${!jupyter_args[@]}"; do
        case "${jupyter_args[i]}" in
            --*.token= | --*.token=\'\' | --*.token=\"\") empty_token=yes ;;
            --*.token) [[ ${jupyter_args[i + 1]-} =~ ^(\'\'|\"\")?$ ]] && empty_token=yes ;;
        esac
    done
    if [ "$empty_token" = yes ] && ! spawned_by_hub && [ -z "$JUPYTER_PASSWORD" ] && [ "$JUPYTER_NO_AUTH" = no ]; then
        die "an option empties Jupyter's token, which would serve Jupyter without auth: expected a token or a password (JUPYTER_TOKEN, JUPYTER_PASSWORD), or JUPYTER_NO_AUTH=yes to turn auth off on purpose"
    fi
    [ "$JUPYTER_NO_AUTH" = no ] || [ -z "$JUPYTER_TOKEN$JUPYTER_PASSWORD" ] ||
        die "JUPYTER_NO_AUTH=yes and a JUPYTER_TOKEN or JUPYTER_PASSWORD: expected one of them, not both"
    [ -z "$JUPYTER_TOKEN" ] || [ -z "$JUPYTER_PASSWORD" ] ||
        die "JUPYTER_TOKEN and JUPYTER_PASSWORD are both set: expected one of them (or neither, for a random token)"
}
