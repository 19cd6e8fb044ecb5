#!/usr/bin/env bash
# Build a local stand-in for the images' base, python:3.11.14-slim-bookworm, where that image cannot be pulled
# (no access to its registry), and keep it in the builder's local storage and, as an archive, in a cache outside
# the repository. scripts/build-images.sh (`make images`) calls it; it can be run alone:
#
#   scripts/build-base-image.sh            # prints the stand-in's image reference (the last line of stdout)
#   scripts/build-base-image.sh buildah    # ... into buildah's storage (the default where no Docker daemon answers)
#   scripts/build-base-image.sh docker     # ... into Docker's (the default where `docker info` succeeds)
#
# The image, localhost/eagle3-base/python:3.11-slim-bookworm, is Debian bookworm itself:
# `debootstrap --variant=minbase bookworm` from this machine's own Debian mirror (read from its apt sources, as
# scripts/build-kube.sh does) plus Debian's python3, python3-venv and python3-pip, and what the Dockerfiles'
# RUN lines use that the official slim image has: bash, groupadd/useradd (passwd), apt-get, ca-certificates,
# netbase, tzdata. /usr/local/bin/python and python3 are links to Debian's /usr/bin/python3, and PEP 668's
# EXTERNALLY-MANAGED marker is removed, so `pip install` as root installs into /usr/local as in the official
# image. Its apt sources are bookworm and bookworm-updates on the same mirror.
# Caveat: its Python is Debian's 3.11.2, not 3.11.14 (the tag says 3.11; the image's label
# dev.eagle3.python-version says which); build-images.sh says so whenever it builds on it.
#
# Why this way: the official image's registry is out of reach here, but the Debian mirror is not, and Debian's
# Python 3.11 is the same minor version. Only `make images` on such a machine uses it (through the Dockerfiles'
# PYTHON_IMAGE and PYTHON_VERSION build arguments); a machine that can pull the real base never builds this.
#
# The cache is ${EAGLE3_IMAGES_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/eagle3-operator/images}/base: an archive
# of the image (OCI for buildah, `docker save` for Docker), written by rename. When the image is in local storage
# the script prints its reference at once; when only the archive is there, it loads the archive (same image ID,
# so build-images.sh's cache keys still match). Delete both (`buildah rmi REF`, the archive) to rebuild.
# A build takes 35 s to 2.5 minutes (mostly debootstrap; 35 to 57 s on a 2-core VM) and needs root (debootstrap, chroot); debootstrap is
# installed with apt-get when missing.
#
# Optional environment:
#   EAGLE3_IMAGES_CACHE   the cache directory (see above)
#   EAGLE3_BASE_MIRROR    the Debian mirror URI to bootstrap from (default: read from the system's apt sources)
set -euo pipefail

SUITE=bookworm
REF=localhost/eagle3-base/python:3.11-slim-bookworm
STANDS_IN_FOR=python:3.11.14-slim-bookworm
PACKAGES=python3,python3-venv,python3-pip,passwd,ca-certificates,netbase,tzdata
CACHE_DIR=${EAGLE3_IMAGES_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/eagle3-operator/images}/base

SCRIPT_NAME=build-base-image
# shellcheck source=scripts/machine-cache.sh
source "$(dirname "${BASH_SOURCE[0]}")/machine-cache.sh"

BUILDER=${1:-}
if [[ -z $BUILDER ]]; then
    if command -v docker >/dev/null && docker info >/dev/null 2>&1; then BUILDER=docker; else BUILDER=buildah; fi
fi
case $BUILDER in
buildah) ARCHIVE=$CACHE_DIR/python-3.11-slim-bookworm.oci.tar ;;
docker) ARCHIVE=$CACHE_DIR/python-3.11-slim-bookworm.docker.tar ;;
-h | --help)
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'
    exit 0
    ;;
*) die "unknown builder '$BUILDER' (usage: scripts/build-base-image.sh [buildah|docker])" ;;
esac
command -v "$BUILDER" >/dev/null || die "no $BUILDER on PATH"

image_present() {
    if [[ $BUILDER == docker ]]; then
        docker image inspect "$REF" >/dev/null 2>&1
    else
        buildah inspect --type image "$REF" >/dev/null 2>&1
    fi
}

load_archive() {
    log "loading $REF from $ARCHIVE"
    if [[ $BUILDER == docker ]]; then
        docker load --input "$ARCHIVE" >&2
    else
        buildah pull --quiet "oci-archive:$ARCHIVE" >/dev/null
    fi
}

# --- 1. In local storage, or in the cache's archive? Then there is nothing to build. ------------------------------
if image_present; then
    echo "$REF"
    exit 0
fi
mkdir -p "$CACHE_DIR"
hold_lock "$CACHE_DIR/.build.lock"
if ! image_present && [[ -s $ARCHIVE ]]; then
    load_archive || log "warning: could not load $ARCHIVE; building the image again"
fi
if image_present; then
    echo "$REF"
    exit 0
fi

# --- 2. debootstrap, as root, from this machine's Debian mirror. ------------------------------------------------
[[ $(id -u) -eq 0 ]] || die "building $REF needs root (debootstrap and chroot): run this script as root once," \
    "or pull $STANDS_IN_FOR into $BUILDER's storage, which build-images.sh then uses instead"
if ! command -v debootstrap >/dev/null; then
    command -v apt-get >/dev/null || die "no debootstrap and no apt-get to install it with"
    log "installing debootstrap with apt-get"
    DEBIAN_FRONTEND=noninteractive apt-get -qq update
    DEBIAN_FRONTEND=noninteractive apt-get -qq -y install --no-install-recommends debootstrap >/dev/null
