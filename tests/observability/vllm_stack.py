"""Two vLLM CPU servers for the tier, serving the tiny verifier as the operator's Deployment would.

`good` serves the quickly fitted draft of tests/pipeline (mean acceptance length about 1.5 with k = 3).
`bad` serves a wrong draft of which vLLM accepts not a single token: the fitted draft with its d2t mapping
every draft token onto the verifier's BOS token, which the verifier never emits (`mute_mapping`). A shuffled
mapping (tests/pipeline's `shuffle_mapping`) is not enough for that: a few of its tokens still hit (3 of 372
in a trial), and the no-accepted-tokens alert is about a draft that does not fit at all.

Both are slim serving checkpoints, as the evaluate and export stages write them, and both serve under the
verifier's path as the served model name, as the Deployment does (`vllm serve /models/...`), so vLLM's
`model_name` label equals the operator's `model` label.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import torch

from eagle3_contract.api.spec import Eagle3RunSpec
from eagle3_contract.stages import Stage
from eagle3_contract.vllm_command import VllmEngine, draft_speculative_config
from eagle3_operator.builders.capture import capture_args
from eagle3_pipeline.data.draft_checkpoint import write_serving_checkpoint
from eagle3_pipeline.runtime.context import StageContext
from eagle3_pipeline.serving.spec_metrics import SpecDecodeCounters, parse_counters
from eagle3_pipeline.serving.vllm_server import VllmServer
from tests.pipeline.capture_support import mount
from tests.pipeline.draft_support import DATASET, conversations, evaluate_spec, shared_draft

MODEL = evaluate_spec()["verifier"]["model"]  # /models/tiny-llama, what the operator's `model` label says
NUM_SPECULATIVE_TOKENS = 3
MAX_TOKENS = 24
MAX_NUM_SEQS = 4
SETTLE_S = 30.0
# One OpenMP thread per server, as vLLM's CPU backend means to serve ("Reducing Torch threads from 2 to 1 for
# serving", a call it then skips: "doesn't allow to use `torch.set_num_threads` after the thread binding").
# Without it each server runs the model with one thread per core, and two servers plus the machine's other
# tenants on two cores wait at OpenMP barriers for a sibling thread that is not running. With it, vLLM binds
# its one model thread to a core and leaves the other to its scheduler processes. Measured in the same
# minutes on the shared 2-core machine (load average 6 to 8; 12 sub-windows of one 32-token wave of 4
# prompts to each of two pairs of servers in turn, docs/benchmarks.md): the fitted draft over the muted one,
# per request, median 0.93x (the fitted draft's speedup gone) by default, 1.28x with one thread, as its
# acceptance length (1.32x) says.
SERVER_ENV = {"OMP_NUM_THREADS": "1"}
BOS = 0  # the tiny verifier's <|begin_of_text|>
CAPTURING = "good"  # the run whose server records its requests (serving.capture, sampleRate 1)


@dataclass
class Served:
    """One run's vLLM server and what the tier sent it."""

    run: str
    server: VllmServer
    draft: Path
    completion_tokens: int = 0

    @property
    def metrics_target(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    def counters(self) -> SpecDecodeCounters:
        """The spec-decode counters on the server's /metrics page now."""
        response = httpx.get(self.server.root_url + "/metrics", timeout=30.0)
        response.raise_for_status()
        counters = parse_counters(response.text, MODEL)
        assert counters is not None, f"{self.run}: the server exports no vllm:spec_decode_* counters"
        return counters

    def settled_counters(self) -> SpecDecodeCounters:
        """The counters once they count every token returned (vLLM records a step as it returns it)."""
        deadline = time.monotonic() + SETTLE_S
        while True:
            counters = self.counters()
            if counters.generation_tokens >= self.completion_tokens or time.monotonic() > deadline:
                return counters
            time.sleep(0.2)


def mute_mapping(draft: Path, out: Path, token: int = BOS) -> Path:
    """A copy of `draft` whose d2t maps every draft token onto target `token`: whatever the draft proposes,
    vLLM checks `token` (t2d is left alone: vLLM reads d2t only)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(draft, out)
    tensors = load_file(str(out / "model.safetensors"))
    tensors["d2t"] = token - torch.arange(len(tensors["d2t"]), dtype=tensors["d2t"].dtype)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def make_drafts(models: Path, base: Path) -> dict[str, Path]:
    """Slim serving checkpoints under `base`: `good` (the fitted draft) and `bad` (its mapping muted)."""
    fitted = shared_draft(models, base)
    muted = base / "draft-muted"
    if not muted.exists():
        mute_mapping(fitted, muted)
    out = {}
    for run, source in (("good", fitted), ("bad", muted)):
        out[run] = write_serving_checkpoint(source, base / f"serving-{run}", MODEL).path
    return out


def spec() -> Eagle3RunSpec:
    return Eagle3RunSpec.model_validate(evaluate_spec())


def server_for(run: str, draft: Path, work: Path) -> VllmServer:
    """`run`'s server; `good`'s captures every request, as a pod with serving.capture does (the dashboard's
    capture row reads its counters)."""
    served = spec()
    ctx = StageContext.of_spec(Stage.EVALUATE, run, served, work / "artifacts", work / run / "out")
    env, extra = dict(SERVER_ENV), ["--max-num-seqs", str(MAX_NUM_SEQS)]
    if run == CAPTURING:
        env |= {
            "PYTHONPATH": str(mount(work / "python")),
            "EAGLE3_CAPTURE_DIR": str(work / "capture"),
            "EAGLE3_CAPTURE_SOURCE": run,
            "EAGLE3_CAPTURE_SAMPLE_RATE": "1",
        }
        extra += capture_args()
    return VllmServer(
        ctx,
        VllmEngine.of(served.verifier),
        seed=served.dataset.seed,
        speculative_config=draft_speculative_config(str(draft), NUM_SPECULATIVE_TOKENS),
        extra_args=extra,
        served_model_name=MODEL,
        startup_timeout_s=600.0,
        stop_grace_s=10.0,
        log_path=work / f"vllm-{run}.log",
        env=env,
    )


@contextmanager
def serving(drafts: dict[str, Path], work: Path) -> Iterator[dict[str, Served]]:
    """Start every run's server at once; stop them all on exit.

    Each server starts in a worker thread that lives until the servers are stopped: VllmServer asks the
    kernel to SIGTERM the server when the thread that spawned it ends.
    """
    served = {run: Served(run, server_for(run, draft, work), draft) for run, draft in drafts.items()}
    with ExitStack() as stack:
        pool = stack.enter_context(ThreadPoolExecutor(max_workers=len(served)))
        for s in served.values():
            stack.callback(s.server.stop)  # runs before the pool shuts down
        futures = [pool.submit(s.server.start) for s in served.values()]
        for future in futures:
            future.result()
        yield served


def held_out_prompts(models: Path, count: int) -> list[list[dict[str, str]]]:
    """The first user turns of the dataset's validation rows."""
    rows = [r for r in conversations(models / DATASET) if r["split"] == "val"]
    prompts = []
    for row in rows[:count]:
        first = next(m for m in row["messages"] if m["role"] == "user")
        prompts.append([{"role": "user", "content": str(first["content"])}])
    return prompts


async def _send(served: Served, prompts: list[list[dict[str, str]]], tokens: int | None) -> None:
    from openai import AsyncOpenAI

    # `tokens`: every answer exactly that long (vLLM's sampling extras: no stop at EOS, at least `tokens`)
    fixed = {"ignore_eos": True, "min_tokens": tokens} if tokens else None

    client = AsyncOpenAI(base_url=served.server.base_url, api_key="unused", max_retries=1, timeout=300.0)
    semaphore = asyncio.Semaphore(MAX_NUM_SEQS)

    async def one(messages: list[dict[str, str]]) -> None:
        async with semaphore:
            response = await client.chat.completions.create(
                model=MODEL,
                messages=messages,  # type: ignore[arg-type]
                max_tokens=tokens or MAX_TOKENS,
                temperature=0.0,
                extra_body=fixed,
            )
        served.completion_tokens += response.usage.completion_tokens if response.usage else 0

    try:
        await asyncio.gather(*(one(p) for p in prompts))
    finally:
        await client.close()


def send_chats(
    servers: dict[str, Served], prompts: list[list[dict[str, str]]], tokens: int | None = None
) -> None:
    """Greedy chat completions to every server at once (MAX_NUM_SEQS in flight each): up to MAX_TOKENS each,
    or exactly `tokens` (past the end of sentence)."""

    async def all_servers() -> None:
        await asyncio.gather(*(_send(s, prompts, tokens) for s in servers.values()))

    asyncio.run(all_servers())
