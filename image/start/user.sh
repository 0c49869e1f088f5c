# shellcheck shell=bash
# The user: as root, its name, group, UID/GID (adopting /workspace's owner), sudo, home and chowns; as a
# user, a passwd entry for the UID and one line for each thing that needs root. Then the one privilege
# drop (as_user), and what the image brings for the user.

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
# (and passes the tests), without entering a mount point below PATH or following a link (find -P).
chown_tree() {
    local owner=$1 path=$2 point options=() prune=()
    shift 2
    while [ $# -gt 0 ] && [ "$1" != -- ]; do options+=("$1") && shift; done
    [ $# -eq 0 ] || shift
    while IFS= read -r point; do
        [ "$point" = "$path" ] && continue
        point=${point//\\/\\\\} point=${point//\*/\\*} point=${point//\?/\\?} point=${point//\[/\\[}
        prune+=(-path "$point" -prune -o)
    done < <(mounts_under "$path")
    find -P "$path" "${prune[@]}" "$@" -exec chown --no-dereference "${options[@]}" "$owner" {} +
}
# chown_named VARIABLE OPTIONS OWNER PATH: chown as asked for by name; -R stops at mount points below
# PATH. A PATH that is, or passes through, a link is refused: the user may have made it.
chown_named() {
    local words options=() recursive=no word
    read -ra words <<<"$2"
    for word in "${words[@]}"; do
        case $word in -R | --recursive) recursive=yes ;; *) options+=("$word") ;; esac
    done
    no_link_in_path "$1" "$4"
    [ -e "$4" ] || die "$1: $4 does not exist; expected existing paths"
    if [ "$recursive" = yes ]; then
        chown_tree "$3" "$4" "${options[@]}"
    else
        chown --no-dereference "${options[@]}" "$3" "$4"
    fi
}

# As a user (docker run --user, runAsNonRoot, OpenShift's arbitrary UIDs): sshd, ssh-keygen, git and
# pip need a passwd entry for the UID. /etc/passwd stays read-only (a writable one would let a user name
# itself root to sudo): the entry comes from nss_wrapper, preloaded for the user's processes alone and
# ignored by setuid programs, with a copy of passwd and group in /run/torchlab/nss. Reads NB_USER; exports
# the preload and adds it to user_env.
add_passwd_entry() {
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

# A system group's members read what it guards (shadow: /etc/shadow): the user's group is new, users
# (100), or one of GID 1000 and up.
system_group() {  # GID
    ((10#$1 < 1000 && 10#$1 != 100)) && getent group "$1" >/dev/null
}

# Sets NB_UID and NB_GID: as given; else, in a root start, those of a /workspace owned by a non-root user
# (files written there should belong to the person on the host), and NB_GROUP's GID; else 1000 and 100.
choose_ids() {
    local ws_uid ws_gid uid_owner
    if root_start && [ -z "${NB_UID:-}" ] && [ -d /workspace ]; then
        ws_uid=$(stat -c %u /workspace) ws_gid=$(stat -c %g /workspace)
        if [ "$ws_uid" != 0 ] && [ "$ws_uid" != 1000 ]; then
            NB_UID=$ws_uid
            if [ -z "${NB_GID:-}" ] && system_group "$ws_gid"; then
                warn "/workspace's GID $ws_gid is the image's system group $(getent group "$ws_gid" | cut -d: -f1): running with GID 100 (users) instead (set NB_GID to choose)"
                ws_gid=100
            fi
            NB_GID=${NB_GID:-$ws_gid}
            log "/workspace belongs to UID $ws_uid (GID $ws_gid): running as UID $NB_UID GID $NB_GID (set NB_UID to choose)"
        fi
    fi
    if [ -n "${NB_GROUP:-}" ] && [ -z "${NB_GID:-}" ] && getent group "$NB_GROUP" >/dev/null; then
        NB_GID=$(getent group "$NB_GROUP" | cut -d: -f3)
    fi
    NB_UID=${NB_UID:-1000}
    NB_GID=${NB_GID:-100}
    # NB_GROUP names a new group, or one of the user's kind: never takes over (or renames) a system group.
    if root_start && [ -n "${NB_GROUP:-}" ] && system_group "$NB_GID"; then
        die "NB_GROUP=$NB_GROUP: GID $NB_GID is the image's system group $(getent group "$NB_GID" | cut -d: -f1); expected a new group name, users (100), or a group of GID 1000 and up"
    fi
    uid_owner=$(getent passwd "$NB_UID" | cut -d: -f1 || true)
    case "$uid_owner" in
        "" | jovyan | "$NB_USER") ;;
        *) root_start || return 0
            die "NB_UID=$NB_UID belongs to the image's account '$uid_owner': expected a UID of no other account, such as 1000" ;;
    esac
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

# As root: the image's account jovyan (1000:100) gets NB_USER's name and home, NB_GROUP's group.
rename_account() {
    local old_home
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
}

# As root: the account gets NB_UID and NB_GID, and the image's files in its home HOME follow them.
# Not usermod --uid: it chowns the home's files itself, through any mount below it. What is mounted
# keeps its owners.
renumber_account() {  # HOME
    local old_uid groups=()
    old_uid=$(id -u "$NB_USER")
    [ "$old_uid" != "$NB_UID" ] || [ "$(id -g "$NB_USER")" != "$NB_GID" ] || return 0
    [ "$NB_GID" = 100 ] || groups=(--groups users)
    userdel "$NB_USER" 2>/dev/null  # it warns that a group named after the user stays: it should
    useradd --no-create-home --no-log-init --non-unique --home-dir "$1" --shell /bin/bash \
        --uid "$NB_UID" --gid "$NB_GID" "${groups[@]}" --password '*' "$NB_USER"
    if mountpoint -q "$1"; then
        log "the home $1 is a mount: its files keep their owners (CHOWN_HOME=yes chowns it)"
    else
        chown_tree "$NB_UID:$NB_GID" "$1" -- -user "$old_uid"
    fi
}

# As root: CHOWN_HOME's and CHOWN_EXTRA's chowns, GRANT_SUDO's rule, and /workspace for the user.
# Sets home_dir.
set_up_account() {
    local path paths ws_uid
    rename_account
    home_dir=$(getent passwd "$NB_USER" | cut -d: -f6)
    renumber_account "$home_dir"
    [ "$CHOWN_HOME" = no ] || chown_named CHOWN_HOME "$CHOWN_HOME_OPTS" "$NB_UID:$NB_GID" "$home_dir"
    IFS=, read -ra paths <<<"$CHOWN_EXTRA"
    for path in "${paths[@]}"; do
        chown_named CHOWN_EXTRA "$CHOWN_EXTRA_OPTS" "$NB_UID:$NB_GID" "$path"
    done
    # The image's sudoers has no rule (Debian's root and %sudo lines are gone): GRANT_SUDO's is the only
    # one, and it names the UID, which no passwd entry can claim.
    if [ "$GRANT_SUDO" = yes ]; then
        printf '#%s ALL=(ALL) NOPASSWD:ALL\n' "$NB_UID" >/etc/sudoers.d/torchlab
        chmod 0440 /etc/sudoers.d/torchlab
        log "GRANT_SUDO: $NB_USER may use sudo without a password"
    else
        rm -f /etc/sudoers.d/torchlab
    fi
    # A /workspace that Docker made for a bind mount is root's and empty; the image's own is
    # jovyan's (1000). Either way it becomes the user's; a mounted folder of someone else's is left.
    [ -d /workspace ] || return 0
    ws_uid=$(stat -c %u /workspace)
    if { [ "$ws_uid" = 0 ] && [ -z "$(ls -A /workspace)" ]; } || { [ "$ws_uid" = 1000 ] && ! mountpoint -q /workspace; }; then
        chown --no-dereference "$NB_UID:$NB_GID" /workspace
    fi
}

# As a user: what only root can do is skipped, one line each. GIVEN_UID and GIVEN_GID are NB_UID and
# NB_GID as the operator gave them (empty: not given). Sets NB_USER, NB_UID and NB_GID to the running
# process's, and home_dir.
skip_what_needs_root() {  # GIVEN_UID GIVEN_GID
    local uid gid name
    uid=$(id -u) gid=$(id -g) name=$(id -un 2>/dev/null || echo "$NB_USER")
    [ "$name" = "$NB_USER" ] || warn "NB_USER=$NB_USER: skipped, UID $uid is already $name and renaming needs a root start (drop --user)"
    if [ "${1:-$uid}" != "$uid" ] || [ "${2:-$gid}" != "$gid" ]; then
        warn "NB_UID/NB_GID: skipped, the container runs as $uid:$gid and changing IDs needs a root start; give them to --user instead"
    fi
    [ -z "${NB_GROUP:-}" ] || warn "NB_GROUP: skipped, naming groups needs a root start (drop --user)"
    [ "$GRANT_SUDO" = no ] || warn "GRANT_SUDO: skipped, the container started as UID $uid, not root; sudo needs a root start (drop --user)"
    if [ "$CHOWN_HOME" = yes ] || [ -n "$CHOWN_EXTRA" ]; then
        warn "CHOWN_HOME/CHOWN_EXTRA: skipped, chown needs a root start; give the files to UID $uid on the host instead"
    fi
    NB_USER=$name NB_UID=$uid NB_GID=$gid
    home_dir=$(getent passwd "$uid" | cut -d: -f6 || true)
    home_dir=${home_dir:-/home/jovyan}
    # A /workspace the UID cannot even enter is choose_work_dir's to tell.
    if [ ! -w "$home_dir" ] && [ ! -w /workspace ] && [ -x /workspace ]; then
        warn "UID $uid can write neither its home $home_dir nor /workspace, so notebooks, runs and pip --user cannot be saved: add the group users (--group-add=users), mount a folder it owns at /workspace (-v \"\$PWD/work\":/workspace), or start as the image's user (--user 1000:100)"
    fi
}

# Sets work_dir, where the user's notebooks, runs and installs go: /workspace, or the home where the home is a
# volume (not a tmpfs) and /workspace is not, as where Kubeflow Notebooks and Open Data Hub mount their PVC at
# /home/jovyan. Root side: it asks the kernel about two mount points and reads nothing of the user's.
# Reads home_dir.
choose_work_dir() {
    work_dir=/workspace
    if mountpoint -q "$home_dir" && ! mountpoint -q /workspace && [ "$(findmnt -rno FSTYPE --mountpoint "$home_dir")" != tmpfs ]; then
        work_dir=$home_dir
        log "the home $home_dir is a volume and /workspace is not (Kubeflow's layout): notebooks, runs and installs go to $home_dir"
    fi
    usable_by_user "$work_dir" || fall_back_from_work_dir
}

# usable_by_user DIR [w]: NB_USER can list and enter DIR, and with w write it (root asks as the user: its own
# test passes anything).
usable_by_user() {
    local tests=(-d "$1" -a -r "$1" -a -x "$1")
    [ -z "${2:-}" ] || tests+=(-a -w "$1")
    if root_start; then
        setpriv --reuid="$NB_UID" --regid="$NB_GID" --init-groups test "${tests[@]}"
    else
        test "${tests[@]}"
    fi
}

# A work_dir the user cannot enter (their own `chmod 000 /workspace`, a mount of another UID's) stops nothing:
# this start works in the home, or in /tmp, and one WARNING says what to fix. Root only stats the folder.
fall_back_from_work_dir() {
    local unusable=$work_dir found owner fix
    found=$(stat -c '%A, owner %u:%g' "$unusable" 2>/dev/null || echo missing)
    owner=$(stat -c %u "$unusable" 2>/dev/null || true)
    for work_dir in "$home_dir" /tmp; do usable_by_user "$work_dir" w && break; done
    if [ "$owner" = "$NB_UID" ]; then
        fix="give it back to yourself with chmod u+rwx $unusable (over SSH, or docker exec -u $NB_UID CONTAINER chmod u+rwx $unusable) and restart"
    else
        fix="give it to UID $NB_UID on the host (chown or chmod), or mount a folder that UID owns there, and restart"
    fi
    warn "$unusable ($found) cannot be entered by UID $NB_UID: notebooks, runs and installs go to $work_dir for this start; $fix"
}

# The one privilege drop. Sets as_user, the prefix that runs a command as NB_USER in the user's
# environment: the container's, with user_env (what the root phase left out, and the user's folders in
# work_dir) back in, less JUPYTER_ENV_VARS_TO_UNSET's names; HOME is home_dir. And as_user_system, the same
# with the system's PATH and no user site, for the image's own steps: a program the user left on their
# PATH (or a .pth file) never runs, and so never hangs, before the services are up.
make_as_user() {
    local name names user_base=$work_dir/.local
    # The user's own commands come after the image's and the system's: they add commands, and never stand in for
    # one that Jupyter or a tool runs by name (a `git` or `uname` the user left there runs for nobody but them).
    # Jupyter's runtime files (the server's token, kernels' keys) stay off the volume, as Kubeflow's images do,
    # in a folder the start makes anew (make_runtime_dir).
    user_env+=("PATH=$given_path:$user_base/bin" "PYTHONUSERBASE=$user_base" "CONDA_ENVS_PATH=${CONDA_ENVS_PATH:-$work_dir/.conda/envs}"
        "JUPYTER_PATH=${JUPYTER_PATH:-$user_base/share/jupyter}" "JUPYTER_RUNTIME_DIR=${JUPYTER_RUNTIME_DIR:-$RUNTIME_DIR}"
        "TORCHLAB_RUNS=${TORCHLAB_RUNS:-$work_dir/runs}" "TORCHLAB_WORK_DIR=$work_dir")
    # Where live training runs leave their records for Jupyter's idle-culler activity (torchlab/activity.py).
    [ "$TRAINING_IS_ACTIVITY" = no ] || user_env+=("TORCHLAB_ACTIVITY_DIR=$RUNTIME_DIR/activity")
    as_user=(env -u PYTHONNOUSERSITE)
    IFS=, read -ra names <<<"$JUPYTER_ENV_VARS_TO_UNSET"
    for name in "${names[@]}"; do as_user+=(-u "$name"); done
    as_user+=("${user_env[@]}" HOME="$home_dir" USER="$NB_USER" LOGNAME="$NB_USER" SHELL=/bin/bash)
    ! root_start || as_user=(setpriv --reuid="$NB_UID" --regid="$NB_GID" --init-groups "${as_user[@]}")
    as_user_system=("${as_user[@]}" PATH="$ROOT_PATH" PYTHONNOUSERSITE=1)
}

# What the image brings for the user, added as the user (as_user_system) and only where nothing is: a
# user's files are never overwritten. The notebooks go to work_dir (Jupyter's root); `python train.py`
# works in the SSH login directory (home_dir); ~/.local is the user site in work_dir, so that a process
# that gets no PYTHONUSERBASE (`docker exec -u USER`) installs and imports there too.
# shellcheck disable=SC2016  # $1 and $2 are the inner shells'
offer_image_files() {
    local point top
    if ! "${as_user_system[@]}" /bin/sh -c '[ ! -d "$1" ] || [ -e "$1/notebooks" ] || cp -r /opt/torchlab/notebooks "$1/notebooks"' \
        - "$work_dir" 2>/dev/null; then
        # A user start that can write nowhere has been told so already.
        if root_start || [ -w "$home_dir" ] || [ -w "$work_dir" ]; then
            warn "could not copy the notebooks into $work_dir (is it writable by UID $NB_UID?)"
        fi
    fi
    # docker-stacks' users mount their files below the home (-v "$PWD":/home/jovyan/work): where Jupyter's root
    # is /workspace, each folder below the home that holds a mount is linked there (as the user, only where
    # /workspace has nothing of that name): nothing in the mount is copied, moved or chowned.
    while IFS= read -r point; do
        [ "$point" != "$home_dir" ] || continue
        top=${point#"$home_dir"/} && top=${top%%/*}
        "${as_user_system[@]}" /bin/sh -c '[ ! -d /workspace ] || [ -e "/workspace/$1" ] || [ -L "/workspace/$1" ] || ln -s "$2" "/workspace/$1"' \
            - "$top" "$home_dir/$top" 2>/dev/null || true
    done < <([ "$work_dir" = "$home_dir" ] || mounts_under "$home_dir" | sort -u)
    "${as_user_system[@]}" /bin/sh -c '[ -e "$1" ] || [ -L "$1" ] || ln -s /opt/torchlab/train.py "$1"' - "$home_dir/train.py" 2>/dev/null || true
    [ "$work_dir" = "$home_dir" ] || "${as_user_system[@]}" /bin/sh -c \
        '[ -e "$1" ] || [ -L "$1" ] || { mkdir -p "$2" && ln -s "$2" "$1"; }' - "$home_dir/.local" "$work_dir/.local" 2>/dev/null || true
}
