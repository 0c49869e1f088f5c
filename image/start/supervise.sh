# shellcheck shell=bash
# The services, sshd and Jupyter, started and supervised here alone. supervise_services never
# returns; it guarantees:
#   - Jupyter that exits by itself (File > Shut Down, a crash) is started again, one INFO line, so SSH
#     sessions and what they run go on; RESTARTABLE=no stops the container instead, and so does a
#     Jupyter that exits more than JUPYTER_RESTARTS times within a minute (one ERROR line).
#   - sshd that ends, or Jupyter that is not restarted: one ERROR line, "sshd|Jupyter exited with status
#     N; stopping the container"; both get SIGTERM and are waited for; the container exits N, or 1 if N was 0.
#   - docker stop (SIGTERM, sent to the whole process group by tini -g; or SIGINT): sshd and Jupyter
#     get SIGTERM and are waited for; then the user's own processes, started over SSH and so out of
#     tini's group (a nohup'd train.py), get SIGTERM, top-level ones only, and are waited for until
#     none is left, so they can checkpoint; exit 0.
#   - No wait has a limit of its own: Docker's stop timeout (docker stop -t) bounds them all, and then
#     SIGKILL ends everything.
# The doctor runs alongside, unsupervised: its report goes to the start log, whatever it finds.
JUPYTER_RESTARTS=5

# The services' sessions need /dev/shm only for DataLoader worker processes: an INFO line where it is
# small. Not a WARNING: Docker's default 64 MB is what a plain `docker run` gets, and docker-stacks'
# contract is that a plain start logs none; the doctor's report flags it too.
log_small_shm() {
    local shm_mb
    shm_mb=$(($(df -Pk /dev/shm | awk 'NR == 2 {print $2}') / 1024))
    ((shm_mb < 1024)) || return 0
    log "/dev/shm is only ${shm_mb} MB: train.py's decode threads need none, but DataLoader worker processes (--loader processes, your own num_workers) die of it with a bus error; for those, run with --shm-size=8g (or --ipc=host)."
}

# What the printed URL and a hub's / open: /lab or /tree, as JUPYTER_UI says.
ui_path() {
    if [ "$JUPYTER_UI" = lab ]; then echo /lab; else echo /tree; fi
}

# The server's base_url, wherever it came from (jupyter_args, the hub's prefix), as /PATH/: the
# healthcheck and the printed URLs follow it.
server_base_url() {
    local i url=/
    for i in "${!jupyter_args[@]}"; do
        case "${jupyter_args[i]}" in
            --ServerApp.base_url=* | --NotebookApp.base_url=*) url=${jupyter_args[i]#*=} ;;
            --ServerApp.base_url | --NotebookApp.base_url) url=${jupyter_args[i + 1]:-/} ;;
        esac
    done
    ! spawned_by_hub || url=${JUPYTERHUB_SERVICE_PREFIX:-/}
    url=/${url#/}
    echo "${url%/}/"
}

# From here the healthcheck expects the services (until they answer, unhealthy): /run/torchlab/services
# holds the URL it asks, Jupyter's /api under the base_url (at the hub's port under a hub), and sshd's port.
expect_services() {
    local scheme=http port=$JUPYTER_PORT
    ! spawned_by_hub || read -r scheme port < <(hub_scheme_and_port)
    printf '%s\n' "$scheme://127.0.0.1:$port$(server_base_url)api" "$SSH_PORT" >/run/torchlab/services
}

# A root start's sshd runs in the root phase's environment, which holds no secret; a user's sshd serves
# that one account (OpenSSH's non-privileged mode) in the user's environment (nss_wrapper's entry
# included); its key files live in /run/torchlab, which is the user's: StrictModes off. Reads as_user;
# sets sshd_pid.
start_sshd() {
    local command=(/usr/sbin/sshd -D -e -o "Port=$SSH_PORT" -o PidFile=none)
    root_start || command=("${as_user[@]}" "${command[@]}" -o StrictModes=no)
    "${command[@]}" &
    sshd_pid=$!
}

# Notebook 7 and JupyterLab are one server either way (/tree and /lab); JUPYTER_UI picks what / opens.
# Under a hub, the hub's URL (ip, port, prefix) and auth win over jupyter_server_config.py; the
# hub admin's c.Spawner.default_url wins over JUPYTER_UI. The server is the image's, by its path, and its
# Python skips the user site (-s, which its kernels and terminals do not inherit): a `jupyter` or .pth file
# the user planted cannot stop it from starting, while notebooks import what the user installed. Reads
# as_user, jupyter_auth and jupyter_args; sets jupyter_pid.
start_jupyter() {
    local program options=() shown
    if spawned_by_hub; then
        program=jupyterhub-singleuser
        [ -n "${JUPYTERHUB_DEFAULT_URL:-}" ] || options+=(--ServerApp.default_url="$(ui_path)")
    else
        program=jupyter-$JUPYTER_UI
        options+=(--ServerApp.port="$JUPYTER_PORT")
    fi
    shown=("${program/#jupyter-/jupyter }" "${options[@]}")
    log "Executing: ${shown[*]}"  # as docker-stacks' start-notebook.py says it; the options given are left out
    "${as_user[@]}" "${jupyter_auth[@]}" /opt/env/bin/python -s "/opt/env/bin/$program" "${options[@]}" "${jupyter_args[@]}" &
    jupyter_pid=$!
}

