"""The normalized conversations on disk while prepare orders them, so its memory does not grow with the
dataset: each conversation is one line of a spool file, and memory holds only its split key (32 bytes), its
offset and its length.

The order is prepare's split (eagle3_pipeline.data.prepared.assign_splits, the same rule for a list): rows
sorted by a seeded hash of their id, the first share held out; train rows come first, then validation rows.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Any

Conversation = dict[str, Any]
TRAIN, VAL = "train", "val"
KEY_BYTES = 32


def split_key(seed: int, row_id: str) -> bytes:
    """The key rows are ordered by: the split depends on the ids, the seed and the fraction only."""
    return hashlib.sha256(f"{seed}\x00{row_id}".encode()).digest()


def validation_count(rows: int, fraction: float) -> int:
    """How many rows are held out: the fraction, rounded, and at least one when there are two rows or more."""
    n_val = round(rows * fraction)
    if fraction > 0 and n_val == 0 and rows >= 2:
        n_val = 1
    return n_val


class ConversationSpool:
    """Conversations appended in source order, read back in split order (`ordered`)."""

    def __init__(self, path: Path, seed: int) -> None:
        self.path = path
        self.seed = seed
        self._file = path.open("wb")
        self._keys = bytearray()
        self._offsets = array("q")
        self._lengths = array("q")
        self.answered = 0  # conversations with an assistant turn (regeneration answers the others)

    def add(self, conv: Conversation) -> None:
        line = json.dumps(conv, ensure_ascii=False).encode("utf-8") + b"\n"
        self._keys += split_key(self.seed, conv["id"])
        self._offsets.append(self._file.tell())
        self._lengths.append(len(line))
        self._file.write(line)
        if any(m.get("role") == "assistant" for m in conv["messages"]):
            self.answered += 1

    def __len__(self) -> int:
        return len(self._offsets)

    def ordered(self, fraction: float) -> Iterator[Conversation]:
        """Every conversation with its `split`: train rows first, then validation rows, each sorted by key."""
        import numpy as np

        self._file.flush()
        keys = np.frombuffer(bytes(self._keys), dtype=f"S{KEY_BYTES}")
        order = np.argsort(keys, kind="stable")
        n_val = validation_count(len(self), fraction)
        with self.path.open("rb") as f:
            for position, index in enumerate(np.concatenate([order[n_val:], order[:n_val]])):
                f.seek(self._offsets[index])
                conv: Conversation = json.loads(f.read(self._lengths[index]))
                conv["split"] = TRAIN if position < len(self) - n_val else VAL
                yield conv

    def remove(self) -> None:
        self._file.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
