#!/usr/bin/env bash
# Build Kubernetes 1.20's kube-apiserver, kube-controller-manager, kube-scheduler, kubelet and kube-proxy from
# Debian bookworm's `kubernetes` source package, and cache them outside the repository: the API-server tier runs
# the first two, the real-node tier (scripts/node.sh, tests/cluster) all five.
#
#   scripts/build-kube.sh            # prints the directory holding the binaries (the last line of stdout)
#   BIN=$(scripts/build-kube.sh)     # ... so a test fixture can capture it
#
# Why this way: no package ships kube-apiserver and there is no container engine here, but Debian's `kubernetes`
# source package vendors every Go dependency, so it builds offline (GOPATH mode, GOPROXY=off) with Debian's golang-go.
# etcd comes from Debian's `etcd-server` package (/usr/bin/etcd), which this script installs too.
#
# The cache is ${EAGLE3_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/eagle3-operator/kube-1.20}:
#   bin/{kube-apiserver,kube-controller-manager,kube-scheduler,kubelet,kube-proxy} and a VERSION stamp.
# When all five binaries are there the script prints the path and exits at once; delete the directory to rebuild.
# A build of the five takes 6 to 20 minutes on 2 cores (5 min 54 s measured on a 2-core Debian bookworm VM) and
# needs a few GB of free space in ${TMPDIR:-/tmp}; the temporary build directory is removed afterwards.
#
# Optional environment:
#   EAGLE3_KUBE_CACHE        the cache directory (see above)
#   EAGLE3_KUBE_MIRROR       the Debian mirror URI to fetch the source from (default: read from the system's apt sources)
#   EAGLE3_KUBE_SUITE        the Debian suite to take the source package from (default: bookworm)
#   EAGLE3_KUBE_KEEP_BUILD=1 keep the temporary build directory (for debugging a failed build)
set -euo pipefail

CACHE_DIR=${EAGLE3_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/eagle3-operator/kube-1.20}
BIN_DIR=$CACHE_DIR/bin
SUITE=${EAGLE3_KUBE_SUITE:-bookworm}
BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy)

SCRIPT_NAME=build-kube
# shellcheck source=scripts/machine-cache.sh
source "$(dirname "${BASH_SOURCE[0]}")/machine-cache.sh"

have_binaries() {
    local b
    for b in "${BINARIES[@]}"; do
        [[ -x $BIN_DIR/$b ]] || return 1
    done
}

# --- 1. Cached already? Then there is nothing to do. ---------------------------------------------------------------
if have_binaries; then
    command -v etcd >/dev/null || log "warning: no etcd on PATH (install Debian's etcd-server)"
    echo "$BIN_DIR"
    exit 0
fi

# --- 2. This only works on a Debian machine with apt. -------------------------------------------------------------
if ! command -v apt-get >/dev/null || ! command -v dpkg >/dev/null || [[ ! -r /etc/os-release ]]; then
    die "this script needs a Debian machine with apt-get and dpkg (it builds Kubernetes from Debian's source package" \
        "and installs golang-go and etcd-server with apt); this machine has no apt-get/dpkg. Provide kube-apiserver and" \
        "kube-controller-manager some other way and put them in $BIN_DIR."
fi
# shellcheck disable=SC1091
OS_ID=$(. /etc/os-release && echo "${ID:-}")
OS_CODENAME=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
if [[ $OS_ID != debian ]]; then
    die "this script needs Debian (found ID=$OS_ID in /etc/os-release): it fetches the source package from a Debian" \
        "mirror taken from this machine's apt sources and builds it with Debian's golang-go."
fi
[[ $OS_CODENAME == "$SUITE" ]] || log "warning: tested on Debian $SUITE only; this is Debian ${OS_CODENAME:-unknown}"

# Installing packages needs root; use sudo when not root.
SUDO=()
if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || die "not root and no sudo: cannot install the build dependencies with apt-get"
    SUDO=(sudo)
fi

# --- 3. One build at a time (two test sessions may start it together). ----------------------------------------------
mkdir -p "$CACHE_DIR"
hold_lock "$CACHE_DIR/.build.lock"
if have_binaries; then # the other build finished meanwhile
    echo "$BIN_DIR"
    exit 0
