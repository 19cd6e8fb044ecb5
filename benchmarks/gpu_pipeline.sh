#!/usr/bin/env bash
# The pipeline's GPU benchmark on one NVIDIA GPU (H200 class) with a time limit: checks the GPU, Triton's C
# compiler and the Python packages (torch, transformers and triton must be installed; missing small ones,
# speculators and hs-connectors above all, are installed from a directory of wheels that
# benchmarks/gpu_wheels.sh fills, into a private directory on PYTHONPATH, never into the environment), then
# runs benchmarks/gpu_pipeline.py with PYTHONPATH=contract:operator:pipeline:cli (the project need not be
# installed).
#
#   bash benchmarks/gpu_pipeline.sh [--wheels DIR] [--timeout SECONDS] [gpu_pipeline.py options]
#     --wheels DIR   wheels to install missing packages from (env EAGLE3_WHEELS); no network is used
#     --timeout S    the limit for everything, checks and installs included (env TIMEOUT; default 480)
#     --install-only the checks and installs alone, no benchmark (benchmarks/gpu_session.sh's check step)
#     --device cpu   (a gpu_pipeline.py option) skips the GPU checks: the smoke run, with --size tiny
#     --compare online --vllm PATH   (gpu_pipeline.py options) online against offline hidden states; without a
#                    vLLM for the GPU it is recorded as skipped (docs/gpu.md)
#     e.g.           bash benchmarks/gpu_pipeline.sh --wheels wheels-gpu --size 1b --steps 300
#   env: PYTHON (default python3), OUT (results directory, default .), EAGLE3_GPU_PREFIX (missing packages
#        go to its site-packages/, their commands to site-packages/bin; default ${TMPDIR:-/tmp}/eagle3-gpu),
#        WORKDIR (the run's scratch directory: the verifier and ~10 GB of hidden states for 1b; default
#        ${TMPDIR:-/tmp})
#
# Writes $OUT/gpu_pipeline.json (after every phase: a run cut short keeps what it measured), gpu_pipeline.md,
# gpu_pipeline.log (everything printed), gpu_pipeline.stock.log (the stock `speculators train` console) and,
# with the online comparison, gpu_pipeline.online.{offline,volume,mooncake}.log (`eagle3 run`, producer logs).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-python3}
WHEELS=${EAGLE3_WHEELS:-}
LIMIT=${TIMEOUT:-480}
OUT=${OUT:-.}
# The directory's name must contain "site-packages": datasets fingerprints its tables with dill, which pickles
# a module by value (and fails on pyarrow's) unless its path is under sys.prefix or contains site-packages.
SITE=${EAGLE3_GPU_PREFIX:-${TMPDIR:-/tmp}/eagle3-gpu}/site-packages
WORKDIR=${WORKDIR:-${TMPDIR:-/tmp}}
DEVICE=cuda
INSTALL_ONLY=0
ARGS=()
while (($#)); do
    case "$1" in
    --wheels) WHEELS=$2; shift 2 ;;
    --timeout) LIMIT=$2; shift 2 ;;
    --install-only) INSTALL_ONLY=1; shift ;;
    --device) DEVICE=$2; ARGS+=("$1" "$2"); shift 2 ;;
    --device=*) DEVICE=${1#--device=}; ARGS+=("$1"); shift ;;
    -h | --help) sed -n '2,24p' "$0"; exit 0 ;;
    *) ARGS+=("$1"); shift ;;
    esac
done
say() { echo "gpu_pipeline.sh [${SECONDS}s]: $*" >&2; }
fail() { say "$*"; exit 1; }

mkdir -p "$OUT" "$WORKDIR"
OUT=$(cd "$OUT" && pwd)
export PYTHONPATH="$SITE:$REPO/contract:$REPO/operator:$REPO/pipeline:$REPO/cli${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$SITE/bin:$PATH" # commands of what is installed there (mooncake_master)

# --- the GPU, torch, transformers and triton --------------------------------------------------------------
if [[ $DEVICE == cuda ]]; then
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv,noheader >&2 ||
            fail "nvidia-smi cannot query the GPU"
    else
        say "no nvidia-smi on PATH; asking torch"
    fi
    command -v cc >/dev/null || command -v gcc >/dev/null ||
        fail "no C compiler (cc/gcc): Triton builds its CUDA launcher with one (flex attention, fused loss)"
    "$PYTHON" - <<'EOF' || fail "torch, transformers and triton must be installed, and torch must see a GPU"
import torch, transformers, triton
assert torch.cuda.is_available(), f"torch {torch.__version__} sees no CUDA device"
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}) on {torch.cuda.get_device_name()}, "
      f"transformers {transformers.__version__}, triton {triton.__version__}")
EOF
else
    "$PYTHON" -c 'import torch, transformers' || fail "torch and transformers must be installed"
fi

