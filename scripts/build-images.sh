#!/usr/bin/env bash
# Build the operator's image (images/operator/Dockerfile) and the pipeline's CPU image
# (images/pipeline/Dockerfile.cpu) from the repository as it is, cached by content outside the repository:
# `make images` runs it.
#
#   scripts/build-images.sh [operator|pipeline-cpu|all]   # default all; stdout: one line per image,
#                                                         #   "NAME REF ARCHIVE", then the images.json path (last)
#   scripts/build-images.sh --print-key NAME              # NAME's cache key (sha256 hex); builds and pulls nothing
#   scripts/build-images.sh --help
#
# The builder: Docker where a daemon answers (`docker info` succeeds), buildah otherwise (Debian's buildah,
# installed with apt-get when missing and run as root). The Dockerfiles are built as they are; nothing edits them.
# buildah builds run with --network=host (its default network, netavark, turns net.ipv4.ip_forward on and leaves
# NETAVARK iptables chains behind; the script checks afterwards that neither changed) and with the host's CA bundle
# mounted read-only over the build's, so pip reaches its index where that takes a CA only the host trusts.
#
# The base: python:3.11.14-slim-bookworm (the Dockerfiles' PYTHON_VERSION) when it is in the builder's local
# storage, or can be pulled while no stand-in exists yet. Otherwise a local stand-in,
# localhost/eagle3-base/python:3.11-slim-bookworm, made by scripts/build-base-image.sh (Debian bookworm by
# debootstrap with Debian's python3; root, about a minute, once) and passed in with the build arguments
# PYTHON_IMAGE=localhost/eagle3-base/python PYTHON_VERSION=3.11. Its Python is Debian's 3.11.2, not 3.11.14: the
# script says so whenever it builds on it. Once the stand-in exists it is used until the real base is in local
# storage (pull it with your builder) or EAGLE3_IMAGES_BASE=real.
#
# The pipeline's CPU image needs torch's CPU wheel, which pip finds the way this machine's pip does: the script reads
# pip's own configuration (`python3 -m pip config list`: the PIP_* environment first, then the configuration files)
# and passes find-links and extra-index-url as the build arguments PIP_FIND_LINKS and PIP_EXTRA_INDEX_URL.
# Local directories and file:// URLs are bind-mounted read-only at the same paths (buildah; an index's parent
# directory too, since its pages may link to ../../files/); http(s) URLs pass as they are. With Docker, which
# cannot mount into a build, each local directory is served on a loopback http.server (ports from
# EAGLE3_IMAGES_PIP_PORT, default 8731, up) for the build's duration and the build runs with --network=host; pip
# trusts 127.0.0.1 without TLS. Docker builds see only the base's CA bundle. pip's constraint files (here one that
# caps torch) are not passed: the Dockerfile pins torch itself.
#
# Not built: images/pipeline/Dockerfile, the GPU pipeline image. Its base, vllm/vllm-openai (CUDA), cannot be had
# here; hadolint and tests/images/test_dockerfiles.py still check it.
#
# The cache is ${EAGLE3_IMAGES_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/eagle3-operator/images}:
#   NAME-KEY12.oci.tar (buildah) or NAME-KEY12.docker.tar (`docker save`): the image as an archive, written by
#     rename (a half-written one never looks complete); a cluster tier imports it with
#     `ctr -n k8s.io images import FILE`. Older archives of the same image are removed, and so are older
#     localhost/eagle3-NAME tags in the builder's storage.
#   images.json: NAME -> ref, archive, key, built_at, build_seconds, base, base_id, base_python, builder, size.
#   base/: scripts/build-base-image.sh's archive of the stand-in base.
# An image's key is a sha256 over its Dockerfile, .dockerignore, every file its COPY/ADD instructions take from the
# build context (`git ls-files` of those paths, tracked or untracked but not ignored, so build outputs and caches do
# not count; contents and modes), its build arguments, the base image's ID and the builder. The refs are
# localhost/eagle3-operator:KEY12 and localhost/eagle3-pipeline-cpu:KEY12. When the key's archive exists and the
# image is in local storage nothing is built; when only the archive is there it is loaded. Delete the directory
# (and `buildah rmi` the localhost/eagle3-* images) to rebuild from scratch. Measured on a 2-core VM with buildah
# (docs/images.md): cold, 5.3 minutes in all (the stand-in base 35 to 57 s, the operator image 16 s, the CPU pipeline
# image 3.6 minutes plus 50 s for its 1.6 GB archive; 5.6 GB in storage); warm, under a second.
#
# Optional environment:
#   EAGLE3_IMAGES_CACHE     the cache directory (see above)
#   EAGLE3_IMAGES_BUILDER   docker or buildah (default: docker if `docker info` succeeds, else buildah)
#   EAGLE3_IMAGES_BASE      auto (default), real (python:3.11.14-slim-bookworm or fail) or stand-in
#   EAGLE3_IMAGES_BASE_ID   the base image's ID, instead of looking it up (for --print-key in tests)
#   EAGLE3_IMAGES_PIP_PORT  Docker only: the first loopback port for serving local pip directories (default 8731)
#   EAGLE3_BASE_MIRROR      the Debian mirror for the stand-in base (default: read from the system's apt sources)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE_DIR=${EAGLE3_IMAGES_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/eagle3-operator/images}
MANIFEST=$CACHE_DIR/images.json
# Bump when what goes into a build changes in this script (flags, mounts): every key changes with it.
# 2: no layer cache for Dockerfiles with RUN --mount=...,from= (an operator image of recipe 1 may be stale).
KEY_RECIPE=2
NAMES=(operator pipeline-cpu)
declare -A DOCKERFILE=([operator]=images/operator/Dockerfile [pipeline-cpu]=images/pipeline/Dockerfile.cpu)
STAND_IN_ARGS=(PYTHON_IMAGE=localhost/eagle3-base/python PYTHON_VERSION=3.11)
CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt

