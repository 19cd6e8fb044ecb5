"""What serving.capture costs a request: latency with capture on and off, at concurrency 1 and 4.

    EAGLE3_VLLM="$(bash scripts/build-vllm-cpu.sh | tail -n1)" .venv/bin/python -m benchmarks.capture_overhead

Two vLLM CPU servers of the tiny verifier with the same fitted draft, up together: `off`, and `on` with the
capture package loaded as a serving pod loads it (every request recorded: sampleRate 1, the worst case).
For each concurrency, --rounds rounds alternate the two (the order flips each round); a round sends the
same --prompts held-out first user turns (greedy, at most --tokens tokens each) to one server with that many
in flight and times each request to its last byte. Prints each arm's p50 and p99 over all its requests, the
median over rounds of the per-round p50 ratio (on / off) with its lowest and highest, and the records the
`on` server counted (written, dropped, failed) from its /metrics.

`--in-process` measures the middleware alone instead, without vLLM: the time a request spends in it, in
microseconds, around an ASGI app that answers at once (a chat of about 1 KB, an answer of about 4 KB, its
body in 8 pieces as a stream sends it), bare, passed through unsampled, and captured (the writer thread
writing meanwhile). The server figures are the end-to-end check; this one is below their noise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from tests.observability.vllm_stack import held_out_prompts
from tests.pipeline.capture_support import MODEL, server, serving_draft

from eagle3_contract.capture.config import CaptureConfig
from eagle3_contract.capture.middleware import CaptureMiddleware
from eagle3_contract.capture.recorder import Recorder
from eagle3_pipeline.runtime.context import models_root
from eagle3_pipeline.serving.vllm_server import VllmServer


def timed(base: str, messages: list[dict[str, str]], tokens: int) -> float:
    body = {"model": MODEL, "messages": messages, "max_tokens": tokens, "temperature": 0.0}
    started = time.perf_counter()
    httpx.post(f"{base}/chat/completions", json=body, timeout=300).raise_for_status()
    return time.perf_counter() - started


def one_round(
    srv: VllmServer, prompts: list[list[dict[str, str]]], concurrency: int, tokens: int
) -> list[float]:
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        return list(pool.map(lambda m: timed(srv.base_url, m, tokens), prompts))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def records(srv: VllmServer) -> dict[str, float]:
    text = httpx.get(f"{srv.root_url}/metrics", timeout=30).text
    out = {}
    for line in text.splitlines():
        if line.startswith("eagle3_capture_records_total{"):
            outcome = line.split('outcome="', 1)[1].split('"', 1)[0]
            out[outcome] = float(line.rsplit(" ", 1)[1])
    return out


def measure(servers: dict[str, VllmServer], args: argparse.Namespace, concurrency: int) -> None:
    prompts = held_out_prompts(models_root(), args.prompts)
    for srv in servers.values():
        one_round(srv, prompts, concurrency, args.tokens)  # warm: the prefix cache, the first batches
    latencies: dict[str, list[float]] = {name: [] for name in servers}
    ratios = []
    for i in range(args.rounds):
        p50 = {}
        for name in sorted(servers, reverse=bool(i % 2)):
            got = one_round(servers[name], prompts, concurrency, args.tokens)
            latencies[name] += got
            p50[name] = statistics.median(got)
        ratios.append(p50["on"] / p50["off"])
    for name, values in sorted(latencies.items()):
        print(
            f"concurrency {concurrency} capture {name}: p50 {percentile(values, 0.5) * 1000:.1f} ms, "
            f"p99 {percentile(values, 0.99) * 1000:.1f} ms over {len(values)} requests"
        )
    print(
        f"concurrency {concurrency} p50 on/off per round: median {statistics.median(ratios):.3f} "
        f"[{min(ratios):.3f}, {max(ratios):.3f}] over {len(ratios)} rounds"
    )


def in_process(requests: int) -> None:
    request = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x" * 1000}]}).encode()
    answer = json.dumps({"choices": [{"message": {"content": "y" * 4000}, "finish_reason": "stop"}]}).encode()
    pieces = [answer[i : i + len(answer) // 8 + 1] for i in range(0, len(answer), len(answer) // 8 + 1)]

    async def app(scope: object, receive: object, send: object) -> None:
        await receive()  # type: ignore[operator]
        await send({"type": "http.response.start", "status": 200, "headers": []})  # type: ignore[operator]
        for piece in pieces:
            await send({"type": "http.response.body", "body": piece, "more_body": True})  # type: ignore[operator]
        await send({"type": "http.response.body", "body": b""})  # type: ignore[operator]

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": request}

    async def send(message: object) -> None:
        return None

    async def per_request_us(handler: object) -> float:
        scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions"}
        started = time.perf_counter()
        for _ in range(requests):
            await handler(scope, receive, send)  # type: ignore[operator]
        return (time.perf_counter() - started) / requests * 1e6

    directory = Path(tempfile.mkdtemp(prefix="capture-micro-"))
    for name, rate in (("bare", None), ("not sampled", 0.0), ("captured", 1.0)):
        handler: object = app
        if rate is not None:
            recorder = Recorder(
                CaptureConfig(directory=directory, source=name.replace(" ", "-"), sample_rate=rate)
            )
            handler = CaptureMiddleware(app, recorder, random.Random(0))
        figures = [asyncio.run(per_request_us(handler)) for _ in range(5)]
        print(f"in process, {name}: {statistics.median(figures):.1f} us a request (median of 5 x {requests})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--in-process", action="store_true", help="the middleware alone, no vLLM")
    args = parser.parse_args()
    if args.in_process:
        in_process(2000)
        return
    work = Path(tempfile.mkdtemp(prefix="capture-overhead-"))
    draft = serving_draft(models_root(), work, work)
    servers = {
        "off": server("off", draft, work, None),
        "on": server("on", draft, work, work / "capture", segment_seconds=5.0),
    }
    try:
        for (
            srv
        ) in servers.values():  # from this thread: a server is stopped when the thread that started it ends
            srv.start()
        for concurrency in args.concurrency:
            measure(servers, args, concurrency)
        print(f"records counted by the capturing server: {records(servers['on'])}")
    finally:
        for srv in servers.values():
            srv.stop()


if __name__ == "__main__":
    main()
