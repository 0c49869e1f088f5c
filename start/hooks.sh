# shellcheck shell=bash
# docker-stacks' hook folders: start-notebook.d before the user is set up, before-notebook.d just
# before the command or the services. Sourced hooks run in the start's own shell, so they can
# change its variables.
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
