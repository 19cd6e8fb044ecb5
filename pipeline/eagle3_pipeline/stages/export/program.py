"""export: the slim serving checkpoint of train's best draft, with a manifest of sha256 digests.

Inputs: `train` (its best checkpoint), `vocab` (the d2t/t2d the draft must carry) and, with
`evaluation.sweep`, `evaluate` (its `speculation` table goes into the manifest); with
training.checkpointSelection acceptance, `evaluate` too: its `checkpointSelection` names the epoch shipped
(the most accepted of those it measured) instead of train's best by validation loss, and goes into the
manifest with every measured epoch's figures. The output directory is
the draft vLLM serves (`--speculative-config '{"method": "eagle3", "model": <output>, ...}'`):
  config.json        the checkpoint's speculators config, the verifier named as `verifier.model` names it
                     (a path on the model cache volume or a Hub id, not the training machine's path), bf16
  config.py          speculators' config class (config.json's auto_map names it)
  model.safetensors  the draft's weights in bf16 with d2t and t2d; no copy of the verifier's embed_tokens
                     (vLLM shares the verifier's), no optimizer or scheduler state
  manifest.json      sha256 and size of each file; `sha256` is model.safetensors' digest; with
                     evaluation.sweep, `speculation`: evaluate's speculation-length table (its cells, the
                     baselines and the schedule), which verify reads back for a pinned draft, and
                     evaluate's acceptance per category (`categories`) when it measured them

The result's `sha256` and `bytes` (all files but the manifest) become the run's `status.checkpoint`. The stage
fails when the draft's mapping is not the vocab stage's, when d2t and t2d disagree, or when the checkpoint
is more than MAX_OVERHEAD above its weights: 2 bytes per parameter of the draft (the trained ones and the
draft head, lm_head, which vLLM needs) plus the mapping. Progress: three steps, the weights written, the
mapping checked, the manifest written.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3_contract.params import ExportParams, ExportTuning
from eagle3_contract.results import EvaluateResult
from eagle3_contract.stages import Stage
from eagle3_pipeline.data.draft_checkpoint import (
    SPECULATION_KEY,
    ServingWeights,
    best_checkpoint,
    checkpoint_method,
    directory_bytes,
    mapping_problem,
    missing_files,
    write_manifest,
    write_serving_checkpoint,
)
from eagle3_pipeline.runtime.context import StageContext, read_result
from eagle3_pipeline.runtime.errors import StageError

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

MAX_OVERHEAD = 0.05  # the serving checkpoint may exceed its weights' bf16 bytes + the mapping by this much


def run(ctx: StageContext[ExportParams, ExportTuning]) -> dict[str, Any]:
    started = time.monotonic()
    ctx.progress.begin("steps", 3)
    train, vocab = ctx.input(Stage.TRAIN), ctx.input(Stage.VOCAB)
    evaluated = evaluate_result(ctx)
    source, chosen = shipped_checkpoint(train, evaluated)
    verifier = ctx.params.verifier.model
    slim = write_serving_checkpoint(source, ctx.work, verifier)
    ctx.progress.advance()
    weights = slim.weights
    check_mapping(weights.tensors.get("d2t"), weights.tensors.get("t2d"), vocab, source)
    ctx.progress.advance()
    manifest = write_manifest(
        ctx.work,
        {
            "verifier": verifier,
            "verifierRevision": ctx.params.verifier.revision,
            "trainableParameters": weights.trainable_parameters,
            "draftHeadParameters": weights.head_parameters,
            **speculation_of(evaluated),
            **chosen,
        },
    )
    ctx.progress.advance()
    ratio = check_size(manifest, weights)
    check_parameter_count(train, weights.trainable_parameters)
    source_bytes = directory_bytes(source)
    size = int(manifest["bytes"])
    logger.info("export: %d bytes (%.3fx the weights), sha256 %s", size, ratio, manifest["sha256"])
    return {
        "sha256": manifest["sha256"],
        "bytes": size,
        "expectedBytes": weights.expected_bytes,
        "ratio": round(ratio, 4),
        "trainableParameters": weights.trainable_parameters,
        "draftHeadParameters": weights.head_parameters,
        "mappingBytes": weights.mapping_bytes,
        "sourceBytes": source_bytes,
        "reduction": round(source_bytes / size, 2),
        "droppedTensors": weights.dropped,
        "droppedFiles": slim.source_files,
        "verifier": verifier,
        "files": sorted(manifest["files"]),
        "method": checkpoint_method(source).value,  # what serving rolls out (draft.candidates: the chosen)
        "seconds": round(time.monotonic() - started, 3),
    }


def evaluate_result(ctx: StageContext[ExportParams, ExportTuning]) -> EvaluateResult | None:
    """evaluate's result when it is an input (evaluation.sweep, training.checkpointSelection acceptance)."""
    if Stage.EVALUATE not in ctx.inputs:
        return None
    return EvaluateResult.parse(read_result(ctx.input(Stage.EVALUATE)))


