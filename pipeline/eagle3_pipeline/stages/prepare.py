"""prepare: a chat dataset to token ids and assistant-only loss masks, split, with token frequencies."""

from __future__ import annotations

import logging
import time
from typing import Any

from eagle3_contract.params import PrepareParams, PrepareTuning
from eagle3_pipeline.context import StageContext
from eagle3_pipeline.conversations import load_conversations
from eagle3_pipeline.errors import StageError
from eagle3_pipeline.prepared import Tokenizing, assign_splits, write_prepared

logger = logging.getLogger(__name__)


def run(ctx: StageContext[PrepareParams, PrepareTuning]) -> dict[str, Any]:
    started = time.monotonic()
    ds = ctx.params.dataset
    source = ctx.local_path(ds.source)
    conversations, skips, fmt = load_conversations(source, ds.split, ds.format.value, ds.max_samples)
    if not conversations:
        raise StageError(
            f"dataset.source {ds.source}: no usable rows ({skips.total()} skipped: {dict(skips.counts)}); "
            f"dataset.format is {ds.format.value}: "
            + "; ".join(e for examples in skips.examples.values() for e in examples[:2])
        )
    if fmt == "prompts" and not ctx.tuning.regeneration_enabled:
        raise StageError(
            f"dataset.source {ds.source} holds prompts only (no answers to train on): "
            "set regeneration.enabled to true so the verifier answers them"
        )
    conversations = assign_splits(conversations, ds.validation_fraction, ds.seed)
    if ctx.tuning.regeneration_enabled:
        # generate re-tokenizes after answering; prompt-only rows are expected here, not skipped
        answered = [c for c in conversations if any(m["role"] == "assistant" for m in c["messages"])]
        if not answered:
            from eagle3_pipeline.prepared import CONVERSATIONS_FILE, write_conversations

            write_conversations(ctx.work / CONVERSATIONS_FILE, conversations)
            return {
                "format": fmt,
                "conversations": len(conversations),
                "samples": 0,
                "seconds": _since(started),
            }
    tokenizing = Tokenizing(ctx.params.verifier, ds.max_sequence_length, ds.loss_on_reasoning)
    stats = write_prepared(ctx.work, conversations, ctx, tokenizing, skips)
    seconds = _since(started)
    logger.info("prepared %d samples (%d tokens) in %.1f s", stats["samples"], stats["tokens"], seconds)
    return {
        "format": fmt,
        "conversations": len(conversations),
        **stats,
        "seconds": seconds,
    }


def _since(t0: float) -> float:
    return round(time.monotonic() - t0, 3)
