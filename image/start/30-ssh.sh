# shellcheck shell=bash
# shellcheck disable=SC2154  # as_root, vars_to_unset: set by 10-validate.sh
# 3. SSH: per-container host keys and authorized keys (only when sshd will run, that is, with no
# command), and the container's environment for SSH sessions (always).

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
    printf 'Subsystem sftp internal-sftp%s\n' "${NB_UMASK:+ -u $NB_UMASK}" >/run/torchlab/sshd_config.d/sftp.conf

    if [ -n "$SSH_PUBLIC_KEY" ]; then
        printf '%s\n' "$SSH_PUBLIC_KEY" >"/run/torchlab/authorized_keys/$NB_USER"
        chmod 0644 "/run/torchlab/authorized_keys/$NB_USER"
        log "SSH: $(grep -c '^[^#[:space:]]' "/run/torchlab/authorized_keys/$NB_USER") public key(s) for $NB_USER"
    else
        rm -f "/run/torchlab/authorized_keys/$NB_USER"
        "${as_user[@]}" test -s "$HOME_DIR/.ssh/authorized_keys" ||
            log "SSH: no public key given, so nobody can log in yet: run with -e SSH_PUBLIC_KEY=\"\$(cat ~/.ssh/id_ed25519.pub)\", or mount a file as $HOME_DIR/.ssh/authorized_keys"
    fi
fi
unset SSH_PUBLIC_KEY

# sshd gives sessions a fresh environment: hand them the user's (as_user's: every variable the container
# was started with, as RunPod and Vast.ai do, and the user's folders), less the secrets the entrypoint
# consumes, JUPYTER_ENV_VARS_TO_UNSET's names, and what belongs to each process. Login shells read it
# through /etc/profile.d, `ssh host CMD` through /etc/bash.bashrc; root's shells never do.
not_for_sessions=" $(table_names 5 no | tr '\n' ' ')${vars_to_unset[*]}"
not_for_sessions+=" PYTHONNOUSERSITE HOSTNAME HOME PWD OLDPWD SHLVL _ USER LOGNAME SHELL TERM MAIL "
write_session_env() {
    local entry name
    # This process's own environment as Docker gave it (with the secrets already out: hand_off), then
    # what the drop sets; a later line wins.
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
quote_session_env() {
    local entry name value
    while IFS= read -r -d '' entry; do
        name=${entry%%=*} value=${entry#*=}
        [[ -z $name || $not_for_sessions == *" $name "* ]] && continue
        printf "export %s='%s'\n" "$name" "${value//\'/\'\\\'\'}"  # single quotes keep every byte
    done
}
write_session_env | quote_session_env >/run/torchlab/session-env.sh.tmp
mv /run/torchlab/session-env.sh.tmp /run/torchlab/session-env.sh
