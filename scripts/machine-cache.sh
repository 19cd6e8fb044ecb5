# Sourced by the scripts that fetch or build a tool once per machine into a cache outside the repository
# (build-kube.sh, build-vllm-cpu.sh, install-helm.sh, install-prometheus.sh, build-images.sh,
# build-base-image.sh): their messages, one install at a time, a cache directory that appears whole, and this
# machine's Debian mirror. Set SCRIPT_NAME before sourcing it.
#
#   log MESSAGE...             to stderr, as "[SCRIPT_NAME] MESSAGE" (stdout is the script's answer: a path)
#   die MESSAGE...             the same as an ERROR, then exit 1
#   hold_lock FILE             hold FILE (a flock on fd 9) until the script exits; if another install holds it,
#                              say so and wait for it (two test sessions may start the same install together)
#   make_work_dir CACHE_DIR    WORK: a new temporary sibling of CACHE_DIR, removed when the script exits
#   move_into_place SRC DIR    replace DIR (an incomplete leftover included) with SRC by one rename, so a
#                              half-filled cache never looks complete
#   find_mirror                the URIs of this machine's Debian mirrors, one a line, best first: the enabled
#                              non-security `deb` sources of its apt configuration (so no mirror host name is
#                              written into a script); take the first with `find_mirror | head -n1`

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

# deb822 sources (*.sources) first, then one-line ones (sources.list, *.list). Only the URI is printed.
find_mirror() {
    local f
    for f in /etc/apt/sources.list.d/*.sources; do
        [[ -r $f ]] || continue
        # A stanza is a block of "Field: value" lines; keep the URIs of enabled `deb` stanzas whose suites are
        # not security ones.
        awk '
            function flush() {
                if (types ~ /(^| )deb( |$)/ && enabled !~ /^(no|false)$/ && suites !~ /-security/ && uris != "") {
                    n = split(uris, u, " "); for (i = 1; i <= n; i++) if (u[i] !~ /security/) print u[i]
                }
                types = ""; uris = ""; suites = ""; enabled = ""
            }
            /^[ \t]*#/ { next }
            /^[ \t]*$/ { flush(); next }
            { line = $0; sub(/^[^:]*:[ \t]*/, "", line) }
            tolower($1) == "types:"   { types = line }
            tolower($1) == "uris:"    { uris = line }
            tolower($1) == "suites:"  { suites = line }
            tolower($1) == "enabled:" { enabled = tolower(line) }
            END { flush() }
        ' "$f"
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [[ -r $f ]] || continue
        # deb [options] URI suite components...
        sed -e 's/#.*//' -e 's/\[[^]]*\]//' "$f" | awk '$1 == "deb" && $3 !~ /-security/ && $2 !~ /security/ { print $2 }'
    done
}
