#!/usr/bin/env bash
# A GPU session in one device call of at most 8 minutes, the machine's start included (docs/gpu.md, "A session
# in one device call"). Each step runs under `timeout` with its time budget, so one that hangs leaves the next
# its time, and writes its figures to $OUT as soon as they exist:
#   check   gpu_pipeline.sh --install-only: the GPU, the C compiler, the packages (the missing ones installed
#           from the wheels into $EAGLE3_GPU_PREFIX/site-packages)
#   bench   gpu_pipeline.py on the 1b verifier, compiled as a user runs it, with empty compile caches:
#           extraction tokens/s against the prefill roofline, our train stage against the stock `speculators
#           train` (tokens/s after the warm-up, compile seconds apart), peak GPU memory; each phase has a
#           budget of its own (--budget PHASE=S) and the JSON is rewritten after every phase
#   models  the tiny verifier for the tier (`eagle3 tiny`: found in --models, else built)
#   tier    pytest -m gpu tests/gpu, training uncompiled (tests/gpu/gpu_support.py): every test's outcome in
#           gpu_tier.log (-v -rA) and gpu_tier.xml (JUnit; on its budget pytest is interrupted and still
#           writes it)
#   report  gpu_session.md and gpu_session.json (also rewritten after every step): each step's outcome
#           against its budget, every test's, and the figures, a missing one said to be missing
#
#   OUT=results bash benchmarks/gpu_session.sh [--dry-run] [--cpu-smoke] [--wheels DIR] [--models DIR]
#       [--budget STEP=S ...] [--skip STEP ...] [--tier-compiled] [--limit S] [-- gpu_pipeline.py options]
#     --dry-run        print the plan (each step, its command, its budget; the total against --limit), exit 0
#     --cpu-smoke      the same steps in their CPU form: the tiny verifier, a few steps, no time limits (each
#                      step's timeout is 10x its budget); the tier skips itself without CUDA; models only
#                      with --models
#     --wheels DIR     what benchmarks/gpu_wheels.sh filled (default wheels-gpu)
#     --models DIR     a models root built here (tiny-llama/, datasets/), carried along: no build there
#     --budget STEP=S  a step's budget in seconds (start check bench models tier report); bench's phases are
#                      gpu_pipeline.py's --budget, after --
#     --skip STEP      leave out bench, models or tier (and its budget)
#     --tier-compiled  the tier compiles, as users train (EAGLE3_GPU_TIER_COMPILE=1; minutes longer)
#     --limit S        the device seconds the plan must fit (default 480)
#     after --         gpu_pipeline.py's options instead of the plan's
#   env: PYTHON (default python3), OUT (default .), WORKDIR (scratch: the verifier, hidden states and compile
#        caches; default ${TMPDIR:-/tmp}), EAGLE3_GPU_PREFIX (as gpu_pipeline.sh)
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-python3}
OUT=${OUT:-.}
WORKDIR=${WORKDIR:-${TMPDIR:-/tmp}}
WHEELS=wheels-gpu
MODELS=""
LIMIT=480
MODE=gpu
DRY_RUN=0
TIER_COMPILED=0
STEPS=(start check bench models tier report)
declare -A BUDGET=([start]=90 [check]=25 [bench]=235 [models]=10 [tier]=110 [report]=10)
declare -A SKIP=()
# `start` is the device tool's: the machine's start and the transfer, before this script runs
START_NOTE="(the machine's start and the transfer, before this script runs)"
# the bench step's phases (gpu_pipeline.py --budget), within its budget less the 5 s timeout grace
BENCH_PHASES=(describe=10 build=20 data=5 vocab=10 extract=25 train=115 stock=45)
BENCH_ARGS=()
while (($#)); do
    case "$1" in
    --dry-run) DRY_RUN=1; shift ;;
    --cpu-smoke) MODE=cpu-smoke; shift ;;
    --wheels) WHEELS=$2; shift 2 ;;
    --models) MODELS=$2; shift 2 ;;
    --budget) BUDGET[${2%%=*}]=${2#*=}; shift 2 ;;
    --skip) SKIP[$2]="--skip $2"; shift 2 ;;
    --tier-compiled) TIER_COMPILED=1; shift ;;
    --limit) LIMIT=$2; shift 2 ;;
    --bench-limit) BUDGET[bench]=$2; shift 2 ;; # the options of the first device runs
    --tier-limit) BUDGET[tier]=$2; shift 2 ;;
    --skip-bench) SKIP[bench]=--skip-bench; shift ;;
    --skip-tier) SKIP[tier]=--skip-tier; shift ;;
    --) shift; BENCH_ARGS=("$@"); break ;;
    -h | --help) sed -n '2,/^set /{/^set /!p}' "$0"; exit 0 ;;
    *) echo "gpu_session.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
die() { echo "gpu_session.sh: $*" >&2; exit 2; }
for step in "${!BUDGET[@]}" "${!SKIP[@]}"; do
    [[ " ${STEPS[*]} " == *" $step "* ]] || die "no step $step (the steps: ${STEPS[*]})"
