"""Hidden-state files in speculators' format: layer ids, one safetensors file per sample, resume, batching.

A sample `i` of the prepared dataset becomes `hs_{i}.safetensors` holding `hidden_states` [T, L, H] in the
storage dtype and `token_ids` [T] (int64): what `hs_connectors.FileTransfer.get_cached(i)` returns and
`speculators.train.data.ArrowDataset` reads (`hidden_states[:, :-1]` are the draft's auxiliary inputs,
`hidden_states[:, -1]` the verifier's last layer). fp8 files carry per-token scales as well
(`hidden_states_scales` [T, 1, 1] float32), exactly what `hs_connectors.FP8Transfer` dequantizes.

Layer ids follow vLLM: id i is the input of decoder layer i (0 = the embeddings) and id n
(n = num_hidden_layers) is the last layer's output before the final norm. vLLM collects the auxiliary layers
in sorted order and the stored list is `sorted(aux) + [n]`; the transformers backend stores the same order.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from eagle3_pipeline.runtime.errors import StageError

logger = logging.getLogger(__name__)

HIDDEN_STATES = "hidden_states"
TOKEN_IDS = "token_ids"
SCALES = "hidden_states_scales"  # hs_connectors.fp8_utils.SCALES_KEY
METADATA_FILE = "metadata.json"
TMP_SUFFIX = ".tmp"
FP8 = "fp8"
# Storage dtype name (spec.extraction.dtype) -> (torch dtype of `hidden_states`, safetensors dtype tag).
STORAGE: dict[str, tuple[torch.dtype, str]] = {
    "bfloat16": (torch.bfloat16, "BF16"),
    "float16": (torch.float16, "F16"),
    FP8: (torch.float8_e4m3fn, "F8_E4M3"),
}


def file_name(index: int) -> str:
    return f"hs_{index}.safetensors"


def default_aux_layers(num_hidden_layers: int) -> list[int]:
    """speculators' default (`resolve_target_layer_ids`, scripts/launch_vllm.py): [2, n // 2, n - 3]."""
    n = num_hidden_layers
    return [2, n // 2, n - 3]


def resolve_aux_layers(requested: Sequence[int] | None, num_hidden_layers: int) -> tuple[int, ...]:
    """The auxiliary layer ids to extract, sorted as vLLM collects them; StageError when they cannot work."""
    n = num_hidden_layers
    if requested is None:
        layers = default_aux_layers(n)
        if len(set(layers)) != len(layers) or min(layers) < 0 or max(layers) >= n:
            raise StageError(
                f"the verifier has {n} decoder layers: too few for the default auxiliary layers "
                f"[2, n/2, n-3] = {layers} (they must be distinct ids below {n}); "
                f"set spec.extraction.layers to distinct ids in [0, {n - 1}]"
            )
        return tuple(sorted(layers))
    bad = [i for i in requested if not 0 <= i < n]
    if bad:
        raise StageError(
            f"spec.extraction.layers {list(requested)}: ids {bad} are out of range for a verifier with {n} "
            f"decoder layers; use ids in [0, {n - 1}] (id i is the input of decoder layer i, 0 the "
            f"embeddings; the last layer's output, id {n}, is always stored)"
        )
    if len(set(requested)) != len(requested):
        raise StageError(f"spec.extraction.layers {list(requested)} repeats a layer id; list each once")
    return tuple(sorted(requested))


@dataclass(frozen=True)
class Layout:
    """What every file of one extraction holds."""

    aux_layers: tuple[int, ...]
    num_hidden_layers: int
    hidden_size: int
    dtype: str  # a key of STORAGE

    @property
    def layer_ids(self) -> list[int]:
        """The stored layer ids in file order: the sorted auxiliary ids, then n."""
        return [*self.aux_layers, self.num_hidden_layers]

    @property
    def num_layers(self) -> int:
        return len(self.aux_layers) + 1

    @property
    def torch_dtype(self) -> torch.dtype:
        return STORAGE[self.dtype][0]

    @property
    def transfer(self) -> str:
        """The hs_connectors backend that reads these files: `file` (FileTransfer) or `fp8` (FP8Transfer)."""
        return FP8 if self.dtype == FP8 else "file"


def encode_batch(hidden: torch.Tensor, layout: Layout) -> dict[str, torch.Tensor]:
    """Hidden states [B, T, L, H] (any float dtype, any device) in the storage dtype, on the CPU.

    One conversion and one device-to-host copy per batch; fp8 gets hs_connectors' per-token scales
    [B, T, 1, 1] (`quantize_tensor_to_fp8` over [B*T, L, H]: each token's scale depends on that token only).
    """
    if layout.dtype == FP8:
        from hs_connectors.fp8_utils import quantize_tensor_to_fp8

        batch, tokens = hidden.shape[:2]
        fp8, scales = quantize_tensor_to_fp8(hidden.flatten(0, 1))
        tensors = {
            HIDDEN_STATES: fp8.view(batch, tokens, *fp8.shape[1:]),
            SCALES: scales.view(batch, tokens, *scales.shape[1:]),
        }
    else:
        tensors = {HIDDEN_STATES: hidden.to(layout.torch_dtype)}
    return {k: v.detach().to("cpu") for k, v in tensors.items()}


def sample_tensors(
    batch: dict[str, torch.Tensor], row: int, token_ids: Sequence[int]
) -> dict[str, torch.Tensor]:
    """The tensors of one file: row `row` of an `encode_batch` result without its padding, and its ids."""
    tensors = {k: v[row, : len(token_ids)].contiguous() for k, v in batch.items()}
    tensors[TOKEN_IDS] = torch.tensor(list(token_ids), dtype=torch.int64)
    return tensors


def encode(hidden: torch.Tensor, token_ids: torch.Tensor, layout: Layout) -> dict[str, torch.Tensor]:
    """The tensors of one file from `hidden` [T, L, H] and `token_ids` [T]."""
    return sample_tensors(encode_batch(hidden[None], layout), 0, token_ids.tolist())


def write_atomic(path: Path, tensors: dict[str, torch.Tensor]) -> int:
    """Write a safetensors file under a temporary name, then rename it: it is complete or absent."""
    tmp = path.with_name(path.name + TMP_SUFFIX)
    save_file(tensors, str(tmp))
    os.replace(tmp, path)
    return path.stat().st_size


def check_file(path: Path, seq_len: int, layout: Layout) -> str | None:
    """Why the file at `path` is not a complete sample of `seq_len` tokens in `layout`; None if it is.

    Reads the safetensors header only (safe_open validates its offsets against the file size), so a
    truncated or foreign file is caught without loading the tensors.
    """
    try:
        with safe_open(str(path), framework="pt") as f:
            keys = set(f.keys())
            want = {HIDDEN_STATES, TOKEN_IDS} | ({SCALES} if layout.dtype == FP8 else set())
            if not want <= keys:
                return f"missing tensors {sorted(want - keys)}"
            tokens = f.get_slice(TOKEN_IDS).get_shape()
            hidden = f.get_slice(HIDDEN_STATES)
            shape, dtype = hidden.get_shape(), hidden.get_dtype()
    except (SafetensorError, OSError, ValueError) as exc:  # safetensors' error for every kind of damage
        return f"unreadable: {exc}"
    expected = [seq_len, layout.num_layers, layout.hidden_size]
    if list(tokens) != [seq_len]:
        return f"token_ids has shape {list(tokens)}, the row has {seq_len} tokens"
    if list(shape) != expected:
        return f"hidden_states has shape {list(shape)}, expected {expected}"
    if dtype != STORAGE[layout.dtype][1]:
        return f"hidden_states is {dtype}, expected {STORAGE[layout.dtype][1]}"
    return None


def scan_done(directory: Path, seq_lens: Sequence[int], layout: Layout) -> set[int]:
    """Rows whose file in `directory` is complete; incomplete, corrupt and temporary files are removed."""
    done: set[int] = set()
    if not directory.is_dir():
        return done
    for path in directory.iterdir():
        name = path.name
        if name.endswith(TMP_SUFFIX):
            path.unlink(missing_ok=True)
            continue
        index = _index_of(name)
        if index is None:
            continue
        if index >= len(seq_lens):
            reason: str | None = f"no row {index} in the dataset ({len(seq_lens)} rows)"
        else:
            reason = check_file(path, seq_lens[index], layout)
        if reason is None:
            done.add(index)
        else:
            logger.warning("removing %s from an earlier attempt: %s", path, reason)
            path.unlink(missing_ok=True)
    return done


def _index_of(name: str) -> int | None:
    if not (name.startswith("hs_") and name.endswith(".safetensors")):
        return None
    with contextlib.suppress(ValueError):
        return int(name[len("hs_") : -len(".safetensors")])
    return None


def total_bytes(directory: Path, indices: Iterable[int]) -> int:
    return sum((directory / file_name(i)).stat().st_size for i in indices)


def plan_batches(lengths: Sequence[tuple[int, int]], token_budget: int) -> list[list[int]]:
    """Group (row, length) pairs into batches whose padded size (rows x longest row) fits the budget.

    Rows are sorted longest first, so padding stays small and the largest batches come first: a budget
    that runs out of memory fails at once instead of after hours.
    """
    too_long = [(i, n) for i, n in lengths if n > token_budget]
    if too_long:
        i, n = max(too_long, key=lambda pair: pair[1])
        raise StageError(
            f"{len(too_long)} rows are longer than the token budget {token_budget} (row {i} has {n} tokens): "
            "raise spec.extraction.tokenBudget to at least dataset.maxSequenceLength"
        )
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for index, length in sorted(lengths, key=lambda pair: (-pair[1], pair[0])):
        if current and (len(current) + 1) * longest > token_budget:
            batches.append(current)
            current = []
        if not current:
            longest = length  # the first row of a batch is its longest
        current.append(index)
    if current:
        batches.append(current)
    return batches
