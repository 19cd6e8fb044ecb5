"""The train stage in online mode: where the producers are, what they produce, and what is left afterwards.

The stage reads no extract output: the layers and the hidden size come from the verifier's config (the same
resolution as the extract stage and `eagle3 produce`, so the producers store exactly the layers the draft
reads), the producers' endpoint and the Mooncake master from the environment the operator (or `eagle3 run`)
sets (eagle3_contract.online). With the volume transfer the producers write each sample under
`<artifacts>/hidden-states/<train hash>/`; the trainer deletes each once consumed, and the stage removes the
directory when training is done, so an online run leaves no hidden states behind unless `extraction.keep`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from eagle3_contract.api.spec import HiddenStatesTransfer, StorageDtype
from eagle3_contract.online import ENV_HIDDEN_STATES_ENDPOINT, ENV_MOONCAKE_MASTER, staging_dir
from eagle3_contract.params import TrainParams, TrainTuning
from eagle3_pipeline.data.hidden_states import resolve_aux_layers
from eagle3_pipeline.data.verifier import LocalVerifier, verifier_dims
from eagle3_pipeline.runtime.context import StageContext
from eagle3_pipeline.runtime.errors import StageError
from eagle3_pipeline.stages.train.online_samples import ENV_CACHE

logger = logging.getLogger(__name__)

CACHE_DIR = "hidden_states"  # inside the train stage's work directory: kept samples (extraction.keep)

Context = StageContext[TrainParams, TrainTuning]


def transfer_backend(transfer: HiddenStatesTransfer, dtype: StorageDtype) -> str:
    """The hs-connectors backend the producers write with and the trainer reads with."""
    if transfer == HiddenStatesTransfer.MOONCAKE:
        return "mooncake"
    return "fp8" if dtype == StorageDtype.FP8 else "file"


def staging(ctx: Context) -> Path:
    """Where the producers write this train stage's samples (volume transfer): its hash names it."""
    return ctx.artifacts / staging_dir(ctx.output.name)


def online_inputs(ctx: Context) -> dict[str, Any]:
    """DraftSources' hidden-state fields in online mode: layers and size from the verifier's config."""
    online = ctx.params.online
    assert online is not None
    endpoint = os.environ.get(ENV_HIDDEN_STATES_ENDPOINT)
    if not endpoint:
        raise StageError(
            f"extraction.mode is online, but ${ENV_HIDDEN_STATES_ENDPOINT} is not set: the train stage needs "
            "the hidden-state producers' URL (http://host:port/v1; the operator and `eagle3 run` set it)"
        )
    v = ctx.params.verifier
    shape = verifier_dims(LocalVerifier(ctx.local_path(v.model), v.revision, v.trust_remote_code))
    aux = resolve_aux_layers(online.layers, shape.num_hidden_layers)
    return {
        "hidden_states": ctx.work / CACHE_DIR,
        "transfer": transfer_backend(ctx.tuning.transfer, online.dtype),
        "aux_layers": list(aux),
        "hidden_size": shape.hidden_size,
        "endpoint": endpoint,
        "mooncake_master": os.environ.get(ENV_MOONCAKE_MASTER) or None,
    }


@contextlib.contextmanager
def online_environment(ctx: Context) -> Iterator[None]:
    """With extraction.keep, tell the trainer (and its torchrun workers) where to keep the samples."""
    if ctx.params.online is None or not ctx.tuning.keep:
        yield
        return
    before = os.environ.get(ENV_CACHE)
    os.environ[ENV_CACHE] = str(ctx.work / CACHE_DIR)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(ENV_CACHE, None)
        else:
            os.environ[ENV_CACHE] = before


def finish_online(ctx: Context) -> dict[str, Any]:
    """After training: remove the staging directory (nothing is kept there), report what was kept."""
    if ctx.params.online is None:
        return {}
    leftover = 0
    stage_dir = staging(ctx)
    if stage_dir.is_dir():
        leftover = sum(1 for p in stage_dir.rglob("*") if p.is_file())
        shutil.rmtree(stage_dir, ignore_errors=True)
        if leftover:
            logger.warning(
                "train: removed %d hidden-state files the producers left in %s", leftover, stage_dir
            )
    cache = ctx.work / CACHE_DIR
    kept = [p for p in cache.glob("hs_*.safetensors")] if cache.is_dir() else []
    return {
        "hiddenStates": {
            "mode": "online",
            "transfer": ctx.tuning.transfer.value,
            "keptSamples": len(kept),
            "keptBytes": sum(p.stat().st_size for p in kept),
            "removedLeftovers": leftover,
        }
    }