fi
MIRROR=${EAGLE3_BASE_MIRROR:-$(find_mirror | head -n1)}
[[ -n $MIRROR ]] || die "found no Debian mirror in /etc/apt/sources.list{,.d/*}; set EAGLE3_BASE_MIRROR to one"
MIRROR=${MIRROR%/}
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
KEYRING_OPT=()
[[ -r $KEYRING ]] && KEYRING_OPT=(--keyring="$KEYRING")

WORK=$(mktemp -d "${TMPDIR:-/tmp}/eagle3-base-image.XXXXXX")
CTR=
ROOTFS=
# debootstrap mounts /proc and /sys (and, inside a container, binds /dev) under the target: unmount whatever is
# left there before anything is removed, and never cross into another file system when removing.
unmount_under() {
    local m
    [[ -n $1 && -d $1 ]] || return 0
    findmnt -rn -o TARGET | awk -v root="$1" 'index($0, root "/") == 1' | sort -r | while read -r m; do
        umount -l "$m" 2>/dev/null || log "warning: could not unmount $m"
    done
}
cleanup() {
    unmount_under "$ROOTFS"
    if [[ -n $CTR ]]; then
        buildah umount "$CTR" >/dev/null 2>&1 || true
        buildah rm "$CTR" >/dev/null 2>&1 || true
    fi
    rm -rf --one-file-system "$WORK"
}
trap cleanup EXIT

if [[ $BUILDER == buildah ]]; then
    CTR=$(buildah from --quiet scratch)
    ROOTFS=$(buildah mount "$CTR")
else
    ROOTFS=$WORK/rootfs
    mkdir -p "$ROOTFS"
fi
log "debootstrap --variant=minbase $SUITE from $MIRROR with $PACKAGES (about a minute)"
start=$SECONDS
debootstrap --variant=minbase --include="$PACKAGES" "${KEYRING_OPT[@]}" "$SUITE" "$ROOTFS" "$MIRROR" \
    >"$WORK/debootstrap.log" 2>&1 || {
    tail -n 30 "$WORK/debootstrap.log" >&2
    die "debootstrap failed (the last lines of its log are above)"
}
unmount_under "$ROOTFS"
for m in dev proc sys; do
    ! mountpoint -q "$ROOTFS/$m" || die "$ROOTFS/$m is still mounted after debootstrap; not touching it"
done

# --- 3. What the official slim image has, and what its tag promises. ------------------------------------------
PY_VERSION=$(chroot "$ROOTFS" /usr/bin/python3 -c 'import platform; print(platform.python_version())')
[[ $PY_VERSION == 3.11.* ]] || die "Debian $SUITE's python3 is $PY_VERSION, not 3.11"
rm -f "$ROOTFS"/usr/lib/python3.*/EXTERNALLY-MANAGED
ln -sf /usr/bin/python3 "$ROOTFS/usr/local/bin/python3"
ln -sf /usr/bin/python3 "$ROOTFS/usr/local/bin/python"
rm -f "$ROOTFS/etc/apt/sources.list"
cat >"$ROOTFS/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $MIRROR
Suites: $SUITE $SUITE-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
# Nothing of this machine, nothing downloaded: the runtime provides /etc/resolv.conf, /etc/hosts and /dev.
rm -rf --one-file-system "${ROOTFS:?}"/var/lib/apt/lists/* "${ROOTFS:?}"/var/cache/apt/* "${ROOTFS:?}"/var/log/* \
    "${ROOTFS:?}"/dev/* "${ROOTFS:?}"/tmp/* "${ROOTFS:?}"/root/.cache
: >"$ROOTFS/etc/resolv.conf"
: >"$ROOTFS/etc/hostname"
chroot "$ROOTFS" /bin/bash -c 'command -v groupadd useradd apt-get pip >/dev/null && python -m venv --help >/dev/null' ||
    die "the root file system lacks groupadd, useradd, apt-get, pip or venv"

# --- 4. Into the builder's storage, then the archive (by rename). ---------------------------------------------
DESCRIPTION="stand-in for $STANDS_IN_FOR: Debian $SUITE (debootstrap minbase) with Debian's Python $PY_VERSION"
LABELS=(
    "org.opencontainers.image.description=$DESCRIPTION"
    "dev.eagle3.stands-in-for=$STANDS_IN_FOR"
    "dev.eagle3.python-version=$PY_VERSION"
)
if [[ $BUILDER == buildah ]]; then
    buildah umount "$CTR" >/dev/null
    config=(--env LANG=C.UTF-8 --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin)
    config+=(--cmd python3 --created-by "scripts/build-base-image.sh (debootstrap --variant=minbase $SUITE)")
    for label in "${LABELS[@]}"; do config+=(--label "$label"); done
    buildah config "${config[@]}" "$CTR"
    buildah commit --quiet --rm "$CTR" "$REF" >/dev/null
    CTR=
    buildah push --quiet "$REF" "oci-archive:$ARCHIVE.tmp:$REF"
else
    changes=(--change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]')
    changes+=(--change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin')
    for label in "${LABELS[@]}"; do changes+=(--change "LABEL ${label%%=*}=\"${label#*=}\""); done
    tar -C "$ROOTFS" --numeric-owner -c . | docker import "${changes[@]}" - "$REF" >/dev/null
    docker save --output "$ARCHIVE.tmp" "$REF"
fi
mv -f "$ARCHIVE.tmp" "$ARCHIVE"
log "built $REF in $(((SECONDS - start) / 60)) min $(((SECONDS - start) % 60)) s: Debian's Python $PY_VERSION" \
    "(not $(echo "${STANDS_IN_FOR#python:}" | cut -d- -f1)); archive $ARCHIVE"
echo "$REF"
