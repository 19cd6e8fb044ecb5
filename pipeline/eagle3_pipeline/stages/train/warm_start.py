"""training.warmStart: fine-tune an exported draft instead of training fresh weights.

A later generation of a draft (captured traffic, a shifted mix) learns in a few epochs what a fresh draft
needs all of them for, if it starts from the draft that serves. It can start there only when the weights
mean the same thing here: the same draft method and decoder layers, the same verifier layers feeding it, and
the same vocabulary mapping (a draft's output rows are draft-vocabulary ids: under another d2t the same
weights would propose other tokens). Where any differs, training starts cold and the result says why; a
wrong path or a checksum that does not match is the spec's error and fails the stage.

The export is a slim serving checkpoint without the verifier's embeddings (eagle3_pipeline.data.
draft_checkpoint). speculators' `from_pretrained` would fill them from the verifier only in some cases, so
the draft is loaded with `load_serving_draft` (embeddings copied from the verifier) and saved whole into the
work directory, and speculators' `--from-pretrained` (DraftArgs.from_pretrained) starts from that copy.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3_contract.api.spec import WarmStart
from eagle3_contract.params import TrainParams
from eagle3_pipeline.data.draft_checkpoint import (
    WEIGHTS_FILE,
    check_exported,
    checkpoint_method,
    load_serving_draft,
    missing_files,
    read_config,
)
from eagle3_pipeline.stages.train.draft import DraftSources

logger = logging.getLogger(__name__)

WARM_DIR = (
    "warm_start"  # in the work directory: the exported draft with its embeddings, as speculators loads it
)
WARM, COLD = "warm", "cold"


@dataclass(frozen=True)
class StartingPoint:
    """Where training starts: `checkpoint` (None: fresh weights), and the result's `warmStart` line."""

    checkpoint: Path | None
    note: dict[str, str]


def starting_point(
    warm: WarmStart, draft_dir: Path, params: TrainParams, src: DraftSources, work: Path
) -> StartingPoint:
    """The exported draft at `draft_dir` (training.warmStart.path, mapped onto this machine), checked and
    copied whole into `work`, or a cold start saying why it does not fit."""
    remedy = "point it at an exported draft (export/<hash>), or remove training.warmStart to train fresh"
    check_exported(draft_dir, "training.warmStart", warm, remedy)
    reason = misfit(draft_dir, params, src)
    if reason is not None:
        logger.warning("train: training.warmStart %s does not fit, starting cold: %s", warm.path, reason)
        return StartingPoint(None, {"from": warm.path, "start": COLD, "reason": reason})
    target = work / WARM_DIR
    if not missing_files(target):  # an earlier attempt's copy
        return StartingPoint(target, {"from": warm.path, "start": WARM})
    model = load_serving_draft(draft_dir, src.verifier)
    model.save_pretrained(str(target))
    logger.info("train: starting from the weights of %s", warm.path)
    return StartingPoint(target, {"from": warm.path, "start": WARM})


def misfit(draft_dir: Path, params: TrainParams, src: DraftSources) -> str | None:
    """Why the exported draft's weights cannot start this training (None: they can)."""
    config = read_config(draft_dir)
    method = checkpoint_method(draft_dir)
    if method is not params.draft.method:
        return f"it is a {method.value} draft, draft.method is {params.draft.method.value}"
    layers = (config.get("transformer_layer_config") or {}).get("num_hidden_layers")
    if layers != params.draft.layers:
        return f"it has {layers} decoder layers, draft.layers is {params.draft.layers}"
    aux = config.get("eagle_aux_hidden_state_layer_ids")
    if aux is not None and list(aux) != list(src.aux_layers):
        return (
            f"it reads verifier layers {list(aux)}, this run's hidden states are of layers {src.aux_layers}"
        )
    return _mapping_misfit(draft_dir, src)


def _mapping_misfit(draft_dir: Path, src: DraftSources) -> str | None:
    import numpy as np
    from safetensors import safe_open

    with safe_open(str(draft_dir / WEIGHTS_FILE), framework="pt") as f:
        names = set(f.keys())
        if not {"d2t", "t2d"} <= names:
            return "it holds no vocabulary mapping (d2t, t2d)"
        theirs: dict[str, Any] = {name: f.get_tensor(name).numpy() for name in ("d2t", "t2d")}
    for name, path in (("d2t", src.d2t), ("t2d", src.t2d)):
        ours = np.load(path)
        if theirs[name].shape != ours.shape or not np.array_equal(theirs[name], ours):
            return (
                f"its vocabulary mapping ({name}) differs from the one this run's vocab stage made: a new "
                "mapping needs fresh weights"
            )
    return None
