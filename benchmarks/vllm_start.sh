#!/usr/bin/env bash
# What one vLLM CPU server costs to start: `vllm serve` of a model until /v1/models answers, its wall seconds
# and the CPU seconds of its process group (utime + stime of every member, /proc/<pid>/stat), with the model
# worker apart (vLLM's default: three processes on CPU) and in the engine core
# (VLLM_ENABLE_V1_MULTIPROCESSING=0, what the test suite sets). docs/benchmarks.md, "One process fewer".
#
#   bash benchmarks/vllm_start.sh MODEL_DIR      (the vLLM is $EAGLE3_VLLM, else `vllm` on PATH)
#   e.g. bash benchmarks/vllm_start.sh "$(.venv/bin/python -m eagle3_cli tiny)/tiny-llama" with
#        EAGLE3_VLLM set to the path scripts/build-vllm-cpu.sh prints
set -euo pipefail
MODEL=${1:?usage: vllm_start.sh MODEL_DIR}
VLLM=${EAGLE3_VLLM:-$(command -v vllm || true)}
[[ -x $VLLM ]] || { echo "no vLLM: set EAGLE3_VLLM (scripts/build-vllm-cpu.sh prints it)" >&2; exit 2; }
LOGS=$(mktemp -d)
trap 'rm -rf "$LOGS"' EXIT
TICK=$(getconf CLK_TCK)

one() { # MULTIPROCESSING PORT: prints "processes wall_s cpu_s"
    local start pid ticks=0 n=0
    start=$(date +%s.%N)
    HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1 VLLM_ENABLE_V1_MULTIPROCESSING=$1 setsid "$VLLM" serve "$MODEL" \
        --host 127.0.0.1 --port "$2" --enforce-eager --max-model-len 512 >"$LOGS/vllm-$1.log" 2>&1 &
    pid=$!
    until curl -sf "http://127.0.0.1:$2/v1/models" >/dev/null; do
        kill -0 "$pid" 2>/dev/null || { tail -20 "$LOGS/vllm-$1.log" >&2; exit 1; }
        sleep 0.2
    done
    local wall
    wall=$(echo "$(date +%s.%N) - $start" | bc)
    for member in $(pgrep -g "$pid"); do
        ticks=$((ticks + $(awk '{print $14 + $15}' "/proc/$member/stat"))) && n=$((n + 1))
    done
    kill -- -"$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    printf '%d %.1f %.1f\n' "$n" "$wall" "$(echo "$ticks / $TICK" | bc -l)"
}

port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
echo "| | processes | wall s | CPU s |"
echo "| --- | ---: | ---: | ---: |"
read -r n wall cpu < <(one 1 "$(port)")
echo "| worker apart (vLLM's default on CPU) | $n | $wall | $cpu |"
read -r n wall cpu < <(one 0 "$(port)")
echo "| worker in the engine core | $n | $wall | $cpu |"
