"""`eagle3 stage extract`: hidden states of the verifier's chosen layers for every prepared row.

Output (`extract/<hash>`): `hs_{i}.safetensors` per dataset row i in speculators' format (see
`eagle3_pipeline.data.hidden_states`), read by the trainer with `hs_connectors.FileTransfer(<output>)` (or
`FP8Transfer` for fp8, as `metadata.json`'s `transfer` says), plus `metadata.json`: layer ids, hidden size,
dtype, verifier, samples and tokens. Resumable: files finished by a killed or out-of-memory attempt are
checked and kept; an out-of-memory exits with the OOM code, and the retry runs at half the token budget.
Progress: samples done of all (the kept files count as done), their tokens, and the token budget.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from eagle3_contract.api.rules import verifier_config_problems
from eagle3_contract.api.spec import ExtractionBackend
from eagle3_contract.params import ExtractParams, ExtractTuning, VerifierRef
from eagle3_pipeline.data.hidden_states import (
    METADATA_FILE,
    Layout,
    file_name,
    plan_batches,
    resolve_aux_layers,
    scan_done,
    total_bytes,
)
from eagle3_pipeline.data.verifier import LocalVerifier, verifier_dims
from eagle3_pipeline.runtime.context import StageContext
from eagle3_pipeline.runtime.errors import StageError
from eagle3_pipeline.stages.extract import transformers_backend as tf
from eagle3_pipeline.stages.extract.rows import PreparedRows
from eagle3_pipeline.stages.extract.transformers_backend import ExtractStats
from eagle3_pipeline.stages.extract.vllm_backend import run_vllm

logger = logging.getLogger(__name__)


Context = StageContext[ExtractParams, ExtractTuning]


def fail_on_verifier_config(
    ref: LocalVerifier, layers: Sequence[int] | None, tensor_parallel_size: int
) -> None:
    """StageError for what the verifier's config rules out, before any weight or row is loaded: the check
    `eagle3 run` makes on a local config.json, here where the model is at hand (the API server cannot)."""
    local = Path(ref.path) / "config.json"
    try:
        if local.is_file():
            config = json.loads(local.read_text())
        else:
            from transformers import AutoConfig

            config = AutoConfig.from_pretrained(
                ref.path, revision=ref.revision, trust_remote_code=ref.trust_remote_code
            ).to_dict()
    except (OSError, ValueError):
        return  # verifier_dims reports an unreadable config with its own advice
    if not isinstance(config, dict):
        return
    problems = verifier_config_problems(config, tensor_parallel_size=tensor_parallel_size, layers=layers)
    if problems:
        raise StageError(f"the verifier {ref.path} cannot run this spec: " + "; ".join(problems))


def run(ctx: Context) -> dict[str, Any]:
    started = time.monotonic()
    params = ctx.params
    v = params.verifier
    ref = LocalVerifier(ctx.local_path(v.model), v.revision, v.trust_remote_code)
    fail_on_verifier_config(ref, params.layers, ctx.tuning.tensor_parallel_size)
    source = ctx.data_input()
    shape = verifier_dims(ref)
    layout = Layout(
        aux_layers=resolve_aux_layers(params.layers, shape.num_hidden_layers),
        num_hidden_layers=shape.num_hidden_layers,
        hidden_size=shape.hidden_size,
        dtype=params.dtype.value,
    )
    rows = PreparedRows.load(source, shape.vocab_size)
    budget = ctx.token_budget if ctx.token_budget is not None else ctx.tuning.token_budget
    done = scan_done(ctx.work, rows.seq_lens, layout)
    todo = [i for i in range(len(rows)) if i not in done]
    logger.info(
        "extract: %d rows (%d tokens) from %s, %d done already; layers %s of %d, hidden %d, %s, budget %d",
        len(rows),
        rows.total_tokens,
        source,
        len(done),
        layout.layer_ids,
        shape.num_hidden_layers,
        shape.hidden_size,
        layout.dtype,
        budget,
    )
    ctx.progress.set_token_budget(budget)
    ctx.progress.begin("samples", len(rows), done=len(done))
    backend = ctx.tuning.backend
    if backend == ExtractionBackend.VLLM:
        stats = run_vllm(ctx, rows, todo, layout, budget)
    else:
        stats = _run_transformers(ctx, ref, rows, todo, layout, budget)
    return _finish(ctx, rows, layout, stats, resumed=len(done), budget=budget, started=started)


def _run_transformers(
    ctx: Context, ref: LocalVerifier, rows: PreparedRows, todo: list[int], layout: Layout, budget: int
) -> ExtractStats:
    batches = plan_batches([(i, rows.seq_lens[i]) for i in todo], budget)  # before loading the model
    if not batches:
        return ExtractStats()
    if ctx.tuning.tensor_parallel_size > 1:
        logger.warning("the transformers backend runs on one device; verifier.tensorParallelSize is ignored")
    device = tf.pick_device()
    model = tf.load_verifier(ref, device)
    extractor = tf.TransformersExtractor(model, layout)
    logger.info("extracting %d rows in %d batches on %s", len(todo), len(batches), device)
    return tf.extract(extractor, batches, rows, ctx.work, budget, ctx.progress)


def metadata_of(verifier: VerifierRef, layout: Layout, *, samples: int, tokens: int) -> dict[str, Any]:
    """`metadata.json`: what the train stage needs to read the files (the layers, the transfer to use)."""
    return {
        "format": "speculators hs_{i}.safetensors (hidden_states [T, L, H], token_ids [T])",
        "transfer": layout.transfer,
        "layers": layout.layer_ids,
        "auxLayers": list(layout.aux_layers),
        "numHiddenLayers": layout.num_hidden_layers,
        "hiddenSize": layout.hidden_size,
        "dtype": layout.dtype,
        "verifier": verifier.model_dump(mode="json", by_alias=True),
        "samples": samples,
        "tokens": tokens,
    }


def _finish(
    ctx: Context,
    rows: PreparedRows,
    layout: Layout,
    stats: ExtractStats,
    *,
    resumed: int,
    budget: int,
    started: float,
) -> dict[str, Any]:
    missing = [i for i in range(len(rows)) if not (ctx.work / file_name(i)).is_file()]
    if missing:  # not a StageError: what was extracted stays for the next attempt
        raise RuntimeError(f"extract: no hidden states for rows {missing[:10]} ({len(missing)} rows)")
    size = total_bytes(ctx.work, range(len(rows)))
    tokens = rows.total_tokens
    metadata = metadata_of(ctx.params.verifier, layout, samples=len(rows), tokens=tokens)
    (ctx.work / METADATA_FILE).write_text(json.dumps(metadata, indent=2) + "\n")
    result = {
        "samples": len(rows),
        "tokens": tokens,
        "seconds": round(time.monotonic() - started, 3),
        "extractedSamples": stats.samples,
        "extractedTokens": stats.tokens,
        "extractSeconds": round(stats.seconds, 3),
        "tokensPerSecond": round(stats.tokens / stats.seconds, 1) if stats.seconds > 0 else 0.0,
        "bytes": size,
        "bytesPerToken": round(size / tokens, 1) if tokens else 0.0,
        "layers": layout.layer_ids,
        "hiddenSize": layout.hidden_size,
        "dtype": layout.dtype,
        "transfer": layout.transfer,
        "backend": ctx.tuning.backend.value,
        "tokenBudget": budget,
        "resumed": resumed,
    }
    logger.info("extract: done: %s", result)
    return result