done
for step in "${STEPS[@]}"; do
    [[ ${BUDGET[$step]} =~ ^[0-9]+$ ]] || die "the budget of $step is seconds, not ${BUDGET[$step]}"
done
for step in start check report; do
    [[ -z ${SKIP[$step]:-} ]] || die "only bench, models and tier can be skipped"
done

SCALE=1 # the steps' timeouts are SCALE x their budgets
DEVICE_ARGS=()
if [[ $MODE == cpu-smoke ]]; then
    SCALE=10 # a loaded CI machine is no device: the smoke run checks the steps, not their time
    DEVICE_ARGS=(--device cpu)
    ((${#BENCH_ARGS[@]})) ||
        BENCH_ARGS=(--size tiny --device cpu --steps 8 --stop-after-steps 6 --peak-tflops 1 --compare stock)
    [[ -n $MODELS ]] || SKIP[models]="the tier skips itself without CUDA; with --models the step runs"
else
    # 60 steps of 2048 tokens (data for them), the first 10 (and any still compiling) left out of the rates,
    # stopped after 50: no checkpoint and no validation (compiling the validation graph takes a minute)
    ((${#BENCH_ARGS[@]})) ||
        BENCH_ARGS=(--size 1b --steps 60 --warmup 10 --stop-after-steps 50 --compare stock)
fi
for phase in "${BENCH_PHASES[@]}"; do
    BENCH_ARGS+=(--budget "${phase%%=*}=$((${phase#*=} * SCALE))")
done

OUT=$(realpath -m "$OUT")
WORKDIR=$(realpath -m "$WORKDIR")
SITE=${EAGLE3_GPU_PREFIX:-${TMPDIR:-/tmp}/eagle3-gpu}/site-packages
export EAGLE3_GPU_PREFIX=${SITE%/site-packages} PYTHONUNBUFFERED=1
SOURCES="$REPO/contract:$REPO/operator:$REPO/pipeline:$REPO/cli:$REPO"
export PYTHONPATH="$SITE:$SOURCES${PYTHONPATH:+:$PYTHONPATH}"
CACHE="$WORKDIR/eagle3-session-cache" # the bench's compile caches (empty at its start), then the tier's
[[ -n $MODELS ]] && MODELS=$(cd "$MODELS" 2>/dev/null && pwd || echo "$MODELS")

# the tier's modules in name order, the benchmark's (two training runs, the longest) last
TIER_ORDER=()
for module in "$REPO"/tests/gpu/test_*.py; do
    [[ $module == */test_benchmark_gpu.py ]] || TIER_ORDER+=("tests/gpu/${module##*/}")
done
TIER_ORDER+=(tests/gpu/test_benchmark_gpu.py)

CHECK_CMD=(bash benchmarks/gpu_pipeline.sh --wheels "$WHEELS" --install-only "${DEVICE_ARGS[@]}")
BENCH_CMD=(env "TRITON_CACHE_DIR=$CACHE/triton" "TORCHINDUCTOR_CACHE_DIR=$CACHE/inductor"
    "$PYTHON" benchmarks/gpu_pipeline.py --json "$OUT/gpu_pipeline.json" --markdown "$OUT/gpu_pipeline.md"
    --workdir "$WORKDIR" "${BENCH_ARGS[@]}")
MODELS_CMD=("$PYTHON" -m eagle3_cli tiny ${MODELS:+--models "$MODELS"})
TIER_ENV=(env "TRITON_CACHE_DIR=$CACHE/triton" ${MODELS:+"EAGLE3_MODELS_ROOT=$MODELS"})
((TIER_COMPILED)) && TIER_ENV+=(EAGLE3_GPU_TIER_COMPILE=1)
TIER_CMD=("${TIER_ENV[@]}" "$PYTHON" -m pytest -p no:cacheprovider -m gpu -v -rA --durations=10
    --junitxml "$OUT/gpu_tier.xml" -o junit_family=xunit2 "${TIER_ORDER[@]}")
REPORT_CMD=("$PYTHON" benchmarks/gpu_session_report.py --out "$OUT" --limit "$LIMIT")

command_of() { # STEP: its command, quoted to be pasted into a shell
    local -n cmd="${1^^}_CMD"
    local quoted
    quoted=$(printf '%q ' "${cmd[@]}")
    quoted=${quoted% }
    echo "${quoted//"$REPO"\//}" # paths in the repository as it sees them: relative to its root
}
budget_of() { # STEP: 0 when skipped
    [[ -n ${SKIP[$1]:-} ]] && echo 0 || echo "${BUDGET[$1]}"
}

phase_sum() {
    local phase sum=0
    for phase in "${BENCH_PHASES[@]}"; do sum=$((sum + ${phase#*=})); done
    echo "$sum"
}

plan() {
    local total=0 step
    echo "gpu_session.sh plan ($MODE): one device call; every step under \`timeout\` with its budget (s)"
    echo "  from the repository's root, with PYTHONPATH=${PYTHONPATH//"$REPO"/.}"
    printf '  %-8s %6s  %s\n' step budget command
    for step in "${STEPS[@]}"; do
        total=$((total + $(budget_of "$step")))
        if [[ $step == start ]]; then
            printf '  %-8s %6d  %s\n' start "${BUDGET[start]}" "$START_NOTE"
        elif [[ -n ${SKIP[$step]:-} ]]; then
            printf '  %-8s %6d  skipped (%s)\n' "$step" 0 "${SKIP[$step]}"
        else
            printf '  %-8s %6d  %s\n' "$step" "${BUDGET[$step]}" "$(command_of "$step")"
        fi
        if [[ $step == bench && -z ${SKIP[bench]:-} ]]; then
            printf '    %s\n' "phases (gpu_pipeline.py --budget, s): ${BENCH_PHASES[*]}; sum $(phase_sum)"
            ((SCALE == 1)) || printf '    %s\n' "(x$SCALE in this mode, as every step's timeout)"
        fi
    done
    printf '  %-8s %6d  %s\n' total "$total" "limit $LIMIT: the start allowance and every step's budget"
    if [[ -z ${SKIP[bench]:-} ]] && (($(phase_sum) > BUDGET[bench] - 5)); then
        echo "gpu_session.sh: the bench phases need $(phase_sum)s, more than its budget less 5" >&2
        return 2
    fi
    if [[ $MODE == gpu && -z $MODELS && -z ${SKIP[models]:-} ]]; then
        echo "  note: no --models: the tiny verifier is built there, minutes beyond the models step's budget"
    fi
    if ((total > LIMIT)); then
        echo "gpu_session.sh: the plan needs ${total}s, more than --limit $LIMIT" >&2
        return 2
    fi
}

check_bench_options() { # gpu_pipeline.py parses the bench's options (no torch, no GPU)
    local settings
    if ! "$PYTHON" -c 'import yaml' 2>/dev/null; then
        echo "  bench options: not checked ($PYTHON cannot import yaml)"
    elif settings=$(cd "$REPO" && "$PYTHON" benchmarks/gpu_pipeline.py --plan-only "${BENCH_ARGS[@]}"); then
        echo "  bench settings: $settings"
    else
        return 2
    fi
}

if ((DRY_RUN)); then
    plan || exit 2
    [[ -n ${SKIP[bench]:-} ]] || check_bench_options || exit 2
    exit 0
fi
plan || exit 2
mkdir -p "$OUT"

say() { echo "gpu_session.sh [$(date -u +%H:%M:%S) ${SECONDS}s]: $*"; }
STEPS_TSV=$OUT/gpu_session.steps.tsv
printf 'step\tbudget\tseconds\texit\tstatus\n' >"$STEPS_TSV"
printf 'start\t%s\t\t\tallowance\n' "${BUDGET[start]}" >>"$STEPS_TSV"
report() { (cd "$REPO" && timeout 5 "${REPORT_CMD[@]}" >/dev/null 2>&1); }
rm -rf "$CACHE" && mkdir -p "$CACHE"
trap 'rm -rf "$CACHE"' EXIT

run_step() { # STEP: its command under `timeout` (the tier's interrupted, so that pytest writes its report)
    local step=$1 budget=$((BUDGET[$1] * SCALE)) started=$SECONDS rc status signal=TERM log
    if [[ -n ${SKIP[$step]:-} ]]; then
        say "$step: skipped"
        printf '%s\t0\t0\t\tskipped\n' "$step" >>"$STEPS_TSV"
        return 0
    fi
    local -n cmd="${step^^}_CMD"
    [[ $step == tier ]] && signal=INT
    log="$OUT/gpu_session.$step.log"
    [[ $step == bench ]] && log="$OUT/gpu_pipeline.log"
    [[ $step == tier ]] && log="$OUT/gpu_tier.log"
    say "$step (budget ${budget}s): $(command_of "$step")"
    (cd "$REPO" && timeout --signal="$signal" --kill-after=5 "$((budget - 5))" "${cmd[@]}" 2>&1) |
        tee "$log"
    rc=${PIPESTATUS[0]}
    case $rc in
    0) status=ok ;;
    124 | 137) status="over budget" ;;
    *) status="failed" ;;
    esac
    if [[ $step == tier && $rc == 5 ]]; then # pytest: no test ran, every module skipped itself (no CUDA)
        status="failed: no test ran"
        [[ $MODE == cpu-smoke ]] && status="ok: every test skipped itself (no CUDA)"
    fi
    say "$step: $status (exit $rc) in $((SECONDS - started))s of ${budget}s"
    printf '%s\t%s\t%s\t%s\t%s\n' "$step" "$budget" "$((SECONDS - started))" "$rc" "$status" >>"$STEPS_TSV"
    report
    [[ $status == ok* ]]
}

failed=0
for step in check bench models tier; do
    run_step "$step" || failed=1
done
run_step report || failed=1
say "done (exit $failed): $OUT/gpu_session.md"
exit $failed