SCRIPT_NAME=build-images
# shellcheck source=scripts/machine-cache.sh
source "$ROOT/scripts/machine-cache.sh"

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'; }

# --- the command line ---------------------------------------------------------------------------------------------
PRINT_KEY=
WANTED=()
while (($#)); do
    case $1 in
    -h | --help)
        usage
        exit 0
        ;;
    --print-key)
        [[ $# -ge 2 ]] || die "--print-key needs an image name (${NAMES[*]})"
        PRINT_KEY=$2
        shift
        ;;
    all) WANTED+=("${NAMES[@]}") ;;
    operator | pipeline-cpu) WANTED+=("$1") ;;
    pipeline) die "the GPU pipeline image (images/pipeline/Dockerfile, on vllm/vllm-openai) is not built here: its" \
        "CUDA base cannot be had; build it with Docker on a machine that can pull it" ;;
    *) die "unknown argument '$1' (usage: scripts/build-images.sh [operator|pipeline-cpu|all] | --print-key NAME)" ;;
    esac
    shift
done
if [[ -n $PRINT_KEY ]]; then
    [[ -n ${DOCKERFILE[$PRINT_KEY]:-} ]] || die "unknown image '$PRINT_KEY' (one of: ${NAMES[*]})"
    WANTED=("$PRINT_KEY")
