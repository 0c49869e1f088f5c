# shellcheck shell=bash
# Jupyter's auth: the hub's login, an argon2-hashed password, the given token or a random one; never
# none unless JUPYTER_NO_AUTH=yes.

# Reads JUPYTER_TOKEN, JUPYTER_PASSWORD, JUPYTER_NO_AUTH and the hub's token. Sets jupyter_auth (the
# variables for Jupyter's environment, and for nothing else), token_generated (yes for a random token,
# which the log shows) and JUPYTER_TOKEN; adds to jupyter_args; unsets JUPYTER_PASSWORD.
choose_jupyter_auth() {
    if spawned_by_hub; then
        # The hub's OAuth (JupyterHubIdentityProvider) is the only way in; a token of our own would
        # be a second one.
        [ -z "$JUPYTER_TOKEN$JUPYTER_PASSWORD" ] ||
            log "JupyterHub: JUPYTER_TOKEN/JUPYTER_PASSWORD ignored, the hub's login applies"
        jupyter_auth=("JUPYTERHUB_API_TOKEN=$JUPYTERHUB_API_TOKEN")
        [ -z "${JPY_API_TOKEN:-}" ] || jupyter_auth+=("JPY_API_TOKEN=$JPY_API_TOKEN")
    elif [ "$JUPYTER_NO_AUTH" = yes ]; then
        warn "JUPYTER_NO_AUTH=yes: Jupyter runs with no token and no password, so whoever reaches port $JUPYTER_PORT runs code as $NB_USER"
        jupyter_auth=("JUPYTER_TOKEN=")
        jupyter_args+=(--IdentityProvider.token=)
    elif [ -n "$JUPYTER_PASSWORD" ]; then
        # Only the argon2 hash reaches Jupyter. Python as root: -I, no user site or PYTHON* variables.
        jupyter_auth=("TORCHLAB_JUPYTER_PASSWORD_HASH=$(printf '%s' "$JUPYTER_PASSWORD" |
            /opt/env/bin/python -I -c 'import sys; from jupyter_server.auth import passwd; print(passwd(sys.stdin.read(), "argon2"))')")
    else
        if [ -z "$JUPYTER_TOKEN" ]; then
            JUPYTER_TOKEN=$(od -An -vtx1 -N24 /dev/urandom | tr -d ' \n')
            token_generated=yes
        fi
        jupyter_auth=("JUPYTER_TOKEN=$JUPYTER_TOKEN")
    fi
    unset JUPYTER_PASSWORD
}
