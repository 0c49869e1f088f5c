# shellcheck shell=bash
# docker-stacks' hook folders: start-notebook.d before the user is set up, before-notebook.d just
# before the command or the services. Sourced hooks run in the start's own shell, so they can
# change its variables. As in docker-stacks, a hook that fails is logged and the start goes on; a
# sourced hook runs without the start's errexit and nounset (one that sets -e itself and fails ends
# the start).
run_hooks() {  # DIR: *.sh files are sourced, other executables run; in name order
    local f status
    for f in "$1"/*; do
        [ -f "$f" ] || continue
        status=0
        case "$f" in
            *.sh) log "hook: sourcing $f"
                set +eu
                # shellcheck disable=SC1090
                source "$f"
                status=$?
                set -eu ;;
            *) if [ -x "$f" ]; then log "hook: running $f"; "$f" || status=$?; else log "hook: ignoring $f (not executable)"; fi ;;
        esac
        [ "$status" -eq 0 ] || warn "hook: $f has failed, continuing execution (status $status)"
    done
}