fi

# --- 4. Build dependencies from the system's apt sources. -----------------------------------------------------------
#   golang-go: the Go toolchain (1.19 on bookworm); etcd-server: etcd for the tests;
#   golang-github-modern-go-reflect2-dev: reflect2 1.0.2, to replace the vendored 1.0.1 (see step 7);
#   dpkg-dev: dpkg-source for `apt-get source`; make, rsync, jq: used by Kubernetes' build scripts (Build-Depends).
PACKAGES=(golang-go etcd-server golang-github-modern-go-reflect2-dev dpkg-dev make rsync jq xz-utils ca-certificates)
log "installing build dependencies: ${PACKAGES[*]}"
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -qq update
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -qq -y install --no-install-recommends "${PACKAGES[@]}" \
    >/dev/null

# --- 5. The Debian mirror: the first non-security `deb` source of this machine. -----------------------------------
# find_mirror (machine-cache.sh): deb822 sources first, then one-line ones. Only the URI is taken; the private
# sources list below adds a deb-src line for "$SUITE main" on it. No mirror host name is written into this script.
MIRROR=${EAGLE3_KUBE_MIRROR:-$(find_mirror | head -n1)}
[[ -n $MIRROR ]] || die "found no Debian mirror in /etc/apt/sources.list{,.d/*}; set EAGLE3_KUBE_MIRROR to one"
MIRROR=${MIRROR%/}
log "taking the kubernetes source package from $MIRROR $SUITE main"

