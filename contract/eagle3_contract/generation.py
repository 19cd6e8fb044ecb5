"""A later generation of a run's draft: its stages, planned from the run's spec and what started it.

The first generation is the run's spec as written. A later one keeps the draft current with the traffic it
serves: its dataset is the captured records of a window (serving.capture), screened and split, mixed with the
first generation's prepared conversations at a ratio; it trains warm-started from the draft serving now, for
fewer epochs; evaluate measures it beside that draft (evaluation.incumbent) on the same held-out prompts,
captured and original; export ships it. It is planned as the run's own stages with three differences:

- prepare is the generation's own: `GenerationData` in its params (the window, the ratio), and the first
  generation's data stage (prepare, or generate) as its input;
- vocab is the first generation's, as it is: the mapping stays, so the serving draft's weights start the
  training warm (a new mapping would force a cold start; stages.train.warm_start says which it got);
- train, evaluate and export follow from those with `training.epochs` the generation's, `training.warmStart`
  and `evaluation.incumbent` the serving draft; regeneration, the prediction and verify do not run (the
  captured answers are the verifier's own: speculative decoding is lossless).

Every hash follows from the spec, the window and the serving draft, so a generation is content-addressed
like the first: planned again, it is the same stages with the same outputs, and a generation that fails
leaves the serving draft and the first generation's outputs untouched.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from eagle3_contract.api.spec import Eagle3RunSpec, ExportedDraft, Incumbent, WarmStart
from eagle3_contract.params import GenerationData, PrepareParams, prepare_params
from eagle3_contract.stages import (
    STAGE_FORMAT_VERSION,
    Stage,
    StagePlan,
    content_hash,
    data_stage,
    plan_stages,
)

DEFAULT_ORIGINAL_RATIO = 1.0
DEFAULT_EPOCHS = 3


@dataclass(frozen=True)
class Generation:
    """What starts a later generation: its number (2 and on), the records' window, the serving draft, and
    how much of the original data and how many epochs."""

    number: int
    capture: str  # the capture directory as the pods see it (/artifacts/capture), or a file of records
    serving: ExportedDraft
    after: datetime | None = None
    until: datetime | None = None  # None: every record (a file replayed locally)
    original_ratio: float = DEFAULT_ORIGINAL_RATIO
    epochs: int = DEFAULT_EPOCHS

    def data(self) -> GenerationData:
        return GenerationData(
            capture=self.capture,
            after=_instant(self.after) if self.after is not None else None,
            until=_instant(self.until) if self.until is not None else None,
            original_ratio=self.original_ratio,
        )


def _instant(at: datetime) -> str:
    return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def generation_spec(spec: Eagle3RunSpec, generation: Generation) -> Eagle3RunSpec:
    """The spec the generation's train, evaluate and export are planned from: the generation's epochs, a
    warm start from the serving draft and that draft as evaluate's incumbent; no regeneration, prediction
    or pinned draft (the generation trains, whatever serves)."""
    serving = generation.serving.model_dump()
    return spec.model_copy(
        update={
            "regeneration": spec.regeneration.model_copy(update={"enabled": False}),
            "training": spec.training.model_copy(
                update={"epochs": generation.epochs, "warm_start": WarmStart.model_validate(serving)}
            ),
            "evaluation": spec.evaluation.model_copy(
                update={"predict": False, "incumbent": Incumbent.model_validate(serving)}
            ),
            "serving": spec.serving.model_copy(update={"pinned_checkpoint": None}),
        }
    )


def plan_generation(spec: Eagle3RunSpec, generation: Generation) -> list[StagePlan]:
    """Every stage of the generation in order (the first generation's vocab among them, complete already;
    the stages a generation does not run carry `skipped`)."""
    return plan_stages(generation_spec(spec, generation), fixed_plans(spec, generation))


def fixed_plans(spec: Eagle3RunSpec, generation: Generation) -> dict[Stage, StagePlan]:
    """The generation's own prepare, and the first generation's vocab: the plans its stages start from."""
    first = {plan.stage: plan for plan in plan_stages(spec)}
    base = first[data_stage(spec)]
    if base.skipped is not None:
        raise ValueError(
            "a later generation mixes in the first one's prepared data, and this run prepares none "
            f"({base.skipped})"
        )
    params = generation_prepare_params(spec, generation.data())
    digest = content_hash(
        {
            "stage": Stage.PREPARE.value,
            "format": STAGE_FORMAT_VERSION,
            "params": params.model_dump(mode="json", by_alias=True),
            "inputs": {base.stage.value: base.hash},
        }
    )
    prepare = StagePlan(
        stage=Stage.PREPARE,
        hash=digest,
        output_dir=f"{Stage.PREPARE.value}/{digest}",
        inputs={base.stage.value: base.output_dir},
    )
    return {Stage.PREPARE: prepare, Stage.VOCAB: first[Stage.VOCAB]}


def generation_prepare_params(spec: Eagle3RunSpec, generation: GenerationData) -> PrepareParams:
    """The params the generation's prepare program reads (what its hash hashed)."""
    return PrepareParams.model_validate(
        prepare_params(spec).model_dump() | {"generation": generation.model_dump()}
    )


