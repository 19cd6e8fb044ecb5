#!/usr/bin/env bash
# Fill a directory with the wheels benchmarks/gpu_pipeline.sh may need on a GPU machine without network that
# has torch, transformers and Triton: speculators==0.9.0 and hs-connectors==0.9.0 (as the Makefile pins them)
# and the other packages the pipeline and `speculators train` import beyond torch's and transformers' own
# requirements, each at the version this checkout's virtual environment has (`make` installs it), for the
# GPU machine's Python (binary wheels for manylinux x86_64). Run it here, with the package index pip is
# configured for; copy the directory along; on the GPU machine: bash benchmarks/gpu_pipeline.sh --wheels DIR.
#
#   bash benchmarks/gpu_wheels.sh [DIR] [--python-version X.Y] [--no-large] [--mooncake]
#     DIR               default: wheels-gpu (created)
#     --python-version  the GPU machine's Python (default: the virtual environment's)
#     --no-large        leave out pyarrow and pandas (about 70 MB; datasets needs them, most images have them)
#     --mooncake        add Mooncake's transfer engine, CUDA build (mooncake-transfer-engine==0.3.13.post1, a
#                       98 MB wheel, and msgpack) for the online comparison's mooncake transfer; it also needs
#                       Debian's libibverbs1 there. More than the device tool carries in one call (64 MiB).
#   env: PYTHON (the environment whose versions are pinned; default .venv/bin/python)
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-$REPO/.venv/bin/python}
DEST=wheels-gpu
PY_VERSION=""
LARGE=1
MOONCAKE=0
MOONCAKE_PIN=mooncake-transfer-engine==0.3.13.post1 # the CUDA build; the CPU tier uses its -non-cuda twin
while (($#)); do
    case "$1" in
    --python-version) PY_VERSION=$2; shift 2 ;;
    --no-large) LARGE=0; shift ;;
    --mooncake) MOONCAKE=1; shift ;;
    -h | --help) sed -n '2,15p' "$0"; exit 0 ;;
    -*) echo "gpu_wheels.sh: unknown option $1" >&2; exit 2 ;;
    *) DEST=$1; shift ;;
    esac
done
[[ -x $PYTHON ]] || { echo "gpu_wheels.sh: no $PYTHON (run make first, or set PYTHON)" >&2; exit 1; }
PY_VERSION=${PY_VERSION:-$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')}

# What a run of gpu_pipeline.py and of `speculators train` imports (measured on the tiny CPU run), less torch,
# triton, transformers and their own requirements (numpy, safetensors, tokenizers, huggingface-hub, pyyaml,
# filelock, fsspec, jinja2, ...), which a machine with transformers has. gpu_pipeline.sh installs only the
# missing ones.
DISTS=(
    speculators hs-connectors
    pydantic pydantic-core annotated-types typing-inspection pydantic-settings python-dotenv loguru psutil
    datasets dill multiprocess xxhash python-dateutil six
    aiohttp aiohappyeyeballs aiosignal attrs frozenlist multidict propcache yarl
    openai jiter anyio sniffio httpx httpcore httpx2 httpcore2 h11 certifi idna
    rich pygments markdown-it-py mdurl typer click shellingham annotated-doc
    pytest pluggy iniconfig pytest-timeout  # for the gpu test tier (docs/gpu.md), not for the benchmark
)
((LARGE)) && DISTS+=(pyarrow pandas)

# name==version as installed in $PYTHON's environment (speculators and hs-connectors: the Makefile's pins)
PINNED=$("$PYTHON" - "${DISTS[@]}" <<'EOF'
import importlib.metadata as md
import sys

PINNED = {"speculators": "0.9.0", "hs-connectors": "0.9.0"}
for name in sys.argv[1:]:
    try:
        print(f"{name}=={PINNED.get(name) or md.version(name)}")
    except md.PackageNotFoundError:
        sys.exit(f"gpu_wheels.sh: {name} is not installed in {sys.prefix}: run make first")
EOF
)
mapfile -t PINS <<<"$PINNED"
((MOONCAKE)) && PINS+=("$MOONCAKE_PIN" "msgpack==$("$PYTHON" -c 'import importlib.metadata as m; print(m.version("msgpack"))')")

mkdir -p "$DEST"
PLATFORMS=()
for tag in manylinux_2_28 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux_2_12 manylinux2010 manylinux_2_5 \
    manylinux1; do
    PLATFORMS+=(--platform "${tag}_x86_64")
done
"$PYTHON" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --implementation cp --python-version "$PY_VERSION" "${PLATFORMS[@]}" --dest "$DEST" "${PINS[@]}"
echo "gpu_wheels.sh: ${#PINS[@]} wheels for Python $PY_VERSION in $DEST ($(du -sh "$DEST" | cut -f1))"
