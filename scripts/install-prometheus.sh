#!/usr/bin/env bash
# Obtain a real Prometheus server and promtool (Debian bookworm's `prometheus` package, 2.42) for the tests that
# check the alerting rules (`promtool check rules`, `promtool test rules`) and the tier that scrapes a real vLLM,
# and cache them outside the repository.
#
#   scripts/install-prometheus.sh            # prints the directory holding `prometheus` and `promtool` (last line)
#   BIN=$(scripts/install-prometheus.sh)     # ... so a test fixture can capture it
#   scripts/install-prometheus.sh --check    # fetches nothing: prints the directory and exits 0 if there, else 1
#
# Why this way: nothing is installed system-wide and no service is started. `apt-get download` fetches the .deb
# (no root needed, only the machine's apt lists) and `dpkg -x` unpacks it into a private directory; the two Go
# binaries need nothing but libc. The package's web-UI dependencies (bootstrap, jquery, ...) are not needed by the
# tests (they use the HTTP API) and are not fetched.
#
# The cache is ${EAGLE3_PROMETHEUS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/eagle3-operator/prometheus-2.42}:
#   bin/prometheus, bin/promtool and a VERSION stamp. The directory is filled in a temporary sibling and renamed
# into place, so a half-unpacked cache never looks complete; delete it to fetch again. Takes a few seconds.
#
# Optional environment:
#   EAGLE3_PROMETHEUS_CACHE   the cache directory (see above)
set -euo pipefail

MAJOR_MINOR=2.42
CACHE_DIR=${EAGLE3_PROMETHEUS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/eagle3-operator/prometheus-$MAJOR_MINOR}
BIN_DIR=$CACHE_DIR/bin
BINARIES=(prometheus promtool)

SCRIPT_NAME=install-prometheus
# shellcheck source=scripts/machine-cache.sh
source "$(dirname "${BASH_SOURCE[0]}")/machine-cache.sh"

have_binaries() {
    local b
    for b in "${BINARIES[@]}"; do
        [[ -x $BIN_DIR/$b ]] || return 1
    done
    [[ -f $CACHE_DIR/VERSION ]]
}

# --- 1. There already? Then there is nothing to do. ----------------------------------------------------------------
case ${1:-} in
"" | --check) ;;
*) die "unknown argument '$1' (usage: scripts/install-prometheus.sh [--check])" ;;
esac
if have_binaries; then
    echo "$BIN_DIR"
    exit 0
fi
if [[ ${1:-} == --check ]]; then
    log "not installed: no prometheus and promtool in $BIN_DIR (run scripts/install-prometheus.sh)"
    exit 1
fi
command -v apt-get >/dev/null && command -v dpkg >/dev/null ||
    die "this script needs a Debian machine with apt-get and dpkg (it unpacks Debian's prometheus package);" \
        "provide prometheus and promtool $MAJOR_MINOR some other way and put them in $BIN_DIR (with a VERSION file)"

# --- 2. One fetch at a time (two test sessions may start it together). ---------------------------------------------
hold_lock "$CACHE_DIR.lock"
if have_binaries; then # the other install finished meanwhile
    echo "$BIN_DIR"
    exit 0
fi

# --- 3. Download and unpack into a temporary sibling of the cache. ------------------------------------------------
make_work_dir "$CACHE_DIR"
mkdir -p "$WORK/deb"
# As root apt would download as the unprivileged _apt user, which cannot reach a cache under /root: download as root.
APT_OPTS=()
[[ $(id -u) -ne 0 ]] || APT_OPTS=(-o APT::Sandbox::User=root)
log "downloading Debian's prometheus package"
(cd "$WORK/deb" && apt-get -qq "${APT_OPTS[@]}" download prometheus >&2) ||
    die "\`apt-get download prometheus\` failed: this machine's apt lists may be missing or stale (run" \
        "\`apt-get update\` as root) or have no bookworm main source"
DEB=$(find "$WORK/deb" -maxdepth 1 -name 'prometheus_*.deb' | head -n1)
[[ -n $DEB ]] || die "apt-get download prometheus produced no .deb in $WORK/deb"
DEB_VERSION=$(dpkg-deb -f "$DEB" Version)
[[ $DEB_VERSION == "$MAJOR_MINOR".* ]] ||
    die "expected prometheus $MAJOR_MINOR.x from apt (Debian bookworm), got $DEB_VERSION (the cache is for $MAJOR_MINOR)"
dpkg -x "$DEB" "$WORK/root"

mkdir -p "$WORK/cache/bin"
for b in "${BINARIES[@]}"; do
    install -m 0755 "$WORK/root/usr/bin/$b" "$WORK/cache/bin/$b"
done

# --- 4. Smoke check: both binaries run and report the expected version. -------------------------------------------
for b in "${BINARIES[@]}"; do
    reported=$("$WORK/cache/bin/$b" --version 2>&1 | head -n1) || die "\`$b --version\` failed: $reported"
    [[ $reported == "$b, version $MAJOR_MINOR."* ]] || die "\`$b --version\` printed '$reported'"
done

cat >"$WORK/cache/VERSION" <<EOF
prometheus $DEB_VERSION (Debian package, unpacked with dpkg -x; binaries only)
$("$WORK/cache/bin/promtool" --version 2>&1 | head -n1)
installed on $(date -u +%Y-%m-%dT%H:%M:%SZ)
EOF

# --- 5. Into place by rename (an incomplete leftover cache directory is replaced). --------------------------------
move_into_place "$WORK/cache" "$CACHE_DIR"
log "prometheus and promtool $DEB_VERSION are in $BIN_DIR"
echo "$BIN_DIR"
