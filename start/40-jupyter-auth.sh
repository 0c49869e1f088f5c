# shellcheck shell=bash
# shellcheck disable=SC2154,SC2034  # hub: set by 10-validate.sh; token_generated: read by supervise.sh
# 4. Jupyter auth: the hub's login, an argon2-hashed password, the given token or a random one;
# never none. Sets token_generated; JUPYTER_PASSWORD leaves the environment.
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
