# shellcheck shell=bash
# SSH: per-container host keys and authorized keys (only where sshd will run, that is, with no
# command), and the container's environment for SSH sessions (always).

# Host keys are made at first start, never in the image. As root they live in /etc/ssh/host_keys
# (mount a volume there to keep them); a user's sshd takes the first place it can read or write.
# A key that is not a readable key file (left there by the user, in a start as the user) is made anew, or the
# folder is passed over: sshd would exit on it.
host_keys_ready() {  # DIR: make the keys there if missing; fails where that is not possible
    local key type
    mkdir -p "$1" 2>/dev/null || return 1
    for type in ed25519 ecdsa rsa; do
        key=$1/ssh_host_${type}_key
        [ -f "$key" ] && [ -r "$key" ] && ssh-keygen -l -f "$key" >/dev/null 2>&1 && continue
        if [ -e "$key" ] || [ -L "$key" ]; then
            [ -w "$1" ] && rm -f "$key" "$key.pub" && log "SSH: $key was no usable key; making a new one" || return 1
        fi
        [ -w "$1" ] || return 1
        ssh-keygen -q -t "$type" -N "" -C "torchlab host key" -f "$key"
        log "made SSH host key $(ssh-keygen -l -f "$key.pub" | cut -d' ' -f2) ($type) in $1"
    done
}

# Writes sshd's drop-ins in /run/torchlab/sshd_config.d: the host keys (in the first of /etc/ssh/host_keys,
# the home's .ssh/host_keys and /run/torchlab/host_keys where they are or can be made) and sftp with
# NB_UMASK. Reads home_dir.
configure_sshd() {
    local dir key_dir=""
    for dir in /etc/ssh/host_keys "$home_dir/.ssh/host_keys" /run/torchlab/host_keys; do
        if host_keys_ready "$dir"; then key_dir=$dir && break; fi
        ! root_start || die "could not make SSH host keys in $dir: expected a writable folder there"
    done
    [ -n "$key_dir" ] || die "could not make SSH host keys in /etc/ssh/host_keys, $home_dir/.ssh or /run/torchlab: expected one of them writable by UID $NB_UID"
    [ "$key_dir" = /etc/ssh/host_keys ] ||
        log "SSH: host keys in $key_dir (UID $NB_UID cannot use /etc/ssh/host_keys; mount a volume there that UID $NB_UID owns to keep them)"
    printf 'HostKey %s/ssh_host_%s_key\n' "$key_dir" ed25519 "$key_dir" ecdsa "$key_dir" rsa \
        >/run/torchlab/sshd_config.d/host-keys.conf
    printf 'Subsystem sftp internal-sftp%s\n' "${NB_UMASK:+ -u $NB_UMASK}" >/run/torchlab/sshd_config.d/sftp.conf
}

# Writes SSH_PUBLIC_KEY's keys as NB_USER's in /run/torchlab/authorized_keys (sshd's
# AuthorizedKeysFile, beside the home's own). Reads as_user_system and home_dir.
authorize_keys() {
    local keys=/run/torchlab/authorized_keys/$NB_USER
    if [ -n "$SSH_PUBLIC_KEY" ]; then
        printf '%s\n' "$SSH_PUBLIC_KEY" >"$keys"
        chmod 0644 "$keys"
        log "SSH: $(grep -c '^[^#[:space:]]' "$keys") public key(s) for $NB_USER"
    else
        rm -f "$keys"
        "${as_user_system[@]}" /usr/bin/test -s "$home_dir/.ssh/authorized_keys" ||
            log "SSH: no public key given, so nobody can log in yet: run with -e SSH_PUBLIC_KEY=\"\$(cat ~/.ssh/id_ed25519.pub)\", or mount a file as $home_dir/.ssh/authorized_keys"
    fi
}

# This process's environment as Docker gave it (the secrets already out: hand_off), then user_env (what
# the drop sets): NAME=VALUE entries, each ending in a NUL; a later one wins.
session_env_entries() {
    local entry name
    while IFS= read -r -d '' entry; do
        name=${entry%%=*}
        if ! [[ $name =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]]; then
            log "SSH sessions: left out the variable '$name' (not a shell variable name)"
            continue
        fi
        printf '%s\0' "$entry"
    done </proc/$$/environ
    printf '%s\0' "${user_env[@]}"
}

# sshd gives sessions a fresh environment: write /run/torchlab/session-env.sh, the user's (as the drop
# gives it: every variable the container was started with, as RunPod and Vast.ai do, and the user's
# folders), less the secrets the entrypoint consumes, JUPYTER_ENV_VARS_TO_UNSET's names, and what belongs
# to each process. Login shells read it through /etc/profile.d, `ssh host CMD` through /etc/bash.bashrc;
# root's shells never do.
write_session_env() {
    local entry name value left_out
    left_out=" $(table_names 5 no | tr '\n' ' ')${JUPYTER_ENV_VARS_TO_UNSET//,/ }"
    left_out+=" PYTHONNOUSERSITE HOSTNAME HOME PWD OLDPWD SHLVL _ USER LOGNAME SHELL TERM MAIL "
    while IFS= read -r -d '' entry; do
        name=${entry%%=*} value=${entry#*=}
        [[ -z $name || $left_out == *" $name "* ]] && continue
        printf "export %s='%s'\n" "$name" "${value//\'/\'\\\'\'}"  # single quotes keep every byte
    done < <(session_env_entries) >/run/torchlab/session-env.sh.tmp
    mv /run/torchlab/session-env.sh.tmp /run/torchlab/session-env.sh
}