# --- 6. Fetch the source through a private apt configuration (the system's apt state is not touched). -------------
WORK=$(mktemp -d "${TMPDIR:-/tmp}/eagle3-build-kube.XXXXXX")
cleanup() {
    if [[ ${EAGLE3_KUBE_KEEP_BUILD:-0} == 1 ]]; then
        log "keeping the build directory $WORK"
    else
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT
APT_DIR=$WORK/apt
mkdir -p "$APT_DIR/lists/partial" "$APT_DIR/cache/archives/partial" "$WORK/src"
SIGNED_BY=
[[ -r /usr/share/keyrings/debian-archive-keyring.gpg ]] &&
    SIGNED_BY="[signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] "
echo "deb-src ${SIGNED_BY}$MIRROR $SUITE main" >"$APT_DIR/sources.list"
APT_PRIVATE=(
    -o "Dir::Etc::SourceList=$APT_DIR/sources.list"
    -o "Dir::Etc::SourceParts=/dev/null"
    -o "Dir::State::Lists=$APT_DIR/lists"
    -o "Dir::Cache=$APT_DIR/cache"
    -o "Acquire::Languages=none"
)
# As root apt downloads as the unprivileged _apt user, which must be able to write where it downloads.
if [[ $(id -u) -eq 0 ]] && id _apt >/dev/null 2>&1; then
    chmod 755 "$WORK"
    chown -R _apt "$APT_DIR/lists" "$APT_DIR/cache" "$WORK/src"
fi
apt-get -qq "${APT_PRIVATE[@]}" update
(cd "$WORK/src" && apt-get -qq "${APT_PRIVATE[@]}" source --only-source kubernetes >/dev/null)
SRC=$(find "$WORK/src" -mindepth 1 -maxdepth 1 -type d -name 'kubernetes-*' | head -n1)
[[ -n $SRC && -f $SRC/Makefile ]] || die "apt-get source kubernetes did not unpack a source tree under $WORK/src"

# Versions: Debian's (e.g. 1.20.5+really1.20.2-1.1+deb12u1) and the real upstream one (1.20.2).
DEB_VERSION=$(dpkg-parsechangelog -l "$SRC/debian/changelog" -S Version)
UPSTREAM=${DEB_VERSION%-*}
UPSTREAM=${UPSTREAM##*really}
[[ $UPSTREAM == 1.20.* ]] || die "expected Kubernetes 1.20.x from $SUITE, got $DEB_VERSION (the cache is for 1.20)"
log "source: kubernetes $DEB_VERSION (upstream $UPSTREAM) in $SRC"

# --- 7. Replace the vendored reflect2. ----------------------------------------------------------------------------
# modern-go/reflect2 v1.0.1 (vendored) reads Go runtime internals that changed in Go 1.18: built with Debian's Go 1.19
# the server crashes as soon as the first CustomResourceDefinition is created. 1.0.2 (Debian's package) is fixed.
REFLECT2_SRC=/usr/share/gocode/src/github.com/modern-go/reflect2
REFLECT2_DST=$SRC/vendor/github.com/modern-go/reflect2
[[ -d $REFLECT2_SRC && -d $REFLECT2_DST ]] || die "missing $REFLECT2_SRC or $REFLECT2_DST"
rm -rf "$REFLECT2_DST"
mkdir -p "$REFLECT2_DST"
find "$REFLECT2_SRC" -maxdepth 1 -type f -name '*.go' ! -name '*_test.go' -exec cp {} "$REFLECT2_DST/" \;
cp "$REFLECT2_SRC"/LICENSE "$REFLECT2_DST/" 2>/dev/null || true
log "vendored github.com/modern-go/reflect2 replaced by Debian's $(dpkg-query -W -f='${Version}' \
    golang-github-modern-go-reflect2-dev)"

# --- 8. Build. ----------------------------------------------------------------------------------------------------
# Kubernetes' own build scripts run Go in GOPATH mode (GO111MODULE=off, in hack/lib/init.sh) on the vendor tree;
# GOPROXY=off makes sure nothing is fetched. CGO_ENABLED=0 as in debian/rules: static binaries. The version file
# stamps `kube-apiserver --version` and /version with the real upstream version.
cat >"$WORK/version.env" <<EOF
KUBE_GIT_VERSION='v$UPSTREAM'
KUBE_GIT_MAJOR='${UPSTREAM%%.*}'
KUBE_GIT_MINOR='$(echo "$UPSTREAM" | cut -d. -f2)'
KUBE_GIT_COMMIT='debian-$DEB_VERSION'
KUBE_GIT_TREE_STATE='clean'
EOF
GO_VERSION=$(go version)
log "building ${BINARIES[*]} with $GO_VERSION (6 to 20 minutes on 2 cores)"
start=$SECONDS
(
    cd "$SRC"
    unset GOFLAGS GOPATH GOROOT GOBIN
    env HOME="$WORK/home" GOPROXY=off GOSUMDB=off GOTOOLCHAIN=local CGO_ENABLED=0 \
        KUBE_GIT_VERSION_FILE="$WORK/version.env" \
        make WHAT="${BINARIES[*]/#/cmd/}"
) >&2
log "built in $(((SECONDS - start) / 60)) min $(((SECONDS - start) % 60)) s"

# --- 9. Into the cache (binaries last, by rename, so a half-copied cache never looks complete). -------------------
mkdir -p "$BIN_DIR"
cat >"$CACHE_DIR/VERSION" <<EOF
kubernetes $UPSTREAM (Debian source package kubernetes $DEB_VERSION from $SUITE)
vendored github.com/modern-go/reflect2 replaced by $(dpkg-query -W -f='${Version}' golang-github-modern-go-reflect2-dev)
built with $GO_VERSION, CGO_ENABLED=0, on $(date -u +%Y-%m-%dT%H:%M:%SZ)
etcd: Debian etcd-server $(dpkg-query -W -f='${Version}' etcd-server) at $(command -v etcd || echo /usr/bin/etcd)
EOF
for b in "${BINARIES[@]}"; do
    built=$SRC/_output/bin/$b
    [[ -x $built ]] || built=$SRC/_output/local/bin/$(go env GOOS)/$(go env GOARCH)/$b
    [[ -x $built ]] || die "the build did not produce $b"
    install -m 0755 "$built" "$BIN_DIR/.$b.tmp"
    mv -f "$BIN_DIR/.$b.tmp" "$BIN_DIR/$b"
done

log "${BINARIES[*]} ($UPSTREAM) are in $BIN_DIR; etcd is $(command -v etcd)"
echo "$BIN_DIR"
