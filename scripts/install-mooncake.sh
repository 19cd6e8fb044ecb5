#!/usr/bin/env bash
# Install Mooncake's CPU transfer engine (PyPI `mooncake-transfer-engine-non-cuda`) into a Python environment,
# and Debian's libibverbs1, which its binaries and `mooncake.store` link against, for the `mooncake` transfer of
# online extraction (the trainer's hs_connectors MooncakeTransfer, the `mooncake_master` the tests start).
#
#   scripts/install-mooncake.sh .venv/bin/python     # what `make mooncake` (and so `make test`) runs
#
# Quick when both are there (one import). libibverbs1 comes from apt-get as root (CI), or through `sudo -n`;
# otherwise the script stops and says what to install. The vLLM CPU environment gets the same wheel from
# scripts/build-vllm-cpu.sh. The GPU image takes the CUDA build (`mooncake-transfer-engine`) instead: the
# package name is not a dependency of any pyproject extra.
set -euo pipefail

MOONCAKE_PACKAGE=mooncake-transfer-engine-non-cuda
MOONCAKE_VERSION=0.3.13.post1
IBVERBS_PACKAGE=libibverbs1
SCRIPT_NAME=install-mooncake
# shellcheck source=scripts/machine-cache.sh
source "$(dirname "${BASH_SOURCE[0]}")/machine-cache.sh"

[[ $# -eq 1 ]] || die "usage: scripts/install-mooncake.sh PYTHON (the environment's python)"
PY=$1
[[ -x $PY ]] || die "$PY is not an executable python"

ibverbs_loads() { "$PY" -c 'import ctypes; ctypes.CDLL("libibverbs.so.1")' 2>/dev/null; }
mooncake_installed() {
    "$PY" -c "import importlib.metadata as m, sys; sys.exit(m.version('$MOONCAKE_PACKAGE') != '$MOONCAKE_VERSION')" \
        2>/dev/null
}
mooncake_imports() { "$PY" -c 'import mooncake.store' 2>/dev/null; }

if ibverbs_loads && mooncake_installed && mooncake_imports; then
    exit 0
fi
hold_lock "${XDG_CACHE_HOME:-$HOME/.cache}/eagle3-operator/mooncake.lock"

# --- 1. libibverbs.so.1 (Debian's libibverbs1): loaded by mooncake.store and mooncake_master, even over TCP. ---
if ! ibverbs_loads; then
    if [[ $(id -u) -eq 0 ]]; then
        APT=(apt-get)
    elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
        APT=(sudo -n apt-get)
    else
        die "libibverbs.so.1 is missing: install Debian's $IBVERBS_PACKAGE (apt-get install $IBVERBS_PACKAGE) as root"
    fi
    log "installing $IBVERBS_PACKAGE with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    if ! "${APT[@]}" install -y -qq --no-install-recommends "$IBVERBS_PACKAGE" >&2; then
        log "apt-get install failed; updating the package lists and trying again"
        "${APT[@]}" update -qq >&2
        "${APT[@]}" install -y -qq --no-install-recommends "$IBVERBS_PACKAGE" >&2 ||
            die "apt-get could not install $IBVERBS_PACKAGE"
    fi
    ibverbs_loads || die "$IBVERBS_PACKAGE is installed, but libibverbs.so.1 does not load"
fi

# --- 2. The wheel (binaries mooncake_master etc. in the environment's bin/, the `mooncake` package). ----------
if ! mooncake_installed; then
    log "installing $MOONCAKE_PACKAGE==$MOONCAKE_VERSION into $("$PY" -c 'import sys; print(sys.prefix)')"
    "$PY" -m pip install --quiet --disable-pip-version-check "$MOONCAKE_PACKAGE==$MOONCAKE_VERSION" >&2 ||
        die "pip could not install $MOONCAKE_PACKAGE==$MOONCAKE_VERSION"
fi
"$PY" -c 'import mooncake.store' >&2 || die "$MOONCAKE_PACKAGE is installed, but \`import mooncake.store\` fails"
log "$MOONCAKE_PACKAGE $MOONCAKE_VERSION is ready"
