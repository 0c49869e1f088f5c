# shellcheck shell=bash
# The start's messages, in docker-stacks' format: LEVEL[YYYY-MM-DD HH:MM:SS] message, one line each,
# on stderr (stdout belongs to the command, when one is given). JUPYTER_DOCKER_STACKS_QUIET (any
# value) silences INFO; warnings and errors always show.
log_line() { printf '%s[%(%Y-%m-%d %H:%M:%S)T] %s\n' "$1" -1 "$2" >&2; }
log() { [ -n "${JUPYTER_DOCKER_STACKS_QUIET:-}" ] || log_line INFO "$*"; }
# The one INFO line a quiet log keeps: where to log in with a random token, found nowhere else.
log_always() { log_line INFO "$*"; }
warn() { log_line WARNING "$*"; }
# One line, whatever the bad value held: control characters are shown as '?'.
error() {
    local message="$*"
    log_line ERROR "${message//[[:cntrl:]]/?}"
}
# Bad input: the error, then exit 2.
die() {
    error "$@"
    exit 2
}