def shipped_checkpoint(train: Path, evaluated: EvaluateResult | None) -> tuple[Path, dict[str, Any]]:
    """The checkpoint export ships: the epoch evaluate chose by measured acceptance (and the manifest's
    `checkpointSelection`: every measured epoch's figures) when it chose one, else train's best by
    validation loss (and nothing for the manifest)."""
    choice = evaluated.checkpoint_selection if evaluated is not None else None
    if choice is None:
        return best_checkpoint(train), {}
    path = train / choice.checkpoint
    missing = missing_files(path)
    if missing:
        raise StageError(
            f"evaluate chose epoch {choice.epoch}'s checkpoint {path}, which has no {', '.join(missing)}: "
            "train's output changed after evaluate; re-run stages train and evaluate"
        )
    logger.info("export: epoch %d's checkpoint (chosen by measured acceptance)", choice.epoch)
    return path, {"checkpointSelection": choice.model_dump(mode="json", by_alias=True)}


def speculation_of(evaluated: EvaluateResult | None) -> dict[str, Any]:
    """{SPECULATION_KEY: evaluate's speculation-length table} when evaluate measured one (evaluation.sweep);
    {} otherwise (the manifest then has no such key, as before the sweep). With it, evaluate's acceptance
    per category (`categories`) where it measured them."""
    table = evaluated.speculation if evaluated is not None else None
    if table is None:
        return {}
    rows = evaluated.categories if evaluated is not None else None
    by_category = {"categories": [r.model_dump(mode="json", by_alias=True) for r in rows]} if rows else {}
    return {SPECULATION_KEY: table.model_dump(mode="json", by_alias=True)} | by_category


def check_size(manifest: dict[str, Any], weights: ServingWeights) -> float:
    """The checkpoint's bytes over its weights' (bf16 parameters and the mapping); a StageError above the
    allowed overhead."""
    size, expected = int(manifest["bytes"]), weights.expected_bytes
    ratio = size / expected
    if ratio > 1 + MAX_OVERHEAD:
        raise StageError(
            f"the serving checkpoint takes {size} bytes, {ratio:.3f}x its weights' {expected} bytes (bf16 "
            f"parameters and the d2t/t2d mapping); more than {MAX_OVERHEAD:.0%} over: files "
            f"{sorted(manifest['files'])}, tensors {sorted(weights.tensors)}: drop what vLLM does not need"
        )
    return ratio


def vocab_mapping(vocab: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """The vocab stage's d2t and t2d (its result names the files)."""
    import numpy as np
    import torch

    result = read_result(vocab)
    paths = [vocab / str(result.get(name)) for name in ("d2t", "t2d")]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise StageError(f"the vocab stage's mapping files are missing: {missing}; re-run stage vocab")
    d2t, t2d = (torch.from_numpy(np.load(p)) for p in paths)
    return d2t, t2d


def check_mapping(d2t: torch.Tensor | None, t2d: torch.Tensor | None, vocab: Path, source: Path) -> None:
    """The draft carries the vocab stage's mapping, and its d2t and t2d agree."""
    import torch

    want_d2t, want_t2d = vocab_mapping(vocab)
    if d2t is None or t2d is None:
        raise StageError(f"the draft {source} has no d2t/t2d mapping; re-run stage train")
    same = (
        d2t.shape == want_d2t.shape
        and t2d.shape == want_t2d.shape
        and torch.equal(d2t.to(torch.long), want_d2t.to(torch.long))
        and torch.equal(t2d.to(torch.bool), want_t2d.to(torch.bool))
    )
    if not same:
        raise StageError(
            f"the draft {source} carries another d2t/t2d mapping than the vocab stage's {vocab} (draft "
            f"vocabulary {d2t.numel()} vs {want_d2t.numel()} tokens): it was trained on a stale mapping and "
            "would propose the wrong tokens; re-run stage train with this vocab output"
        )
    problem = mapping_problem(d2t, t2d, want_t2d.numel())
    if problem:
        raise StageError(f"the draft {source}: {problem}; re-run stages vocab and train")


def check_parameter_count(train: Path, trainable: int) -> None:
    """train's result counts the parameters it trained: a different count means the export misreads it."""
    reported = read_result(train).get("parameters")
    if isinstance(reported, int) and reported != trainable:
        logger.warning(
            "export: the checkpoint has %d trainable parameters, train reports %d", trainable, reported
        )
