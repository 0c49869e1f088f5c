# shellcheck shell=bash
# The start's messages. They go to stderr: stdout belongs to the command, when one is given.
log() { printf 'torchlab: %s\n' "$*" >&2; }
# One line, whatever the bad value held: control characters are shown as '?'. Exit 2: bad input.
die() {
    local message="$*"
    printf 'torchlab: error: %s\n' "${message//[[:cntrl:]]/?}" >&2
    exit 2
}