# The doctor's report in the start log; in the background, as importing torch and counting a
# large /data take a while. It imports none of the user's packages (no user site), and names those that shadow
# the image's from their metadata. Reads as_user_system.
start_doctor() {
    [ "$DOCTOR_AT_START" = yes ] || return 0
    "${as_user_system[@]}" /opt/env/bin/torchlab doctor 2>&1 | while IFS= read -r line; do log "doctor: ${line#doctor: }"; done &
}

# The start log's last lines: how to log in. Reads token_generated (a random token is shown).
log_how_to_connect() {
    local base_url ui
    base_url=$(server_base_url) ui=$(ui_path)
    log "SSH:     ssh -p $SSH_PORT $NB_USER@<host>"
    if spawned_by_hub; then
        log "JupyterHub: JUPYTERHUB_API_TOKEN is set, so jupyterhub-singleuser serves $JUPYTERHUB_SERVICE_URL in place of the standalone server, with the hub's login"
    elif [ "$token_generated" = yes ]; then
        log_always "Jupyter: http://127.0.0.1:$JUPYTER_PORT${base_url%/}$ui?token=$JUPYTER_TOKEN"
        log_always "TensorBoard: http://127.0.0.1:$JUPYTER_PORT${base_url}tensorboard/?token=$JUPYTER_TOKEN"
    elif [ "$JUPYTER_NO_AUTH" = yes ]; then
        log "Jupyter: http://127.0.0.1:$JUPYTER_PORT${base_url%/}$ui (no login: JUPYTER_NO_AUTH=yes)"
    else
        log "Jupyter: http://127.0.0.1:$JUPYTER_PORT${base_url%/}$ui (log in with your JUPYTER_TOKEN or JUPYTER_PASSWORD)"
    fi
}

# The user's processes are those of NB_UID other than tini and this script's own (and their
# children's); with "top", only those whose parent is not among them: their children, such as
# DataLoader workers, are theirs to stop.
users_processes() {  # top | all
    ps -e -o pid=,ppid=,uid= | awk -v uid="$NB_UID" -v me=$$ -v which="$1" '
        { owner[$1] = $3; parent[$1] = $2 }
        function ours(pid) { while (pid > 1) { if (pid == me) return 1; pid = parent[pid] } return 0 }
        END {
            for (pid in owner) user[pid] = owner[pid] == uid && pid != 1 && !ours(pid)
            for (pid in user) if (user[pid] && (which == "all" || !user[parent[pid]])) print pid
        }'
}

# SIGTERM to the user's top-level processes, then wait until none of theirs is left.
stop_users_processes() {
    local top_level
    top_level=$(users_processes top)
    [ -n "$top_level" ] || return 0
    log "stopping: sent SIGTERM to $NB_USER's processes; waiting for them to exit"
    # shellcheck disable=SC2086  # one PID per word
    kill -TERM $top_level 2>/dev/null || true
    while [ -n "$(users_processes all)" ]; do sleep 0.2; done
}

# True when Jupyter, which just exited, is to be started again: RESTARTABLE, and no more than
# JUPYTER_RESTARTS exits within a minute.
jupyter_restarts=()
restart_jupyter() {
    local now=$SECONDS recent=() at
    [ "$RESTARTABLE" = yes ] || return 1
    for at in "${jupyter_restarts[@]}"; do ((now - at >= 60)) || recent+=("$at"); done
    jupyter_restarts=("${recent[@]}" "$now")
    ((${#jupyter_restarts[@]} <= JUPYTER_RESTARTS))
}

# sshd, Jupyter and the doctor, supervised as the top of this file says; never returns.
supervise_services() {
    local status ended name
    cd "$work_dir" || exit
    start_sshd
    start_jupyter
    start_doctor
    log_how_to_connect
    stopping=no
    trap 'stopping=yes' TERM INT
    while true; do
        status=0
        wait -n -p ended "$sshd_pid" "$jupyter_pid" || status=$?
        [ "$stopping" = no ] || break
        name=$([ "${ended:-}" = "$sshd_pid" ] && echo sshd || echo Jupyter)
        if [ "$name" = Jupyter ] && restart_jupyter; then
            log "Jupyter exited with status $status; starting it again (SSH sessions go on; RESTARTABLE=no stops the container instead)"
            start_jupyter
            continue
        fi
        if [ "$name" = Jupyter ] && [ "$RESTARTABLE" = yes ]; then
            error "Jupyter exited ${#jupyter_restarts[@]} times within a minute, the last with status $status; stopping the container"
        else
            error "$name exited with status $status; stopping the container"
        fi
        [ "$status" != 0 ] || status=1
        kill -TERM "$sshd_pid" "$jupyter_pid" 2>/dev/null || true
        wait "$sshd_pid" "$jupyter_pid" 2>/dev/null || true
        exit "$status"
    done
    kill -TERM "$sshd_pid" "$jupyter_pid" 2>/dev/null || true
    wait "$sshd_pid" "$jupyter_pid" 2>/dev/null || true
    stop_users_processes
    exit 0
}
