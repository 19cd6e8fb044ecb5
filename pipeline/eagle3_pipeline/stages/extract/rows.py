"""The prepared dataset as the extract stage reads it: row i's token ids become hs_{i}.safetensors.

The data stage (prepare, or generate when regeneration is on) saves `data/` with `save_to_disk`: columns
`input_ids`, `loss_mask`, `seq_len`, `id`, `split`, train rows first. Row order is the file index order
speculators' ArrowDataset uses, so rows are never reordered or filtered here.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from eagle3_pipeline.data.prepared import DATA_DIR  # the data stage's layout is written down there
from eagle3_pipeline.runtime.errors import StageError

logger = logging.getLogger(__name__)

REQUIRED_COLUMNS = ("input_ids", "seq_len")


class PreparedRows:
    """Lengths of every row up front; token ids fetched a batch at a time (the dataset may be large)."""

    def __init__(self, dataset: Any, location: Path, vocab_size: int | None = None) -> None:
        self.dataset = dataset
        self.location = location
        self.vocab_size = vocab_size
        self.seq_lens: list[int] = [int(n) for n in dataset["seq_len"]]
        empty = [i for i, n in enumerate(self.seq_lens) if n <= 0]
        if empty:
            raise StageError(f"{location}: rows {empty[:10]} have no tokens; rerun the data stage")

    @classmethod
    def load(cls, stage_output: Path, vocab_size: int | None = None) -> PreparedRows:
        from datasets import Dataset, load_from_disk

        location = stage_output / DATA_DIR
        if not location.is_dir():
            raise StageError(
                f"{location}: no prepared dataset (a `save_to_disk` directory); rerun the data stage"
            )
        try:
            dataset = load_from_disk(str(location))
        except (FileNotFoundError, ValueError) as exc:
            raise StageError(f"{location}: cannot load the prepared dataset: {exc}") from None
        if not isinstance(dataset, Dataset):
            raise StageError(f"{location}: expected one dataset, found {type(dataset).__name__}")
        missing = [c for c in REQUIRED_COLUMNS if c not in dataset.column_names]
        if missing:
            raise StageError(
                f"{location}: the prepared dataset lacks columns {missing} (has {dataset.column_names})"
            )
        return cls(dataset.with_format(None), location, vocab_size)

    def __len__(self) -> int:
        return len(self.seq_lens)

    @property
    def total_tokens(self) -> int:
        return sum(self.seq_lens)

    def token_ids(self, indices: Sequence[int]) -> list[list[int]]:
        """The rows' token ids, checked against their `seq_len` and the verifier's vocabulary."""
        batch: list[list[int]] = self.dataset[list(indices)]["input_ids"]
        for index, ids in zip(indices, batch, strict=True):
            if len(ids) != self.seq_lens[index]:
                raise StageError(
                    f"{self.location}: row {index} has {len(ids)} input_ids but seq_len "
                    f"{self.seq_lens[index]}; rerun the data stage"
                )
            if self.vocab_size is not None and ids and not 0 <= min(ids) <= max(ids) < self.vocab_size:
                raise StageError(
                    f"{self.location}: row {index} has token ids outside the verifier's vocabulary "
                    f"[0, {self.vocab_size}); was the dataset tokenized for another model?"
                )
        return batch
