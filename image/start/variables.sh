# shellcheck shell=bash
# The start-up's variables come from one table, variables.tsv beside this file: each one's default, its
# check, whether it is a secret and whether SSH sessions get it. docs/configuration.md's table is made from the same
# file. Adding a variable touches the table and the code that uses it.
variable_table=${start_dir:?}/variables.tsv

# table_names COLUMN VALUE: the variables whose COLUMN (4: secret, 5: sessions) is VALUE; no COLUMN: all.
table_names() {
    awk -F'\t' -v column="${1:-0}" -v value="${2:-}" '!/^#/ && (column == 0 || $column == value) { print $1 }' \
        "$variable_table"
}

# check_variable NAME CHECK: one ERROR line and exit 2 (die) unless NAME's value passes CHECK; some
# checks normalise the value (yes/no, numbers).
check_variable() {
    local name=$1 value=${!1} word words
    case $2 in
        any | file) ;;  # *_FILE: read_file_var checks the file itself
        name) [[ $value =~ ^[a-z_][a-z0-9_-]{0,31}$ ]] ||
            die "$name='$value': expected a Linux name (lower-case letters, digits, _ or -, at most 32)" ;;
        id) if ! [[ $value =~ ^[0-9]{1,10}$ ]] || ((10#$value > 4294967294)); then
                die "$name='$value': expected a numeric ID such as 1000"
            fi
            printf -v "$name" '%d' "$((10#$value))" ;;
        port) if ! [[ $value =~ ^[0-9]{1,5}$ ]] || ((10#$value < 1 || 10#$value > 65535)); then
                die "$name='$value': expected a TCP port number from 1 to 65535"
            fi
            printf -v "$name" '%d' "$((10#$value))" ;;
        yesno) case $value in
                yes | 1 | true) printf -v "$name" yes ;;
                no | 0 | false) printf -v "$name" no ;;
                *) die "$name='$value': expected yes or no" ;;
            esac ;;
        umask) [[ $value =~ ^0?[0-7]{3}$ ]] ||
            die "$name='$value': expected an octal umask such as 002 (group-writable files) or 022" ;;
        chown-options) read -ra words <<<"$value"
            for word in "${words[@]}"; do
                case $word in
                    -R | --recursive | -h | --no-dereference | -c | --changes | -f | --silent | --quiet | -v | --verbose) ;;
                    *) die "$name='$value': expected chown options from -R, -h, -c, -f and -v" ;;
                esac
            done ;;
        absolute-paths) IFS=, read -ra words <<<"$value"
            for word in "${words[@]}"; do
                [[ $word == /* ]] || die "$name='$value': expected absolute paths separated by commas, such as /opt/data,/srv/cache"
            done ;;
        variable-names) IFS=, read -ra words <<<"$value"
            for word in "${words[@]}"; do
                [[ $word =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] ||
                    die "$name='$value': expected variable names separated by commas, such as HF_TOKEN,WANDB_API_KEY"
                ! protected_variable "$word" ||
                    die "$name names $word, which the start itself needs: expected other variables, not PATH, LD_*, PYTHON* or the image's own (such as NB_USER)"
            done ;;
        token) [[ $value =~ ^[[:graph:]]*$ ]] || die "$name: expected printable characters without spaces" ;;
        url-path) [[ $value =~ ^/[A-Za-z0-9._~%@+/-]*$ ]] ||
            die "$name='$value': expected a URL path such as /notebook/team/alice" ;;
        notebook-or-lab) [[ $value == notebook || $value == lab ]] || die "$name='$value': expected notebook or lab" ;;
        ssh-keys) check_ssh_keys "$name" ;;
        refused) refused_variable "$name" ;;
        *) die "$name: the table names an unknown check '$2'" ;;
    esac
}

# One key per line; ssh-keygen is the judge of what a valid public key is.
check_ssh_keys() {
    local keyfile line line_no=0
    keyfile=$(mktemp)
    while IFS= read -r line; do
        line_no=$((line_no + 1))
        [[ -z ${line//[[:space:]]/} || $line == \#* ]] && continue
        printf '%s\n' "$line" >"$keyfile"
        ssh-keygen -l -f "$keyfile" >/dev/null 2>&1 ||
            die "$1 line $line_no is not an OpenSSH public key: expected one key per line like 'ssh-ed25519 AAAAC3... you@laptop' (the .pub file, not the private key)"
    done <<<"${!1}"
    rm -f "$keyfile"
}

refused_variable() {
    case $1 in
        GEN_CERT) die "GEN_CERT='$GEN_CERT': torchlab serves Jupyter over plain HTTP, behind its token, and makes no certificate; expected TLS from a reverse proxy in front of the container (or SSH port forwarding), and GEN_CERT unset" ;;
        *) die "$1: not offered by this image; expected it unset" ;;
    esac
}

# Every variable of the table: its default where it is unset or empty, then its check where it has a value.
check_variables() {
    local name default check
    # Fields joined by a separator that is no white space, which read would run together when empty.
    while IFS=$'\x1f' read -r name default check; do
        [ "$default" = - ] || [ -n "${!name:-}" ] || printf -v "$name" '%s' "$default"
        [ -z "${!name:-}" ] || check_variable "$name" "$check"
    done < <(awk -F'\t' -v OFS=$'\x1f' '!/^#/ && NF { print $1, $2, $3 }' "$variable_table")
}
