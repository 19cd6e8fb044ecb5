"""The transformers backend of the extract stage: the verifier in this process, batches by token budget.

For CPU runs and verifiers that fit one device. Each batch is right-padded (the attention mask hides the
padding, and causal attention never lets a real token see a later pad), run through the verifier's base
model (no lm_head: a [tokens, vocab] logits tensor would be wasted), and the chosen layers are caught by
hooks: a pre-hook on decoder layer i for id i, a forward hook on the last decoder layer for id n. Hooks,
not `output_hidden_states`: transformers replaces `hidden_states[-1]` with the output of the final norm,
while vLLM's id n (and the verifier state speculators trains against) is the last layer's output before it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from eagle3_pipeline.data.hidden_states import Layout, encode_batch, file_name, sample_tensors, write_atomic
from eagle3_pipeline.data.verifier import LocalVerifier
from eagle3_pipeline.runtime.errors import OutOfMemory, StageError, is_out_of_memory
from eagle3_pipeline.runtime.reporter import StageReporter

logger = logging.getLogger(__name__)

# Files written in the background while the next batch runs; more only costs host memory.
WRITER_THREADS = 2


@dataclass
class ExtractStats:
    samples: int = 0
    tokens: int = 0
    seconds: float = 0.0


def pick_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def load_verifier(ref: LocalVerifier, device: torch.device) -> torch.nn.Module:
    """The verifier in eval mode: float32 on CPU, bfloat16 on a GPU."""
    from transformers import AutoModelForCausalLM

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    kwargs: dict[str, Any] = {"revision": ref.revision, "trust_remote_code": ref.trust_remote_code}
    if device.type == "cuda":
        kwargs["device_map"] = device.type
    try:
        model: torch.nn.Module = AutoModelForCausalLM.from_pretrained(ref.path, dtype=dtype, **kwargs)
    except (OSError, ValueError) as exc:
        raise StageError(
            f"cannot load the verifier {ref.path} (revision {ref.revision}) with transformers: {exc}; "
            "check spec.verifier.model and revision (locally, /models paths map to $EAGLE3_MODELS_ROOT)"
        ) from None
    return model.eval()


def decoder_layers(base: torch.nn.Module, num_hidden_layers: int) -> torch.nn.ModuleList:
    """The verifier's decoder layers: `base.layers`, or the one ModuleList with n entries."""
    layers = getattr(base, "layers", None)
    if isinstance(layers, torch.nn.ModuleList) and len(layers) == num_hidden_layers:
        return layers
    found = [m for m in base.modules() if isinstance(m, torch.nn.ModuleList) and len(m) == num_hidden_layers]
    if len(found) != 1:
        raise StageError(
            f"cannot find the {num_hidden_layers} decoder layers of {type(base).__name__} "
            f"({len(found)} candidate module lists); use spec.extraction.backend vllm for this verifier"
        )
    return found[0]


class LayerCapture:
    """Hooks catching the hidden states of the layout's layer ids during one forward pass."""

    def __init__(self, layers: torch.nn.ModuleList, layout: Layout) -> None:
        self.layers = layers
        self.layout = layout
        self.captured: dict[int, torch.Tensor] = {}
        self._handles: list[torch.utils.hooks.RemovableHandle] = []

    def __enter__(self) -> LayerCapture:
        self.captured.clear()
        for layer_id in self.layout.aux_layers:
            self._handles.append(
                self.layers[layer_id].register_forward_pre_hook(self._input_of(layer_id), with_kwargs=True)
            )
        n = self.layout.num_hidden_layers
        self._handles.append(self.layers[n - 1].register_forward_hook(self._output_as(n)))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _input_of(self, layer_id: int) -> Callable[..., None]:
        def hook(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            self.captured[layer_id] = args[0] if args else kwargs["hidden_states"]

        return hook

    def _output_as(self, layer_id: int) -> Callable[..., None]:
        def hook(module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
            self.captured[layer_id] = output[0] if isinstance(output, tuple) else output

        return hook

    def stacked(self) -> torch.Tensor:
        """[batch, tokens, layers, hidden] in the layout's layer order."""
        missing = [i for i in self.layout.layer_ids if i not in self.captured]
        if missing:
            raise StageError(f"the verifier's forward pass never reached layers {missing}")
        return torch.stack([self.captured[i] for i in self.layout.layer_ids], dim=2)


class TransformersExtractor:
    """One verifier, one layout: token ids in, hidden states [batch, tokens, layers, hidden] out."""

    def __init__(self, model: torch.nn.Module, layout: Layout) -> None:
        self.base: torch.nn.Module = getattr(model, "base_model", model)
        self.layout = layout
        self.device = next(model.parameters()).device
        self.capture = LayerCapture(decoder_layers(self.base, layout.num_hidden_layers), layout)

    def forward(self, batch: Sequence[Sequence[int]]) -> torch.Tensor:
        """Right-padded batch through the base model; rows beyond a sample's length are padding."""
        longest = max(len(ids) for ids in batch)
        input_ids = torch.zeros((len(batch), longest), dtype=torch.long)
        mask = torch.zeros((len(batch), longest), dtype=torch.long)
        for row, ids in enumerate(batch):
            input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            mask[row, : len(ids)] = 1
        with self.capture, torch.inference_mode():
            self.base(
                input_ids=input_ids.to(self.device), attention_mask=mask.to(self.device), use_cache=False
            )
            return self.capture.stacked()


class RowSource(Protocol):
    """The prepared dataset as the extractors read it."""

    seq_lens: list[int]

    def token_ids(self, indices: Sequence[int]) -> list[list[int]]: ...


def extract(
    extractor: TransformersExtractor,
    batches: Sequence[Sequence[int]],
    rows: RowSource,
    out_dir: Path,
    token_budget: int,
    progress: StageReporter | None = None,
) -> ExtractStats:
    """Extract every batch into `out_dir`; OutOfMemory keeps the files already written. `progress` counts
    the samples and their tokens as each batch's files are handed to the writers."""
    stats = ExtractStats()
    started = time.monotonic()
    with ThreadPoolExecutor(WRITER_THREADS, thread_name_prefix="hs-writer") as writer:
        pending: list[Future[int]] = []
        for batch in batches:
            token_ids = rows.token_ids(batch)
            encoded = _encoded_or_oom(extractor, token_ids, token_budget)
            files = [
                (out_dir / file_name(index), sample_tensors(encoded, k, ids))
                for k, (index, ids) in enumerate(zip(batch, token_ids, strict=True))
            ]
            for done in pending:  # the previous batch's files, written while this one ran
                done.result()
            pending = [writer.submit(write_atomic, path, tensors) for path, tensors in files]
            batch_tokens = sum(len(ids) for ids in token_ids)
            stats.samples += len(batch)
            stats.tokens += batch_tokens
            if progress is not None:
                progress.advance(len(batch), batch_tokens)
        for done in pending:
            done.result()
    stats.seconds = time.monotonic() - started
    return stats


def _encoded_or_oom(
    extractor: TransformersExtractor, rows: Sequence[Sequence[int]], token_budget: int
) -> dict[str, torch.Tensor]:
    """One batch's hidden states in the storage dtype, on the CPU; OutOfMemory at this budget."""
    try:
        return encode_batch(extractor.forward(rows), extractor.layout)
    except Exception as exc:
        if is_out_of_memory(exc):
            longest = max(len(ids) for ids in rows)
            raise OutOfMemory(
                f"{type(exc).__name__} on a batch of {len(rows)} rows x {longest} tokens "
                f"(token budget {token_budget}): {exc}"
            ) from exc
        raise