# --- the other Python packages -----------------------------------------------------------------------------
# module -> distribution, for what the pipeline and `speculators train` import beyond torch and transformers
# (the list benchmarks/gpu_wheels.sh downloads); prints the distributions to install
missing() {
    "$PYTHON" - <<'EOF'
import importlib.metadata as md
import importlib.util

NEEDED = {
    "speculators": "speculators", "hs_connectors": "hs-connectors", "pydantic": "pydantic",
    "pydantic_core": "pydantic-core", "annotated_types": "annotated-types",
    "typing_inspection": "typing-inspection", "pydantic_settings": "pydantic-settings",
    "dotenv": "python-dotenv", "loguru": "loguru", "psutil": "psutil", "datasets": "datasets",
    "dill": "dill", "multiprocess": "multiprocess", "xxhash": "xxhash", "dateutil": "python-dateutil",
    "six": "six", "aiohttp": "aiohttp", "aiohappyeyeballs": "aiohappyeyeballs", "aiosignal": "aiosignal",
    "attr": "attrs", "frozenlist": "frozenlist", "multidict": "multidict", "propcache": "propcache",
    "yarl": "yarl", "openai": "openai", "jiter": "jiter", "anyio": "anyio", "sniffio": "sniffio",
    "httpx": "httpx", "httpcore": "httpcore", "httpx2": "httpx2", "httpcore2": "httpcore2", "h11": "h11",
    "certifi": "certifi", "idna": "idna", "rich": "rich", "pygments": "pygments",
    "markdown_it": "markdown-it-py", "mdurl": "mdurl", "typer": "typer", "click": "click",
    "shellingham": "shellingham", "annotated_doc": "annotated-doc", "pyarrow": "pyarrow", "pandas": "pandas",
}
PINNED = {"speculators": "0.9.0", "hs-connectors": "0.9.0"}  # the pipeline is written against these
todo = [dist for module, dist in NEEDED.items() if importlib.util.find_spec(module) is None]
for dist, version in PINNED.items():
    try:
        if md.version(dist) != version:
            todo.append(dist)
    except md.PackageNotFoundError:
        pass
print(" ".join(sorted(set(todo))))
EOF
}
TODO=$(missing)
if [[ -n $TODO ]]; then
    [[ -n $WHEELS ]] || fail "missing Python packages: $TODO; fill a directory with benchmarks/gpu_wheels.sh \
on a machine with an index and pass it as --wheels DIR (or EAGLE3_WHEELS)"
    say "installing $TODO from $WHEELS into $SITE"
    mkdir -p "$SITE"
    # shellcheck disable=SC2086  # one word per distribution
    "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-index --no-deps --find-links "$WHEELS" \
        --target "$SITE" --upgrade $TODO
    TODO=$(missing)
    [[ -z $TODO ]] || fail "still missing after installing from $WHEELS: $TODO"
fi
# Optional: Mooncake's transfer engine for the online comparison's mooncake transfer (gpu_wheels.sh --mooncake
# brings it; it also needs Debian's libibverbs1). Without it that part is skipped, with the reason.
if [[ -n $WHEELS ]] && compgen -G "$WHEELS/mooncake_transfer_engine-*.whl" >/dev/null &&
    ! "$PYTHON" -c 'import mooncake' 2>/dev/null; then
    say "installing mooncake-transfer-engine from $WHEELS into $SITE"
    "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-index --no-deps --find-links "$WHEELS" \
        --target "$SITE" --upgrade mooncake-transfer-engine msgpack || say "mooncake-transfer-engine did not install"
fi
"$PYTHON" - <<'EOF' || fail "the pipeline does not import (see above)"
import importlib.metadata as md
import datasets, hs_connectors, safetensors, speculators.cli, speculators.train.cli  # noqa: F401
import eagle3_pipeline.stage_main, eagle3_pipeline.stages.train.draft  # noqa: F401
print(f"speculators {md.version('speculators')}, hs-connectors {md.version('hs-connectors')}, "
      f"datasets {datasets.__version__}")
EOF

((INSTALL_ONLY)) && exit 0

# --- the benchmark, within what is left of the limit -------------------------------------------------------
LEFT=$((LIMIT - SECONDS))
((LEFT > 30)) || fail "only ${LEFT}s of the ${LIMIT}s limit left after the checks"
say "running benchmarks/gpu_pipeline.py ${ARGS[*]} (limit ${LEFT}s)"
set +e
timeout --kill-after=15 "$LEFT" "$PYTHON" "$REPO/benchmarks/gpu_pipeline.py" --json "$OUT/gpu_pipeline.json" \
    --markdown "$OUT/gpu_pipeline.md" --workdir "$WORKDIR" "${ARGS[@]}" 2>&1 | tee "$OUT/gpu_pipeline.log"
CODE=${PIPESTATUS[0]}
set -e
if ((CODE == 124 || CODE == 137)); then
    fail "stopped at the ${LIMIT}s limit; the phases finished by then are in $OUT/gpu_pipeline.json"
fi
((CODE == 0)) || fail "gpu_pipeline.py exited with $CODE (see $OUT/gpu_pipeline.log)"
say "done in ${SECONDS}s: $OUT/gpu_pipeline.json, $OUT/gpu_pipeline.md"
