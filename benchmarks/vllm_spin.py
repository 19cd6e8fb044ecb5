"""Does an idle vLLM CPU server keep a core busy after its last answer, with and without V1 multiprocessing?

    EAGLE3_VLLM="$(bash scripts/build-vllm-cpu.sh | tail -n1)" .venv/bin/python -m benchmarks.vllm_spin

evaluate's rounds (eagle3_pipeline.stages.evaluate.rounds) pause SETTLE_S where they move from one server to
another, because vLLM's model worker busy-polls its shared-memory queue for 1 s after its last step
(vllm/distributed/device_communicators/shm_broadcast.py, SpinCondition's busy_loop_s). That queue joins the
engine core and a worker in a process of its own, which vLLM CPU runs unless V1 multiprocessing is off
(VLLM_ENABLE_V1_MULTIPROCESSING=0, what the test suite sets). For each setting this starts one server of the
tiny verifier, answers --requests chats of --tokens tokens (greedy, all in flight), then reads the CPU time
of the server's whole process group from /proc every --step seconds for --seconds, and prints the CPU-s
each interval took. Repeated --repeats times on the same server.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from eagle3_pipeline.runtime.context import models_root
from eagle3_pipeline.runtime.process_group import group_members
from eagle3_pipeline.serving.vllm_server import free_port

CLOCK = os.sysconf("SC_CLK_TCK")


def group_cpu_s(pgid: int) -> float:
    """User and system CPU seconds of every live process in the process group."""
    total = 0
    for pid in group_members(pgid):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (after "pid (comm) ": state is field 0)
    return total / CLOCK


def serve(vllm: str, model: Path, multiprocessing: str, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = os.environ | {
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": multiprocessing,
    }
    argv = [
        vllm,
        "serve",
        str(model),
        "--port",
        str(port),
        "--served-model-name",
        "m",
        "--max-model-len",
        "512",
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"vLLM exited {proc.returncode}; log: {log}")
        try:
            if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(1)
    sys.exit(f"vLLM did not start in 600 s; log: {log}")


def answer(url: str, requests: int, tokens: int) -> None:
    def one(i: int) -> None:
        body = {
            "model": "m",
            "messages": [{"role": "user", "content": f"Count from {i} onwards, one number a line."}],
            "max_tokens": tokens,
            "temperature": 0.0,
        }
        httpx.post(url + "/v1/chat/completions", json=body, timeout=300).raise_for_status()

    with ThreadPoolExecutor(requests) as pool:
        list(pool.map(one, range(requests)))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=2.5)
    parser.add_argument("--step", type=float, default=0.25)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    vllm = os.environ.get("EAGLE3_VLLM") or sys.exit("set EAGLE3_VLLM to vLLM CPU's vllm")
    model = models_root() / "tiny-llama"
    work = Path(tempfile.mkdtemp(prefix="vllm-spin-"))
    for multiprocessing in ("1", "0"):
        proc, url = serve(vllm, model, multiprocessing, work / f"vllm-mp{multiprocessing}.log")
        try:
            answer(url, args.requests, 1)  # warm
            for repeat in range(args.repeats):
                answer(url, args.requests, args.tokens)
                before, steps = group_cpu_s(proc.pid), []
                for _ in range(round(args.seconds / args.step)):
                    time.sleep(args.step)
                    now = group_cpu_s(proc.pid)
                    steps.append(now - before)
                    before = now
                shown = " ".join(f"{s:.2f}" for s in steps)
                print(
                    f"V1 multiprocessing {multiprocessing}, repeat {repeat + 1}: "
                    f"CPU-s per {args.step} s: {shown}"
                )
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(60)


if __name__ == "__main__":
    main()
