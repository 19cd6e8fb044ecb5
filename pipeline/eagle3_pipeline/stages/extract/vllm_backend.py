"""The vLLM backend of the extract stage: `vllm serve` extracting hidden states, speculators' client.

The server runs the verifier with the `extract_hidden_states` speculative method: every request's hidden
states of `eagle_aux_hidden_state_layer_ids` are written by a KV connector, hs_connectors' `file` backend
(vLLM's ExampleHiddenStatesConnector) or `fp8` backend (FP8HiddenStatesConnector, which needs hs_connectors
installed in vLLM's environment), to a staging directory inside the stage's work directory (without an
accelerator, on vLLM CPU, the `file` backend's connector is the CPU one:
`eagle3_pipeline.serving.kv_transfer`). Each row is sent as token ids with speculators' own client
(`generate_hidden_states_async`, one generated token), the file it names is checked with
`speculators.data_generation.offline.check_hidden_states` and renamed to `hs_{i}.safetensors` (same
filesystem: atomic). vLLM batches up to `--max-num-batched-tokens` = the token budget, so an out-of-memory is
retried at half of it, like the transformers backend.

Tested on vLLM CPU against the transformers backend (tests/pipeline/test_extract_vllm.py).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from eagle3_contract.params import ExtractParams, ExtractTuning
from eagle3_contract.vllm_command import hidden_states_speculative_config
from eagle3_pipeline.data.hidden_states import FP8, SCALES, Layout, encode, file_name, write_atomic
from eagle3_pipeline.runtime.context import StageContext
from eagle3_pipeline.runtime.errors import StageError
from eagle3_pipeline.runtime.reporter import StageReporter
from eagle3_pipeline.serving.kv_transfer import cpu_connector_env, files_config
from eagle3_pipeline.serving.vllm_server import VllmServer, accelerator_present
from eagle3_pipeline.stages.extract.transformers_backend import ExtractStats, RowSource

logger = logging.getLogger(__name__)

STAGING_DIR = "staging"
CPU_CONNECTOR_DIR = "vllm-cpu-connector"  # in the work directory, on vLLM CPU only
MAX_CONCURRENCY = 256
REQUEST_TIMEOUT_S = 600.0  # a long row on a busy server
MAX_RETRIES = 3
HEALTH_INTERVAL_S = 5.0


def kv_transfer_config(layout: Layout, staging: Path, *, cpu: bool = False) -> dict[str, Any]:
    """hs_connectors' own `build_kv_transfer_config` of the `file` or `fp8` backend; on vLLM CPU (`cpu`)
    the CPU connector's (StageError for fp8)."""
    return files_config(layout.transfer, staging, cpu=cpu)


def extract_options(tuning: ExtractTuning, layout: Layout, longest_row: int) -> list[str]:
    """The engine options extraction adds to the verifier's own (before verifier.vllmArgs, which may override
    them); the speculative and KV-transfer configs are the contract's (eagle3_contract.vllm_command)."""
    args = ["--gpu-memory-utilization", str(tuning.gpu_memory_utilization)]
    if layout.dtype != FP8:  # the connector writes the model's dtype; fp8 quantizes from it
        args += ["--dtype", layout.dtype]
    if tuning.max_model_len is None:  # no KV cache for a context longer than the longest row
        args += ["--max-model-len", str(longest_row + 1)]
    return args


def concurrency_for(token_budget: int, seq_lens: Sequence[int]) -> int:
    """Requests in flight: enough rows to fill two scheduler steps of `token_budget` tokens."""
    mean = max(1.0, sum(seq_lens) / max(1, len(seq_lens)))
    return max(1, min(MAX_CONCURRENCY, math.ceil(2 * token_budget / mean)))


def adopt_file(produced: Path, target: Path, token_ids: list[int], layout: Layout) -> int:
    """Check the file vLLM wrote for a row and move it to `target`; its size. ValueError when it is wrong."""
    from safetensors.torch import load_file
    from speculators.data_generation.offline import check_hidden_states

    tensors = load_file(str(produced))
    hidden = tensors["hidden_states"]
    if layout.dtype == FP8:
        if SCALES not in tensors:
            raise ValueError(f"{produced}: no {SCALES}: was vLLM started with the fp8 connector?")
        # check what FP8Transfer hands the trainer (torch has no fp8 min/max on CPU)
        from hs_connectors.fp8_utils import dequantize_fp8_tensor

        check_hidden_states(
            {**tensors, "hidden_states": dequantize_fp8_tensor(hidden, tensors[SCALES])}, token_ids
        )
    else:
        check_hidden_states(tensors, token_ids)
    expected = (len(token_ids), layout.num_layers, layout.hidden_size)
    if tuple(hidden.shape) != expected:
        raise ValueError(f"{produced}: hidden_states has shape {tuple(hidden.shape)}, expected {expected}")
    if layout.dtype != FP8 and hidden.dtype != layout.torch_dtype:
        size = write_atomic(target, encode(hidden, tensors["token_ids"], layout))
        produced.unlink()
        return size
    os.replace(produced, target)
    return target.stat().st_size


