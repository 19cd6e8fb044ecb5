"""prepare for a later generation (eagle3_contract.generation): captured records mixed with the first
generation's conversations.

The records served in the window (after, until] are read like `dataset.format: captured` (a live directory
linked first, exact duplicates and repetition loops screened out) and split by the dataset's seed and
validationFraction: the held-out records are the live traffic evaluate measures the new draft and the
serving one on. The first generation's data stage (its input) gives the original conversations, already
split: of each split, `originalRatio` times as many as there are captured rows of it, chosen by the same
seeded key as the split (so the same ones every time), at most all of them. The original answers keep what
the first draft learned; the captured ones add what the traffic asks now.

The records go through a spool file (eagle3_pipeline.data.spool), so memory holds their keys, not their
text (a capture may be gigabytes); the original conversations are the first generation's prepared dataset,
read whole as generate reads it. Both are tokenized as prepare tokenizes (eagle3_pipeline.data.prepared),
the validation rows in key order, so evaluate's first prompts mix both sources; a row keeps its category
(captured rows: `captured`), and evaluate reports the two apart. The result says how many of each, and how
many records were outside the window or screened out.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from eagle3_contract.params import GenerationData, PrepareParams, PrepareTuning
from eagle3_pipeline.data import captured
from eagle3_pipeline.data.conversations import Conversation, Skips, conversations_of
from eagle3_pipeline.data.dataset_files import read_rows
from eagle3_pipeline.data.prepared import CONVERSATIONS_FILE, Tokenizing, read_conversations, write_prepared
from eagle3_pipeline.data.spool import TRAIN, VAL, ConversationSpool, split_key, validation_count
from eagle3_pipeline.runtime.context import StageContext
from eagle3_pipeline.runtime.errors import StageError
from eagle3_pipeline.stages.prepare.screening import CapturedScreen

logger = logging.getLogger(__name__)

SNAPSHOT_DIR = "captured.snapshot"  # a live capture directory's segments, linked; removed after reading
SPOOL_FILE = "captured.spool"  # the window's records, normalized; removed likewise
OUTSIDE = "outsideWindow"

Context = StageContext[PrepareParams, PrepareTuning]


def run_generation(ctx: Context, generation: GenerationData) -> dict[str, Any]:
    started = time.monotonic()
    ds = ctx.params.dataset
    spool = ConversationSpool(ctx.work / SPOOL_FILE, ds.seed)  # the records on disk, not in memory
    snapshot = ctx.work / SNAPSHOT_DIR
    try:
        counts, screen, skips = spool_captured(ctx, generation, snapshot, spool)
        if not len(spool):
            raise StageError(
                f"no captured records to train on in {generation.capture} served after "
                f"{generation.after or '-'} and up to {generation.until or 'now'} ({counts}; screened: "
                f"{dict(screen.screened.counts)}); the generation needs live traffic recorded by "
                "serving.capture"
            )
        n_val = validation_count(len(spool), ds.validation_fraction)
        ours = {TRAIN: len(spool) - n_val, VAL: n_val}
        original = read_conversations(ctx.data_input() / CONVERSATIONS_FILE)
        theirs = {
            split: chosen(original, split, ours[split], generation.original_ratio, ds.seed) for split in ours
        }
        del original
        tokenizing = Tokenizing(ctx.params.verifier, ds.max_sequence_length, ds.loss_on_reasoning)
        total = len(spool) + len(theirs[TRAIN]) + len(theirs[VAL])
        rows = mixed(spool.ordered(ds.validation_fraction), theirs, ds.seed)
        stats = write_prepared(ctx.work, rows, ctx, tokenizing, skips, ctx.progress, total=total)
    finally:
        spool.remove()
        shutil.rmtree(snapshot, ignore_errors=True)
    mix = {
        "captured": {
            **counts,
            "train": ours[TRAIN],
            "validation": ours[VAL],
            "screened": dict(sorted(screen.screened.counts.items())),
        },
        "original": {"train": len(theirs[TRAIN]), "validation": len(theirs[VAL])},
    }
    logger.info("generation data: %s", mix)
    seconds = round(time.monotonic() - started, 3)
    return {
        "format": captured.CAPTURED,
        "conversations": total,
        "generation": mix,
        **stats,
        "seconds": seconds,
    }


def mixed(
    ours: Iterator[Conversation], theirs: dict[str, list[Conversation]], seed: int
) -> Iterator[Conversation]:
    """Train rows first (the captured ones as the spool orders them, then the original ones), then every
    validation row in split-key order: the captured ones are a validationFraction of the records, held in
    memory only here."""
    held: list[Conversation] = []
    for conv in ours:
        if conv["split"] == TRAIN:
            yield conv
        else:
            held.append(conv)
    yield from theirs[TRAIN]
    yield from sorted(held + theirs[VAL], key=lambda c: split_key(seed, c["id"]))


def spool_captured(
    ctx: Context, generation: GenerationData, snapshot: Path, spool: ConversationSpool
) -> tuple[dict[str, int], CapturedScreen, Skips]:
    """The window's records as conversations into `spool`, screened; the counts of records read and outside
    the window, the screen, and the rows that could not be read."""
    source = Path(ctx.local_path(generation.capture))
    if source.is_dir():
        source = captured.snapshot(source, snapshot)
    counts = {"records": 0, OUTSIDE: 0}
    skips, screen = Skips(), CapturedScreen()
    rows = in_window(read_rows(str(source), "train"), generation, counts)
    for conv, _ in conversations_of(rows, captured.CAPTURED, skips):
        if screen.keeps(conv):
            spool.add(conv)
    return counts, screen, skips


def in_window(
    rows: Iterator[tuple[str, Any]], generation: GenerationData, counts: dict[str, int]
) -> Iterator[tuple[str, Any]]:
    """The rows served in (after, until]; a record without a readable servedAt is outside any window."""
    after = _instant(generation.after) if generation.after else None
    until = _instant(generation.until) if generation.until else None
    for position, row in rows:
        counts["records"] += 1
        if after is not None or until is not None:
            served = _served(row)
            if (
                served is None
                or (after is not None and served <= after)
                or (until is not None and served > until)
            ):
                counts[OUTSIDE] += 1
                continue
        yield position, row


def _served(row: Any) -> datetime | None:
    value = row.get("servedAt") if isinstance(row, dict) else None
    try:
        return _instant(value) if isinstance(value, str) else None
    except ValueError:
        return None


def _instant(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def chosen(
    original: list[Conversation], split: str, ours: int, ratio: float, seed: int
) -> list[Conversation]:
    """`ratio` times `ours` (the captured rows of `split`) of the original `split` rows, at most all, the
    first by the seeded split key: the same rows for the same data."""
    pool = sorted((c for c in original if c.get("split") == split), key=lambda c: split_key(seed, c["id"]))
    return [{**c, "split": split} for c in pool[: min(round(ratio * ours), len(pool))]]