fi
((${#WANTED[@]})) || WANTED=("${NAMES[@]}")
# each once, in NAMES' order
SELECTED=()
for name in "${NAMES[@]}"; do
    [[ " ${WANTED[*]} " == *" $name "* ]] && SELECTED+=("$name")
done

# --- the builder --------------------------------------------------------------------------------------------------
BUILDER=${EAGLE3_IMAGES_BUILDER:-auto}
if [[ $BUILDER == auto ]]; then
    if command -v docker >/dev/null && docker info >/dev/null 2>&1; then BUILDER=docker; else BUILDER=buildah; fi
fi
[[ $BUILDER == docker || $BUILDER == buildah ]] || die "EAGLE3_IMAGES_BUILDER is '$BUILDER', not docker or buildah"
# buildah runs a Dockerfile's RUN steps with an OCI runtime, which Debian's package only recommends (crun or
# runc): without one every RUN fails with "exec: no command". runc is the one the real node's containerd uses.
if [[ $BUILDER == buildah && -z $PRINT_KEY ]] \
    && { ! command -v buildah >/dev/null || ! { command -v runc >/dev/null || command -v crun >/dev/null; }; }; then
    if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
        die "no Docker daemon answers and buildah or an OCI runtime is not installed: install buildah and runc" \
            "(Debian: apt-get install buildah runc, as root) or start Docker"
    fi
    log "no Docker daemon answers: installing Debian's buildah and runc with apt-get"
    DEBIAN_FRONTEND=noninteractive apt-get -qq update
    DEBIAN_FRONTEND=noninteractive apt-get -qq -y install --no-install-recommends buildah runc >/dev/null
fi

# image_id REF: the ID of REF in the builder's local storage; fails when it is not there.
image_id() {
    if [[ $BUILDER == docker ]]; then
        docker image inspect --format '{{.Id}}' "$1" 2>/dev/null
    else
        buildah inspect --type image --format '{{.FromImageID}}' "$1" 2>/dev/null
    fi
}

image_label() { # REF LABEL
    if [[ $BUILDER == docker ]]; then
        docker image inspect --format "{{index .Config.Labels \"$2\"}}" "$1" 2>/dev/null
    else
        buildah inspect --type image --format "{{index .OCIv1.Config.Labels \"$2\"}}" "$1" 2>/dev/null
    fi
}

# --- the base -----------------------------------------------------------------------------------------------------
# resolve_base DOCKERFILE sets BASE_REF, BASE_ID, BASE_PYTHON, BASE_ARGS (build arguments) and BASE_NOTE.
declare -A RESOLVED=()
resolve_base() {
    local version real mode stand_in id=
    version=$(sed -n 's/^ARG PYTHON_VERSION=//p' "$ROOT/$1" | head -n1)
    [[ -n $version ]] || die "$1 declares no ARG PYTHON_VERSION=..."
    real=python:$version-slim-bookworm
    stand_in="${STAND_IN_ARGS[0]#PYTHON_IMAGE=}:${STAND_IN_ARGS[1]#PYTHON_VERSION=}-slim-bookworm"
    mode=${EAGLE3_IMAGES_BASE:-auto}
    [[ $mode == auto || $mode == real || $mode == stand-in ]] ||
        die "EAGLE3_IMAGES_BASE is '$mode', not auto, real or stand-in"
    if [[ -n ${RESOLVED[$real]:-} ]]; then
        eval "${RESOLVED[$real]}"
        return
    fi
    BASE_REF=$real BASE_ARGS=() BASE_PYTHON=$version BASE_NOTE=
    if [[ $mode != stand-in ]]; then
        if [[ -n ${EAGLE3_IMAGES_BASE_ID:-} && $mode == real ]]; then
            id=$EAGLE3_IMAGES_BASE_ID
        elif ! id=$(image_id "$real") && [[ -z $PRINT_KEY ]] &&
            { [[ $mode == real ]] || ! image_id "$stand_in" >/dev/null; }; then
            log "$real is not in $BUILDER's local storage: trying to pull it"
            if "$BUILDER" pull --quiet "$real" >/dev/null 2>"$CACHE_DIR/.pull.log"; then
                id=$(image_id "$real")
            else
                log "cannot pull $real: $(tail -n1 "$CACHE_DIR/.pull.log")"
                id=
            fi
        fi
        [[ -n $id || $mode != real ]] || die "EAGLE3_IMAGES_BASE=real, but $real is not in $BUILDER's storage" \
            "and cannot be pulled"
    fi
    if [[ -z $id ]]; then
        BASE_REF=$stand_in BASE_ARGS=("${STAND_IN_ARGS[@]}")
        if [[ -n ${EAGLE3_IMAGES_BASE_ID:-} ]]; then
            id=$EAGLE3_IMAGES_BASE_ID
        elif [[ -n $PRINT_KEY ]]; then
            id=$(image_id "$stand_in") || die "neither $real nor the stand-in $stand_in is in $BUILDER's local" \
                "storage: run scripts/build-images.sh once (or set EAGLE3_IMAGES_BASE_ID)"
        else
            [[ $(bash "$ROOT/scripts/build-base-image.sh" "$BUILDER" | tail -n1) == "$stand_in" ]] ||
                die "scripts/build-base-image.sh did not make $stand_in"
            id=$(image_id "$stand_in") || die "$stand_in is not in $BUILDER's storage after build-base-image.sh"
        fi
        BASE_PYTHON=$(image_label "$stand_in" dev.eagle3.python-version || true)
        BASE_NOTE="$stand_in stands in for $real, which cannot be had here: the base's Python is Debian's"
        BASE_NOTE+=" ${BASE_PYTHON:-3.11.x}, not $version (scripts/build-base-image.sh, docs/images.md)"
    fi
    BASE_ID=$id
    RESOLVED[$real]=$(declare -p BASE_REF BASE_ID BASE_PYTHON BASE_ARGS BASE_NOTE | sed 's/^declare -[aA-]* //')
}

# --- pip's configuration, passed through to the CPU image ---------------------------------------------------------
PIP_CONFIG=
PIP_CONFIG_READ=
read_pip_config() { # once, in the main shell: `pip config list` lines, e.g. global.find-links='/some/dir'
    [[ -z $PIP_CONFIG_READ ]] || return 0
    PIP_CONFIG_READ=1
    PIP_CONFIG=$(python3 -m pip config list 2>/dev/null) ||
        log "warning: \`python3 -m pip config list\` failed: no pip settings are passed to the builds"
}
# pip_setting OPTION: this machine's pip's effective value for OPTION (e.g. find-links): the PIP_* environment
# first, then the `install` and `global` sections of its configuration files (pip's own order).
pip_setting() {
    local scope line value
    for scope in :env: install global; do
        while IFS= read -r line; do
            [[ $line == "$scope.$1="* ]] || continue
            value=${line#*=}
            value=${value#[\'\"]}
            value=${value%[\'\"]}
            printf '%s\n' "$value"
            return 0
        done <<<"$PIP_CONFIG"
    done
}

# pip_locations OPTION sets PIP_VALUE (what the build gets) and adds to PIP_MOUNTS (local directories to mount).
declare -A PIP_MOUNTS=()
PIP_VALUE=
pip_locations() {
    local loc path mount out=()
    for loc in $(pip_setting "$1"); do
        case $loc in
        file://*) path=${loc#file://} ;;
        /*) path=$loc ;;
        *://*)
            out+=("$loc")
            continue
            ;;
        *)
            log "warning: pip's $1 names the relative path '$loc': not passed to the build"
            continue
            ;;
        esac
        path=${path%/}
        if [[ ! -e $path ]]; then
            log "warning: pip's $1 names $loc, which does not exist: not passed to the build"
            continue
        fi
        mount=$path
        # an index's pages may link to files beside it (PEP 503 pages of a local mirror: ../../files/...)
        [[ $1 == extra-index-url || $1 == index-url ]] && mount=$(dirname "$path")
        [[ -d $mount ]] || mount=$(dirname "$mount")
        PIP_MOUNTS[$mount]=1
        out+=("$loc")
    done
    PIP_VALUE=${out[*]}
}

# compute_args NAME (after resolve_base, in the main shell) sets ARGS, the image's build arguments (KEY=VALUE,
# sorted: they are part of its key), and PIP_MOUNTS, the local directories its build mounts.
ARGS=()
compute_args() {
    local found=("${BASE_ARGS[@]}")
    PIP_MOUNTS=()
    if [[ $1 == pipeline-cpu ]]; then
        read_pip_config
        pip_locations find-links
        [[ -z $PIP_VALUE ]] || found+=("PIP_FIND_LINKS=$PIP_VALUE")
        pip_locations extra-index-url
        [[ -z $PIP_VALUE ]] || found+=("PIP_EXTRA_INDEX_URL=$PIP_VALUE")
    fi
    ARGS=()
    ((${#found[@]})) || return 0
    mapfile -t ARGS < <(printf '%s\n' "${found[@]}" | LC_ALL=C sort)
}

# --- the key ------------------------------------------------------------------------------------------------------
# context_sources DOCKERFILE: the build-context paths its COPY/ADD instructions take (not those --from a stage).
context_sources() {
    awk '
        /^[ \t]*#/ { next }
        /\\[ \t]*$/ { sub(/\\[ \t]*$/, ""); buf = buf $0 " "; next }
        {
            stmt = buf $0; buf = ""
            sub(/^[ \t]+/, "", stmt)
            n = split(stmt, w, /[ \t]+/)
            if (toupper(w[1]) != "COPY" && toupper(w[1]) != "ADD") next
            if (w[2] ~ /^\[/) { gsub(/[\[\]",]/, " ", stmt); n = split(stmt, w, /[ \t]+/) }
            m = 0
            for (i = 2; i <= n; i++) {
                if (w[i] ~ /^--from=/) next
                if (w[i] ~ /^--/ || w[i] == "") continue
                src[++m] = w[i]
            }
            for (i = 1; i < m; i++) print src[i]
        }
    ' "$1"
}

# context_files NAME: NUL-separated, sorted: the files of the build context its Dockerfile copies.
context_files() {
    local sources
    mapfile -t sources < <(context_sources "$ROOT/${DOCKERFILE[$1]}")
    ((${#sources[@]})) || return 0
    if git -C "$ROOT" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
        git -C "$ROOT" ls-files -z --cached --others --exclude-standard -- "${sources[@]}"
    else
        (cd "$ROOT" && find "${sources[@]}" \( -type f -o -type l \) -print0)
    fi | while IFS= read -r -d '' f; do
        # a tracked file deleted in the working tree is not in the build context
        if [[ -f $ROOT/$f || -L $ROOT/$f ]]; then printf '%s\0' "$f"; fi
    done | LC_ALL=C sort -z -u
}

# image_key NAME: sha256 hex over everything its build reads (after resolve_base and compute_args).
image_key() {
    local df=${DOCKERFILE[$1]} arg
    {
        printf 'eagle3 images key recipe %s\nbuilder %s\nbase %s\n' "$KEY_RECIPE" "$BUILDER" "$BASE_ID"
        for arg in "${ARGS[@]}"; do printf 'arg %s\n' "$arg"; done
        (
            cd "$ROOT"
            sha256sum -- "$df"
            [[ ! -f .dockerignore ]] || sha256sum -- .dockerignore
            context_files "$1" | xargs -0 -r stat -c 'mode %a %n' --
            context_files "$1" | xargs -0 -r sha256sum --
        )
    } | sha256sum | cut -d' ' -f1
}

if [[ -n $PRINT_KEY ]]; then
    resolve_base "${DOCKERFILE[$PRINT_KEY]}"
    compute_args "$PRINT_KEY"
    image_key "$PRINT_KEY"
    exit 0
fi

# --- building -----------------------------------------------------------------------------------------------------
mkdir -p "$CACHE_DIR"
hold_lock "$CACHE_DIR/.build.lock"

ARCHIVE_SUFFIX=oci.tar
[[ $BUILDER == docker ]] && ARCHIVE_SUFFIX=docker.tar

host_state() { # what a buildah build must leave as it found it
    printf 'net.ipv4.ip_forward=%s\n' "$(sysctl -n net.ipv4.ip_forward 2>/dev/null || echo '?')"
    if [[ $(id -u) -eq 0 ]] && command -v iptables-save >/dev/null; then
        printf 'NETAVARK chains: %s\n' "$(iptables-save 2>/dev/null | grep -c NETAVARK || true)"
    fi
}

# Docker: serve the local pip directories on loopback for the build (see the header).
SERVERS=()
stop_servers() {
    local pid
    for pid in "${SERVERS[@]}"; do kill "$pid" 2>/dev/null || true; done
    SERVERS=()
}
trap stop_servers EXIT
# docker_pip_args ARG... (in the main shell) sets DOCKER_ARGS: the arguments with PIP_FIND_LINKS's and
# PIP_EXTRA_INDEX_URL's local locations rewritten to loopback URLs, served until stop_servers.
declare -A SERVED=()
DOCKER_ARGS=()
docker_pip_args() {
    local arg name value loc path dir port=${EAGLE3_IMAGES_PIP_PORT:-8731} out
    DOCKER_ARGS=()
    for dir in "${!PIP_MOUNTS[@]}"; do
        [[ -n ${SERVED[$dir]:-} ]] && continue
        while [[ " ${SERVED[*]} " == *" $port "* ]]; do port=$((port + 1)); done
        python3 -m http.server --bind 127.0.0.1 --directory "$dir" "$port" >/dev/null 2>&1 &
        SERVERS+=($!)
        SERVED[$dir]=$port
        for _ in $(seq 100); do # up to 10 s; a port taken by someone else makes the server exit
            kill -0 "${SERVERS[-1]}" 2>/dev/null ||
                die "could not serve $dir on 127.0.0.1:$port (taken? set EAGLE3_IMAGES_PIP_PORT)"
            (: </dev/tcp/127.0.0.1/"$port") 2>/dev/null && break
            sleep 0.1
        done
    done
    for arg in "$@"; do
        name=${arg%%=*} value=${arg#*=}
        if [[ $name != PIP_FIND_LINKS && $name != PIP_EXTRA_INDEX_URL ]]; then
            DOCKER_ARGS+=("$arg")
            continue
        fi
        out=()
        for loc in $value; do
            path=${loc#file://}
            for dir in "${!SERVED[@]}"; do
                if [[ $path == "$dir" || $path == "$dir"/* ]]; then
                    loc="http://127.0.0.1:${SERVED[$dir]}${path#"$dir"}"
                    break
                fi
            done
            out+=("$loc")
        done
        DOCKER_ARGS+=("$name=${out[*]}")
    done
}

build_image() { # NAME REF ARGS...
    local name=$1 ref=$2 df=${DOCKERFILE[$1]} arg before after rc=0
    shift 2
    local flags=(-f "$df" -t "$ref")
    if [[ $BUILDER == buildah ]]; then
        flags+=(--format docker --force-rm --pull=never --network=host)
        # buildah 1.28's layer cache is wrong for `RUN --mount=type=bind,from=STAGE`: it reuses the RUN's layer when
        # only the stage's content changed (a stale image), and fails the mount when the stage came wholly from the
        # cache. Such a Dockerfile (the operator's) is built without the cache; the others keep it.
        if grep -Eq -- '--mount=[^ ]*from=' "$ROOT/$df"; then flags+=(--layers=false); else flags+=(--layers); fi
        [[ ! -r $CA_BUNDLE ]] || flags+=(-v "$CA_BUNDLE:$CA_BUNDLE:ro")
        for arg in "${!PIP_MOUNTS[@]}"; do flags+=(-v "$arg:$arg:ro"); done
        for arg in "$@"; do flags+=(--build-arg "$arg"); done
        before=$(host_state)
        (cd "$ROOT" && buildah bud "${flags[@]}" .) >&2 || rc=$?
        after=$(host_state)
        [[ $before == "$after" ]] || log "WARNING: host state changed during the build (by it, or by something else" \
            "on this machine): before: ${before//$'\n'/, }; after: ${after//$'\n'/, }"
        ((rc == 0)) || die "$name: buildah bud failed (exit $rc; its output is above)"
    else
        flags+=(--pull=false --network=host)
        docker_pip_args "$@"
        for arg in "${DOCKER_ARGS[@]}"; do flags+=(--build-arg "$arg"); done
        (cd "$ROOT" && docker build "${flags[@]}" .) >&2
        stop_servers
        SERVED=()
    fi
}

write_archive() { # REF ARCHIVE
    local tmp
    tmp=$(dirname "$2")/.$(basename "$2").tmp.$$
    rm -f "$tmp"
    if [[ $BUILDER == docker ]]; then
        docker save --output "$tmp" "$1"
    else
        buildah push --quiet "$1" "oci-archive:$tmp:$1"
    fi
    mv -f "$tmp" "$2"
}

load_archive() { # ARCHIVE REF
    if [[ $BUILDER == docker ]]; then
        docker load --input "$1" >&2
    else
        local id
        id=$(buildah pull --quiet "oci-archive:$1") && buildah tag "$id" "$2"
    fi
}

prune_old() { # NAME ARCHIVE REF: older archives and local tags of this image
    local f tag
    for f in "$CACHE_DIR/$1"-*."$ARCHIVE_SUFFIX"; do
        [[ -e $f && $f != "$2" ]] || continue
        log "$1: removing the older archive $f"
        rm -f "$f"
    done
    if [[ $BUILDER == docker ]]; then
        docker image ls --format '{{.Repository}}:{{.Tag}}' "localhost/eagle3-$1"
    else
        buildah images --noheading --format '{{.Name}}:{{.Tag}}' | grep -F "localhost/eagle3-$1:" || true
    fi | while read -r tag; do
        [[ $tag == "localhost/eagle3-$1:"* && $tag != "$3" ]] || continue
        log "$1: removing the older image $tag from $BUILDER's storage"
        "$BUILDER" rmi "$tag" >/dev/null 2>&1 || log "warning: could not remove $tag"
    done
}

image_size() { # REF
    if [[ $BUILDER == docker ]]; then
        docker image inspect --format '{{.Size}}' "$1"
    else
        buildah images --noheading --format '{{.Size}}' "$1" | head -n1
    fi
}

# record NAME FIELD=VALUE...: update NAME's entry in images.json (by rename); an entry of the same key keeps its
# built_at and build_seconds when this run built nothing.
record() {
    python3 - "$MANIFEST" "$@" <<'EOF'
import json
import os
import sys
from pathlib import Path

path, name, *fields = sys.argv[1:]
manifest_path = Path(path)
manifest: dict[str, dict[str, object]] = {}
if manifest_path.exists():
    try:
        manifest = json.loads(manifest_path.read_text())
    except ValueError:
        manifest = {}
new: dict[str, object] = {}
for field in fields:
    key, _, value = field.partition("=")
    new[key] = int(value) if key in {"build_seconds", "archive_bytes"} and value.isdigit() else value or None
old = manifest.get(name, {})
if old.get("key") == new.get("key"):
    for kept in ("built_at", "build_seconds"):
        if new.get(kept) is None and old.get(kept) is not None:
            new[kept] = old[kept]
if new.get("built_at") is None:  # not built by this script, or its entry was lost: the archive's time
    new["built_at"] = new.get("archived_at")
manifest[name] = new
tmp = manifest_path.with_name(f".{manifest_path.name}.tmp.{os.getpid()}")
tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
tmp.replace(manifest_path)
EOF
}

ANSWER=()
declare -A NOTED=()
for name in "${SELECTED[@]}"; do
    resolve_base "${DOCKERFILE[$name]}"
    if [[ -n $BASE_NOTE && -z ${NOTED[$BASE_REF]:-} ]]; then
        log "$BASE_NOTE"
        NOTED[$BASE_REF]=1
    fi
    compute_args "$name"
    key=$(image_key "$name")
    ref=localhost/eagle3-$name:${key:0:12}
    archive=$CACHE_DIR/$name-${key:0:12}.$ARCHIVE_SUFFIX
    built_at='' seconds=''
    if [[ -s $archive ]] && image_id "$ref" >/dev/null; then
        log "$name: up to date, nothing built ($ref, $archive)"
    elif [[ -s $archive ]] && load_archive "$archive" "$ref" >/dev/null && image_id "$ref" >/dev/null; then
        log "$name: loaded $ref from $archive, nothing built"
    else
        if image_id "$ref" >/dev/null; then
            log "$name: $ref is in $BUILDER's storage; writing its archive"
        else
            log "$name: building $ref from ${DOCKERFILE[$name]} with $BUILDER (key $key)"
            ((${#ARGS[@]} == 0)) || log "$name: build arguments: ${ARGS[*]}"
            start=$SECONDS
            build_image "$name" "$ref" "${ARGS[@]}"
            seconds=$((SECONDS - start))
            built_at=$(date -u +%Y-%m-%dT%H:%M:%SZ)
            log "$name: built in $((seconds / 60)) min $((seconds % 60)) s"
        fi
        write_archive "$ref" "$archive"
        log "$name: archive $archive ($(du -h "$archive" | cut -f1))"
    fi
    prune_old "$name" "$archive" "$ref"
    record "$name" "ref=$ref" "archive=$archive" "key=$key" "built_at=$built_at" "build_seconds=$seconds" \
        "archived_at=$(date -u -r "$archive" +%Y-%m-%dT%H:%M:%SZ)" \
        "base=$BASE_REF" "base_id=$BASE_ID" "base_python=$BASE_PYTHON" "builder=$BUILDER" \
        "dockerfile=${DOCKERFILE[$name]}" "size=$(image_size "$ref")" "archive_bytes=$(stat -c %s "$archive")"
    ANSWER+=("$name $ref $archive")
done
printf '%s\n' "${ANSWER[@]}" "$MANIFEST"
