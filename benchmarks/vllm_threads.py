"""Does a vLLM CPU server's thread setup decide what a canary's speed comparison says (issue 43)?

    EAGLE3_VLLM="$(bash scripts/build-vllm-cpu.sh | tail -n1)" \\
        .venv/bin/python -m benchmarks.vllm_threads --drafts DIR --windows 12 --window-s 9

Pairs of the Prometheus tier's servers (tests/observability/vllm_stack: the tiny verifier with the fitted
draft, `good`, and with the muted one, `bad`; DIR holds the tier's `serving-good` and `serving-bad`, e.g. a
tier run's --basetemp), one pair per vLLM environment in ENVS, all up at once and measured in the same
minutes: in each sub-window one wave of 4 held-out prompts (`--tokens` tokens each) to every server in turn,
the order rotating from sub-window to sub-window, and each server's /metrics read at the sub-window's edges.
Per pair and sub-window it prints both servers' output tokens/s per request (the differences of vLLM's
time-per-output-token histogram's count and sum, as the operator takes them) and the good one's over the
bad one's, then the pair's ratios sorted and their median with its interval (eagle3_contract.api.comparison).
The fitted draft's acceptance length is about 1.3x the muted one's, so a per-request speed that measures the
draft gives about that ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families
from tests.observability import vllm_stack
from tests.observability.vllm_stack import Served, held_out_prompts, send_chats, server_for

from eagle3_contract.api.comparison import compare_rounds
from eagle3_operator.observability.canary_queries import TPOT_COUNT, TPOT_SUM
from eagle3_pipeline.runtime.context import models_root

ENVS = {
    "default": {},
    "one-thread": {"OMP_NUM_THREADS": "1"},
    "one-thread-unbound": {"OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"},
}
PROMPTS = 4
Key = tuple[str, str]  # (environment, draft)


def histogram(url: str) -> tuple[float, float]:
    """(count, sum) of the server's time-per-output-token histogram now."""
    count = total = 0.0
    for family in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=30.0).text):
        for sample in family.samples:
            if sample.name == TPOT_COUNT:
                count += sample.value
            elif sample.name == TPOT_SUM:
                total += sample.value
    return count, total


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--drafts", type=Path, required=True, help="holds serving-good/ and serving-bad/")
    parser.add_argument("--envs", default=",".join(ENVS), help=f"of {', '.join(ENVS)}")
    parser.add_argument("--windows", type=int, default=12)
    parser.add_argument("--window-s", type=float, default=9.0)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--work", type=Path, default=Path("/tmp/eagle3-vllm-threads"))
    args = parser.parse_args()
    os.environ.setdefault("EAGLE3_MODELS_ROOT", str(models_root()))  # where the servers find the verifier
    args.work.mkdir(parents=True, exist_ok=True)
    served: dict[Key, Served] = {}
    for env in args.envs.split(","):
        for draft in ("good", "bad"):
            vllm_stack.SERVER_ENV = ENVS[env]  # server_for passes it to the server it makes
            path = args.drafts / f"serving-{draft}"
            served[(env, draft)] = Served(draft, server_for(f"{env}-{draft}", path, args.work), path)
    prompts = held_out_prompts(models_root(), PROMPTS)
    with ThreadPoolExecutor(max_workers=len(served)) as pool:
        try:
            for future in [pool.submit(s.server.start) for s in served.values()]:
                future.result()
            for s in served.values():  # warm: prefix caches, first-request costs
                send_chats({s.run: s}, prompts, args.tokens)
            measure(served, prompts, args.windows, args.window_s, args.tokens)
        finally:
            for s in served.values():
                s.server.stop()


def measure(
    served: dict[Key, Served], prompts: list[list[dict[str, str]]], windows: int, window_s: float, tokens: int
) -> None:
    keys = list(served)
    start = time.time()
    edges = [{k: histogram(s.server.root_url) for k, s in served.items()}]
    for i in range(windows):
        time.sleep(max(0.0, start + i * window_s + 0.5 - time.time()))
        for key in keys[i % len(keys) :] + keys[: i % len(keys)]:
            send_chats({served[key].run: served[key]}, prompts, tokens)
        time.sleep(max(0.0, start + (i + 1) * window_s - time.time()))
        edges.append({k: histogram(s.server.root_url) for k, s in served.items()})
    for env in dict.fromkeys(k[0] for k in keys):
        speeds: dict[str, list[float | None]] = {"good": [], "bad": []}
        for i in range(windows):
            for draft in speeds:
                (c0, s0), (c1, s1) = edges[i][(env, draft)], edges[i + 1][(env, draft)]
                speeds[draft].append((c1 - c0) / (s1 - s0) if s1 > s0 else None)
            good, bad = speeds["good"][-1], speeds["bad"][-1]
            ratio = f"{good / bad:.2f}" if good and bad else "n/a"
            print(
                f"{env} sub-window {i}: good {good or 0:.1f}, bad {bad or 0:.1f} tokens/s per request:", ratio
            )
        ratios = sorted(g / b for g, b in zip(speeds["good"], speeds["bad"], strict=True) if g and b)
        found = compare_rounds(speeds["bad"], speeds["good"])
        median = f"{statistics.median(ratios):.2f}" if ratios else "n/a"
        print(f"{env} {ENVS[env]}: ratios {[round(r, 2) for r in ratios]}, median {median}")
        print(f"  {found.text() if found else 'no sub-window with both'}")


if __name__ == "__main__":
    main()
