#!/usr/bin/env bash
# One short device session, as one prepared script: the GPU benchmark (benchmarks/gpu_pipeline.sh, which also
# installs the missing packages from the wheels), then the GPU test tier (tests/gpu) with the same packages,
# each under its own limit so that a hang in one leaves the other its time. The tier's report goes to
# $OUT/gpu_tier.log, the benchmark's files to $OUT (docs/gpu.md).
#
#   OUT=results bash benchmarks/gpu_session.sh [--wheels DIR] [--models DIR] [--bench-limit S] [--tier-limit S]
#                                             [--skip-bench] [--skip-tier] [-- gpu_pipeline.py options]
#     --wheels DIR     what benchmarks/gpu_wheels.sh filled (default wheels-gpu)
#     --models DIR     a models root built elsewhere (tiny-llama/, datasets/): skips the tiny verifier's build
#     --bench-limit S  the benchmark's limit, checks and installs included (default 240)
#     --tier-limit S   the tier's limit (default 200)
#     after --          options for gpu_pipeline.py (default: --size 1b --steps 100 --compare stock)
#   env: PYTHON (default python3), OUT (default .), EAGLE3_GPU_PREFIX (as gpu_pipeline.sh)
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-python3}
OUT=${OUT:-.}
WHEELS=wheels-gpu
MODELS=""
BENCH_LIMIT=240
TIER_LIMIT=200
BENCH=1
TIER=1
BENCH_ARGS=(--size 1b --steps 100 --compare stock)
# the tier's modules in name order, but the benchmark's (two training runs, the longest) last: a limit that
# runs out then loses the least
TIER_ORDER=()
for module in "$REPO"/tests/gpu/test_*.py; do
    [[ $module == */test_benchmark_gpu.py ]] || TIER_ORDER+=("$module")
done
TIER_ORDER+=("$REPO/tests/gpu/test_benchmark_gpu.py")
while (($#)); do
    case "$1" in
    --wheels) WHEELS=$2; shift 2 ;;
    --models) MODELS=$2; shift 2 ;;
    --bench-limit) BENCH_LIMIT=$2; shift 2 ;;
    --tier-limit) TIER_LIMIT=$2; shift 2 ;;
    --skip-bench) BENCH=0; shift ;;
    --skip-tier) TIER=0; shift ;;
    --) shift; BENCH_ARGS=("$@"); break ;;
    -h | --help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "gpu_session.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
say() { echo "gpu_session.sh [$(date -u +%H:%M:%S) ${SECONDS}s]: $*"; }

# gpu_pipeline.sh checks the GPU and the packages (and prints their versions), and installs what is missing
# into $EAGLE3_GPU_PREFIX/site-packages, which the tier then imports from
export PYTHONUNBUFFERED=1 EAGLE3_GPU_PREFIX=${EAGLE3_GPU_PREFIX:-${TMPDIR:-/tmp}/eagle3-gpu}
SITE=$EAGLE3_GPU_PREFIX/site-packages
[[ -n $MODELS ]] && export EAGLE3_MODELS_ROOT=$(cd "$MODELS" && pwd)

status=0
if ((BENCH)); then
    say "benchmark: gpu_pipeline.sh ${BENCH_ARGS[*]} (limit ${BENCH_LIMIT}s)"
    OUT=$OUT bash "$REPO/benchmarks/gpu_pipeline.sh" --wheels "$WHEELS" --timeout "$BENCH_LIMIT" "${BENCH_ARGS[@]}"
    rc=$?; say "benchmark exit $rc"; ((rc)) && status=1
fi
if ((TIER)); then
    if ((!BENCH)); then # the benchmark installs the missing packages; without it, only install them
        bash "$REPO/benchmarks/gpu_pipeline.sh" --wheels "$WHEELS" --install-only || status=1
    fi
    say "GPU tier: pytest -m gpu tests/gpu (limit ${TIER_LIMIT}s)"
    (cd "$REPO" && PYTHONPATH="$SITE:$REPO/contract:$REPO/operator:$REPO/pipeline:$REPO/cli:$REPO" \
        timeout -k 10 "$TIER_LIMIT" "$PYTHON" -m pytest -p no:cacheprovider -m gpu "${TIER_ORDER[@]}" -rA --durations=10 \
        2>&1 | tee "$OUT/gpu_tier.log")
    rc=$?; say "GPU tier exit $rc"; ((rc)) && status=1
fi
say "done (exit $status)"
exit $status
