"""Captured records as a dataset: what `serving.capture` wrote (eagle3_contract.capture) read back as
conversations, and a live capture directory held still while prepare reads it.

A record is one JSON line: `servedAt`, `model`, `messages` (the request's), `tools` (when the request had
them), `response` (the verifier's answer, with `reasoning_content` where it reasons), `finishReason` and
vLLM's acceptance for the request. Its conversation is the request's messages followed by the response: the
answer is the verifier's own, token for token (speculative decoding is lossless), so it trains a draft as
regenerated data would. Rows read from records are of category `captured` unless they name their own, so
evaluate reports the held-out captured requests apart from the rest of a mixed dataset.

A serving pod keeps pruning its segments (retention, maxBytes) while prepare reads them: `snapshot` links the
complete segments into the stage's work directory first (a hard link keeps the file's data when the pod
unlinks its name; a copy where the directory is on another file system), so a prune mid-read loses nothing
that was listed.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any

from eagle3_pipeline.data.dataset_files import list_dataset
from eagle3_pipeline.data.json_rows import RowError
from eagle3_pipeline.runtime.errors import StageError

logger = logging.getLogger(__name__)

CAPTURED = "captured"  # the dataset format, and the category of its rows


def is_record(row: Any) -> bool:
    """Whether a row has a captured record's layout: the request's messages and the response object."""
    return (
        isinstance(row, dict)
        and isinstance(row.get("messages"), list)
        and isinstance(row.get("response"), dict)
    )


def turns_of(row: Any) -> list[Any]:
    """The record's turns: its messages, then the response as the assistant's turn."""
    if not isinstance(row, dict) or not isinstance(row.get("messages"), list):
        raise RowError("malformed", "no 'messages' list (is dataset.format right?)")
    response = row.get("response")
    if not isinstance(response, dict):
        raise RowError(
            "malformed", "no 'response' object: not a record serving.capture wrote (is dataset.format right?)"
        )
    return [*row["messages"], {"role": "assistant", **response}]


def snapshot(source: Path, into: Path) -> Path:
    """The data files of the directory `source`, linked (or copied) into `into` under the same relative
    paths; returns `into`. A file pruned between the listing and its link is left out (it is gone for every
    reader), and said in one line."""
    listing = list_dataset(source)
    if not listing.files:
        raise StageError(
            f"dataset.source {source}: no complete capture segments yet (a pod writes one every 30 s or "
            "1 MiB of records, as `<pod>/<time>-<pid>-<n>.jsonl`); check serving.capture is set and traffic "
            "is served, or point dataset.source at records copied out"
        )
    if into.exists():
        shutil.rmtree(into)  # an earlier attempt's: the directory may have changed since
    gone = 0
    for file in listing.files:
        target = into / file.relative_to(source)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            try:
                os.link(file, target)
            except OSError as exc:
                if isinstance(exc, FileNotFoundError):
                    raise
                shutil.copy2(file, target)  # another file system, or links not allowed
        except FileNotFoundError:
            gone += 1
    if gone:
        logger.info("dataset.source %s: %d segments were pruned while it was listed", source, gone)
    into.mkdir(parents=True, exist_ok=True)
    return into
