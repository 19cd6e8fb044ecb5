# Sourced by the scripts that fetch or build a tool once per machine into a cache outside the repository
# (build-kube.sh, build-vllm-cpu.sh, install-helm.sh, install-prometheus.sh): their messages, one install at a
# time, and a cache directory that appears whole. Set SCRIPT_NAME before sourcing it.
#
#   log MESSAGE...             to stderr, as "[SCRIPT_NAME] MESSAGE" (stdout is the script's answer: a path)
#   die MESSAGE...             the same as an ERROR, then exit 1
#   hold_lock FILE             hold FILE (a flock on fd 9) until the script exits; if another install holds it,
#                              say so and wait for it (two test sessions may start the same install together)
#   make_work_dir CACHE_DIR    WORK: a new temporary sibling of CACHE_DIR, removed when the script exits
#   move_into_place SRC DIR    replace DIR (an incomplete leftover included) with SRC by one rename, so a
#                              half-filled cache never looks complete

log() { printf '[%s] %s\n' "$SCRIPT_NAME" "$*" >&2; }

die() {
    printf '[%s] ERROR: %s\n' "$SCRIPT_NAME" "$*" >&2
    exit 1
}

hold_lock() {
    mkdir -p "$(dirname "$1")"
    exec 9>"$1"
    if ! flock -n 9; then
        log "another install is running (lock $1); waiting for it"
        flock 9
    fi
}

make_work_dir() {
    WORK=$(mktemp -d "$(dirname "$1")/.$(basename "$1").XXXXXX")
    trap 'rm -rf "$WORK"' EXIT
}

move_into_place() {
    rm -rf "$2"
    mv -T "$1" "$2"
}
