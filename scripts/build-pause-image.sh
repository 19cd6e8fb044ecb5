#!/usr/bin/env bash
# Build the one-node cluster's pause (sandbox) image, or another image of one static C program, FROM scratch
# with buildah, and cache it as an OCI archive outside the repository (scripts/node.sh imports it into
# containerd). No registry is reachable here, so the usual registry.k8s.io/pause cannot be pulled.
#
#   scripts/build-pause-image.sh
#       the pause image: a static binary that sleeps until SIGTERM/SIGINT and reaps its children
#   scripts/build-pause-image.sh --name localhost/eagle3-node/probe --source tests/cluster/probe.c
#       any single-file C program as /NAME, the image's entrypoint (the tests' probe image)
#
# Prints two lines on stdout: the image reference (localhost/eagle3-node/NAME:TAG) and, last, the OCI archive
# (written by `buildah push REF oci-archive:FILE:REF`; import it with `ctr -n k8s.io images import`).
# TAG is the first 12 hex digits of a sha256 over the source, the compiler's version and this recipe: the same
# source gives the same tag, and a cached archive is reused without running gcc or buildah at all.
# The cache is ${EAGLE3_NODE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/eagle3-operator/node}/images.
# Needs gcc with a static libc (Debian: gcc, libc6-dev) and buildah; images in buildah's storage are named
# localhost/eagle3-node/* only.
set -euo pipefail

SCRIPT_NAME=build-pause-image
# shellcheck source=scripts/machine-cache.sh
source "$(dirname "${BASH_SOURCE[0]}")/machine-cache.sh"

CACHE_DIR=${EAGLE3_NODE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/eagle3-operator/node}/images
RECIPE=1 # bump when the way an image is put together changes
NAME=localhost/eagle3-node/pause
SOURCE=

while (($#)); do
    case $1 in
    --name) NAME=$2 && shift 2 ;;
    --source) SOURCE=$2 && shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' && exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
    esac
done
[[ $NAME == localhost/eagle3-node/* && $NAME != *:* ]] ||
    die "--name must be localhost/eagle3-node/NAME without a tag (got $NAME)"
PROGRAM=${NAME##*/}

# The pause program: PID 1 of every pod sandbox. It holds the pod's namespaces, reaps whatever is re-parented
# to it, and exits on SIGTERM/SIGINT (what containerd sends when the sandbox stops).
PAUSE_C='#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_term(int sig) { (void)sig; _exit(0); }

static void on_child(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "-v") == 0) {
        puts("eagle3-node pause");
        return 0;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_term;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sa.sa_handler = on_child;
    sa.sa_flags = SA_NOCLDSTOP | SA_RESTART;
    sigaction(SIGCHLD, &sa, NULL);
    if (getpid() != 1) fputs("pause: not running as PID 1\n", stderr);
    for (;;) pause();
}
'

if [[ -n $SOURCE ]]; then
    [[ -r $SOURCE ]] || die "no such source file: $SOURCE"
    SOURCE_TEXT=$(cat "$SOURCE")
else
    [[ $PROGRAM == pause ]] || die "--name $NAME needs --source"
    SOURCE_TEXT=$PAUSE_C
fi

command -v gcc >/dev/null || die "no gcc (Debian: apt-get install gcc libc6-dev)"
TAG=$(printf '%s\n%s\nrecipe %s\n' "$SOURCE_TEXT" "$(gcc --version | head -n1)" "$RECIPE" | sha256sum | cut -c1-12)
REF=$NAME:$TAG
ARCHIVE=$CACHE_DIR/$PROGRAM-$TAG.oci.tar

if [[ -s $ARCHIVE ]]; then
    echo "$REF"
    echo "$ARCHIVE"
    exit 0
fi

command -v buildah >/dev/null || die "no buildah (Debian: apt-get install buildah)"
mkdir -p "$CACHE_DIR"
hold_lock "$CACHE_DIR/.$PROGRAM.lock"
if [[ -s $ARCHIVE ]]; then # built by the holder of the lock meanwhile
    echo "$REF"
    echo "$ARCHIVE"
    exit 0
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/eagle3-image-$PROGRAM.XXXXXX")
CONTAINER=
cleanup() {
    [[ -z $CONTAINER ]] || buildah rm "$CONTAINER" >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT

printf '%s\n' "$SOURCE_TEXT" >"$WORK/$PROGRAM.c"
gcc -static -Os -s -Wall -o "$WORK/$PROGRAM" "$WORK/$PROGRAM.c"
[[ -x $WORK/$PROGRAM ]] || die "gcc produced no $PROGRAM"

log "building $REF ($(stat -c %s "$WORK/$PROGRAM") bytes, FROM scratch)"
# --network=host: buildah's default network (netavark) would switch ip_forward on and leave iptables chains
CONTAINER=$(buildah from --network=host --pull=never scratch)
buildah copy --chmod 0755 "$CONTAINER" "$WORK/$PROGRAM" "/$PROGRAM" >/dev/null
buildah config --entrypoint "[\"/$PROGRAM\"]" --cmd '[]' --workingdir / \
    --label "org.opencontainers.image.title=eagle3-node $PROGRAM" "$CONTAINER"
buildah commit --quiet --format oci --rm "$CONTAINER" "$REF" >/dev/null
CONTAINER=
buildah push --quiet "$REF" "oci-archive:$WORK/image.tar:$REF" >/dev/null
mv -f "$WORK/image.tar" "$ARCHIVE"
# older tags of this program are no longer referenced by anything (containerd keeps what it imported)
find "$CACHE_DIR" -maxdepth 1 -name "$PROGRAM-*.oci.tar" ! -name "$PROGRAM-$TAG.oci.tar" -delete
buildah images --format '{{.Name}}:{{.Tag}}' 2>/dev/null | grep -xE "$NAME:[0-9a-f]{12}" | grep -vxF "$REF" |
    xargs -r buildah rmi >/dev/null 2>&1 || true

echo "$REF"
echo "$ARCHIVE"