async def request_all(
    base_url: str,
    model: str,
    rows: RowSource,
    todo: Sequence[int],
    out_dir: Path,
    layout: Layout,
    concurrency: int,
    check: Callable[[], None] = lambda: None,
    progress: StageReporter | None = None,
) -> ExtractStats:
    """Ask the server for every row in `todo`; `check` raises when the server died (OOM or otherwise).
    `progress` counts each row and its tokens once its file is in place."""
    import openai

    stats = ExtractStats()
    queue: asyncio.Queue[int] = asyncio.Queue()
    for index in todo:
        queue.put_nowait(index)
    started = time.monotonic()
    async with openai.AsyncOpenAI(base_url=base_url, api_key="EMPTY", max_retries=0) as client:
        workers = [
            asyncio.create_task(_worker(client, model, queue, rows, out_dir, layout, stats, progress))
            for _ in range(max(1, min(concurrency, len(todo))))
        ]
        monitor = asyncio.create_task(_monitor(check))
        try:
            pending: set[asyncio.Task[None]] = {*workers, monitor}
            while not all(w.done() for w in workers):  # the monitor never ends by itself
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    error = task.exception()
                    if error is not None:
                        if task is not monitor:
                            check()  # a dead server explains a failed request best (OutOfMemory)
                        raise error
        finally:
            for task in [*workers, monitor]:
                task.cancel()
            await asyncio.gather(*workers, monitor, return_exceptions=True)
    stats.seconds = time.monotonic() - started
    return stats


async def _monitor(check: Callable[[], None]) -> None:
    while True:
        check()
        await asyncio.sleep(HEALTH_INTERVAL_S)


async def _worker(
    client: Any,
    model: str,
    queue: asyncio.Queue[int],
    rows: RowSource,
    out_dir: Path,
    layout: Layout,
    stats: ExtractStats,
    progress: StageReporter | None,
) -> None:
    from speculators.data_generation.vllm_client import generate_hidden_states_async, wait_for_lock_async

    while not queue.empty():
        index = queue.get_nowait()
        ids = rows.token_ids([index])[0]
        try:
            handle, _ = await generate_hidden_states_async(
                client, model, {"input_ids": ids}, timeout=REQUEST_TIMEOUT_S, max_retries=MAX_RETRIES
            )
            lock = handle + ".lock"
            if os.path.exists(lock):
                await wait_for_lock_async(lock)  # type: ignore[no-untyped-call]  # untyped in speculators
            await asyncio.to_thread(adopt_file, Path(handle), out_dir / file_name(index), ids, layout)
        except Exception as exc:
            # Not a StageError: the files extracted so far stay for the next attempt.
            raise RuntimeError(f"hidden states of row {index} ({len(ids)} tokens) failed: {exc}") from exc
        stats.samples += 1
        stats.tokens += len(ids)
        if progress is not None:
            progress.advance(1, len(ids))


def run_vllm(
    ctx: StageContext[ExtractParams, ExtractTuning],
    rows: RowSource,
    todo: Sequence[int],
    layout: Layout,
    token_budget: int,
) -> ExtractStats:
    """Start `vllm serve` for extraction (VllmServer), request every row in `todo`, stop the server."""

    if not todo:
        return ExtractStats()
    staging = ctx.work / STAGING_DIR
    longest = max(rows.seq_lens[i] for i in todo)
    max_model_len = ctx.tuning.max_model_len
    if max_model_len is not None and longest + 1 > max_model_len:
        raise StageError(
            f"a row has {longest} tokens, but spec.verifier.maxModelLen {max_model_len} leaves no room for "
            "the one token vLLM generates per extraction request; raise verifier.maxModelLen above "
            "dataset.maxSequenceLength (or leave it unset)"
        )
    engine = ctx.tuning.engine(ctx.params.verifier)
    cpu = not accelerator_present()
    kv_config = kv_transfer_config(layout, staging, cpu=cpu)
    shutil.rmtree(staging, ignore_errors=True)  # a killed attempt's half-written files
    staging.mkdir(parents=True)
    connector = ctx.work / CPU_CONNECTOR_DIR
    server = VllmServer(
        ctx,
        engine,
        seed=ctx.tuning.seed,
        # vLLM collects the ids sorted and deduplicated: the layout's are, and end with n (file order)
        speculative_config=hidden_states_speculative_config(layout.layer_ids),
        kv_transfer_config=kv_config,
        options=extract_options(ctx.tuning, layout, longest),
        max_num_batched_tokens=token_budget,
        env=cpu_connector_env(connector, os.environ) if cpu else None,
    )
    try:
        with server:
            return asyncio.run(
                request_all(
                    server.base_url,
                    server.model_name,
                    rows,
                    todo,
                    ctx.work,
                    layout,
                    concurrency_for(token_budget, [rows.seq_lens[i] for i in todo]),
                    check=server.check,
                    progress=ctx.progress,
                )
            )
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(connector, ignore_errors=True)