# --- the generation's manifest: what its stage programs read ---------------------------------------------

GENERATION_ANNOTATION = "eagle3.dev/generation"  # on a generation's manifest: its number and GenerationData


def generation_manifest(
    document: dict[str, Any], spec: Eagle3RunSpec, generation: Generation
) -> dict[str, Any]:
    """The manifest a generation's stage programs read: the run's document with the generation's spec
    (`generation_spec`) and, as an annotation, its number, its data (prepare's params) and the plans it
    starts from (`fixed_plans`, so a reader plans its stages from this document alone: `manifest_plans`);
    every other stage's params follow from that spec by the definitions that made their hashes."""
    metadata = dict(document.get("metadata") or {})
    annotations = dict(metadata.get("annotations") or {})
    fixed = {stage.value: asdict(plan) for stage, plan in fixed_plans(spec, generation).items()}
    note = {
        "number": generation.number,
        "data": generation.data().model_dump(mode="json", by_alias=True),
        "fixed": fixed,
    }
    annotations[GENERATION_ANNOTATION] = json.dumps(note, sort_keys=True, default=str)
    return {
        **document,
        "metadata": {**metadata, "annotations": annotations},
        "spec": generation_spec(spec, generation).model_dump(mode="json", by_alias=True, exclude_none=True),
    }


def _note(document: dict[str, Any]) -> dict[str, Any] | None:
    """The annotation's content; ValueError for one this version did not write."""
    annotations = (document.get("metadata") or {}).get("annotations") or {}
    note = annotations.get(GENERATION_ANNOTATION)
    if note is None:
        return None
    try:
        content = json.loads(note)
        if not isinstance(content, dict) or not {"number", "data", "fixed"} <= set(content):
            raise ValueError(
                f"keys {sorted(content) if isinstance(content, dict) else type(content).__name__}"
            )
    except ValueError as exc:
        raise ValueError(
            f"metadata.annotations[{GENERATION_ANNOTATION}] is not a generation this version wrote ({exc}): "
            "plan the generation again (eagle3 run --retrain)"
        ) from None
    return content


def generation_of(document: dict[str, Any]) -> GenerationData | None:
    """The generation data of a manifest `generation_manifest` wrote; None for a run's own manifest."""
    note = _note(document)
    return GenerationData.model_validate(note["data"]) if note is not None else None


def generation_number(document: dict[str, Any]) -> int | None:
    """The generation's number (2 and on) of a manifest `generation_manifest` wrote; None for a run's own."""
    note = _note(document)
    return int(note["number"]) if note is not None else None


def manifest_plans(document: dict[str, Any], spec: Eagle3RunSpec) -> list[StagePlan]:
    """The stages of a manifest: a run's own (`plan_stages`), or a generation's from the plans its
    annotation names (the same as `plan_generation` made)."""
    note = _note(document)
    if note is None:
        return plan_stages(spec)
    fixed = {Stage(name): _plan(fields) for name, fields in note["fixed"].items()}
    return plan_stages(spec, fixed)


def _plan(fields: dict[str, Any]) -> StagePlan:
    return StagePlan(**{**fields, "stage": Stage(fields["stage"])})
