"""prepare: a chat dataset to token ids and assistant-only loss masks, split, with token frequencies.

Progress: rows tokenized of the rows read, their tokens, and the skipped rows as failures by reason.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from eagle3_contract.params import PrepareParams, PrepareTuning
from eagle3_pipeline.data.conversations import Skips, load_conversations
from eagle3_pipeline.data.dataset_files import local_fingerprint
from eagle3_pipeline.data.prepared import (
    CONVERSATIONS_FILE,
    Tokenizing,
    assign_splits,
    write_conversations,
    write_prepared,
)
from eagle3_pipeline.data.verifier import estimated_shape
from eagle3_pipeline.runtime.context import StageContext
from eagle3_pipeline.runtime.errors import StageError

logger = logging.getLogger(__name__)


def run(ctx: StageContext[PrepareParams, PrepareTuning]) -> dict[str, Any]:
    started = time.monotonic()
    ctx.progress.begin("rows")  # how many: once they are read
    ds = ctx.params.dataset
    source = ctx.local_path(ds.source)
    files = local_fingerprint(source)  # recorded so `eagle3 run` can tell files edited in place
    fingerprint = {"datasetFingerprint": files} if files else {}
    conversations, skips, fmt = load_conversations(source, ds.split, ds.format.value, ds.max_samples)
    rows = len(conversations) + skips.total()
    if not rows:
        raise StageError(
            f"dataset.source {ds.source}: no rows (the file is empty, or every file is); "
            "check the path and that the data was written"
        )
    if not conversations:
        raise StageError(
            f"dataset.source {ds.source}: no usable rows ({skips.total()} skipped: {dict(skips.counts)}); "
            f"dataset.format is {ds.format.value}; first problems: "
            + "; ".join(e for examples in skips.examples.values() for e in examples[:2])
        )
    check_skipped(rows, skips, ctx.tuning.max_skipped_fraction)
    if fmt == "prompts" and not ctx.tuning.regeneration_enabled:
        raise StageError(
            f"dataset.source {ds.source} holds prompts only (no answers to train on): "
            "set regeneration.enabled to true so the verifier answers them"
        )
    conversations = assign_splits(conversations, ds.validation_fraction, ds.seed)
    shape = shape_of(ctx)
    if ctx.tuning.regeneration_enabled:
        # generate re-tokenizes after answering; prompt-only rows are expected here, not skipped
        answered = [c for c in conversations if any(m["role"] == "assistant" for m in c["messages"])]
        if not answered:
            write_conversations(ctx.work / CONVERSATIONS_FILE, conversations)
            ctx.progress.begin("rows", len(conversations), done=len(conversations))  # generate answers them
            return {
                "format": fmt,
                "conversations": len(conversations),
                **fingerprint,
                **shape,
                "samples": 0,
                "seconds": _since(started),
            }
    tokenizing = Tokenizing(ctx.params.verifier, ds.max_sequence_length, ds.loss_on_reasoning)
    stats = write_prepared(ctx.work, conversations, ctx, tokenizing, skips, ctx.progress)
    check_skipped(rows, skips, ctx.tuning.max_skipped_fraction)
    seconds = _since(started)
    logger.info("prepared %d samples (%d tokens) in %.1f s", stats["samples"], stats["tokens"], seconds)
    return {
        "format": fmt,
        "conversations": len(conversations),
        **fingerprint,
        **shape,
        **stats,
        "seconds": seconds,
    }


def check_skipped(rows: int, skips: Skips, allowed: float) -> None:
    """Fail rather than train on a sliver: a wrong format or a broken export skips most rows silently."""
    if skips.total() <= allowed * rows:
        return
    examples = "; ".join(e for shown in skips.examples.values() for e in shown[:1])
    raise StageError(
        f"{skips.total()} of {rows} rows skipped ({dict(sorted(skips.counts.items()))}), more than "
        f"dataset.maxSkippedFraction ({allowed}) allows; first problems: {examples}. Fix the rows (or "
        "dataset.format), or raise dataset.maxSkippedFraction to train on the rest"
    )


def shape_of(ctx: StageContext[PrepareParams, PrepareTuning]) -> dict[str, int]:
    """The verifier's shape for status.plan.estimates (hidden-state bytes before extract); {}: unknown."""
    v = ctx.params.verifier
    shape = estimated_shape(ctx.local_path(v.model), v.revision, v.trust_remote_code)
    if shape is None:
        return {}
    layers = {"numHiddenLayers": shape.num_hidden_layers} if shape.num_hidden_layers is not None else {}
    return {"hiddenSize": shape.hidden_size, **layers}


def _since(t0: float) -> float:
    return round(time.monotonic() - t0, 3)
