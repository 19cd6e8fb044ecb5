"""prepare: a chat dataset to token ids and assistant-only loss masks, split, with token frequencies.

Progress: rows tokenized of the rows read, their tokens, and the skipped rows as failures by reason.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections import Counter
from pathlib import Path
from typing import Any

from eagle3_contract.params import PrepareParams, PrepareTuning
from eagle3_pipeline.data import captured
from eagle3_pipeline.data.conversations import Skips, conversations_of, format_label
from eagle3_pipeline.data.dataset_files import local_fingerprint, read_rows
from eagle3_pipeline.data.prepared import CONVERSATIONS_FILE, Tokenizing, write_conversations, write_prepared
from eagle3_pipeline.data.spool import ConversationSpool
from eagle3_pipeline.data.verifier import estimated_shape
from eagle3_pipeline.runtime.context import StageContext
from eagle3_pipeline.runtime.errors import StageError
from eagle3_pipeline.stages.prepare.generation import SNAPSHOT_DIR, run_generation
from eagle3_pipeline.stages.prepare.screening import CapturedScreen

logger = logging.getLogger(__name__)

SPOOL_FILE = "normalized.spool"  # in the work directory, removed before the output is committed


def run(ctx: StageContext[PrepareParams, PrepareTuning]) -> dict[str, Any]:
    """Two streaming passes, so memory does not grow with the dataset: the rows read and normalized into a
    spool file (eagle3_pipeline.data.spool), then read back in split order, tokenized and written."""
    if ctx.params.generation is not None:  # a later generation: captured records and the first one's data
        return run_generation(ctx, ctx.params.generation)
    started = time.monotonic()
    ctx.progress.begin("rows")  # how many: once they are read
    ds = ctx.params.dataset
    source = ctx.local_path(ds.source)
    files = local_fingerprint(source)  # recorded so `eagle3 run` can tell files edited in place
    fingerprint = {"datasetFingerprint": files} if files else {}
    spool = ConversationSpool(ctx.work / SPOOL_FILE, ds.seed)
    snapshot = ctx.work / SNAPSHOT_DIR
    try:
        if ds.format.value == captured.CAPTURED and Path(source).is_dir():
            source = str(captured.snapshot(Path(source), snapshot))
        skips, screen, fmt = spool_conversations(spool, source, ds.split, ds.format.value, ds.max_samples)
        rows = len(spool) + skips.total()  # read: usable or skipped
        check_rows(ds.source, ds.format.value, len(spool), skips, ctx.tuning.max_skipped_fraction)
        if fmt == "prompts" and not ctx.tuning.regeneration_enabled:
            raise StageError(
                f"dataset.source {ds.source} holds prompts only (no answers to train on): "
                "set regeneration.enabled to true so the verifier answers them"
            )
        shape = shape_of(ctx)
        summary = {"format": fmt, "conversations": len(spool), **fingerprint, **shape, **screened(screen)}
        ordered = spool.ordered(ds.validation_fraction)
        if ctx.tuning.regeneration_enabled and not spool.answered:
            # generate answers the prompts and re-tokenizes; prompt-only rows are expected here, not skipped
            write_conversations(ctx.work / CONVERSATIONS_FILE, ordered)
            ctx.progress.begin("rows", len(spool), done=len(spool))
            return summary | {"samples": 0, "seconds": _since(started)}
        tokenizing = Tokenizing(ctx.params.verifier, ds.max_sequence_length, ds.loss_on_reasoning)
        stats = write_prepared(ctx.work, ordered, ctx, tokenizing, skips, ctx.progress, total=len(spool))
    finally:
        spool.remove()
        shutil.rmtree(snapshot, ignore_errors=True)
    check_skipped(rows, skips, ctx.tuning.max_skipped_fraction)  # with the rows tokenizing skipped
    seconds = _since(started)
    logger.info("prepared %d samples (%d tokens) in %.1f s", stats["samples"], stats["tokens"], seconds)
    return summary | stats | {"seconds": seconds}


def spool_conversations(
    spool: ConversationSpool, source: str, split: str, fmt: str, max_samples: int | None
) -> tuple[Skips, CapturedScreen, str]:
    """Every usable row into `spool`; the skipped ones counted, the captured records screened
    (stages.prepare.screening); the format(s) used."""
    skips = Skips()
    screen = CapturedScreen()
    formats: Counter[str] = Counter()
    for conv, row_format in conversations_of(read_rows(source, split), fmt, skips):
        if row_format == captured.CAPTURED and not screen.keeps(conv):
            continue
        spool.add(conv)
        formats[row_format] += 1
        if max_samples is not None and len(spool) >= max_samples:
            break
    return skips, screen, format_label(formats, fmt)


def screened(screen: CapturedScreen) -> dict[str, Any]:
    """The result's `screened` rows by reason (and a line in the log); nothing when none were."""
    counts = screen.screened.counts
    if not counts:
        return {}
    examples = "; ".join(e for shown in screen.screened.examples.values() for e in shown[:1])
    logger.info("screened out %d captured records (%s), e.g. %s", counts.total(), dict(counts), examples)
    return {"screened": dict(sorted(counts.items()))}


def check_rows(source: str, fmt: str, usable: int, skips: Skips, allowed: float) -> None:
    if not usable + skips.total():
        raise StageError(
            f"dataset.source {source}: no rows (the file is empty, or every file is); "
            "check the path and that the data was written"
        )
    if not usable:
        raise StageError(
            f"dataset.source {source}: no usable rows ({skips.total()} skipped: {dict(skips.counts)}); "
            f"dataset.format is {fmt}; first problems: "
            + "; ".join(e for examples in skips.examples.values() for e in examples[:2])
        )
    check_skipped(usable + skips.total(), skips, allowed)


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
