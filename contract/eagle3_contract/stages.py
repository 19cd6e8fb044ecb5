"""The stages of an Eagle3Run, defined once: what each needs, what it reads, and how it is invoked.

The Job builder puts `stage_argv(...)` into a container; the local executor runs the same argv as a
subprocess. Each stage's identity is a content hash of the parameters that change its output and of its
inputs' hashes, so a spec edit re-runs exactly the stages whose output it changes (the GitOps contract), and
an output directory on the artifacts volume is reused by any run that asks for the same thing.

`verify` is the one stage that trains nothing: with `serving.pinnedCheckpoint.sha256` set (a draft promoted
through git), it hashes the pinned draft's files where they are; the Deployment rolls only after it passed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from eagle3_contract.api.spec import CheckpointSelection, Device, Eagle3RunSpec, Promotion
from eagle3_contract.params import (
    ExportTuning,
    StageParams,
    StageTuning,
    VerifyTuning,
    VocabTuning,
    evaluate_params,
    evaluate_tuning,
    export_params,
    extract_params,
    extract_tuning,
    generate_params,
    generate_tuning,
    predict_params,
    predict_tuning,
    prepare_params,
    prepare_tuning,
    train_params,
    train_tuning,
    verify_params,
    vocab_params,
)

# Bump when a stage program's output format (or its parameters) changes: every hash changes, stages re-run.
# 2: the typed stage parameters (eagle3_contract.params) are the hash payload.
STAGE_FORMAT_VERSION = 2
HASH_LENGTH = 12
PINNED_SKIP = "serving.pinnedCheckpoint is set: the pinned draft is served, nothing trains"
REGENERATION_OFF = "regeneration.enabled is false: training uses the dataset's own answers"
ONLINE_EXTRACTION = (
    "extraction.mode is online: the train stage asks the hidden-state producers for each sample, nothing is "
    "stored beforehand"
)
NO_PREDICTION = "evaluation.predict is false: no speedup is predicted before training"


class Stage(StrEnum):
    PREDICT = "predict"  # first: it needs only the verifier, and says before training whether a draft pays
    PREPARE = "prepare"
    GENERATE = "generate"
    EXTRACT = "extract"
    VOCAB = "vocab"
    TRAIN = "train"
    EVALUATE = "evaluate"
    EXPORT = "export"
    VERIFY = "verify"


ORDER: tuple[Stage, ...] = tuple(Stage)


def data_stage(spec: Eagle3RunSpec) -> Stage:
    return Stage.GENERATE if spec.regeneration.enabled else Stage.PREPARE


def _trains(spec: Eagle3RunSpec) -> str | None:
    """Why a training stage is skipped: a pinned draft trains nothing, unless promotion is reviewed (the pin
    names what serves while the run trains its next candidate)."""
    automatic = spec.serving.promotion is Promotion.AUTOMATIC
    return PINNED_SKIP if spec.serving.pinned_checkpoint is not None and automatic else None


def _regenerates(spec: Eagle3RunSpec) -> str | None:
    return _trains(spec) or (None if spec.regeneration.enabled else REGENERATION_OFF)


def _online(spec: Eagle3RunSpec) -> bool:
    return spec.extraction.mode == "online"


def _extracts(spec: Eagle3RunSpec) -> str | None:
    return _trains(spec) or (ONLINE_EXTRACTION if _online(spec) else None)


def _train_upstream(spec: Eagle3RunSpec) -> tuple[Stage, ...]:
    # the data stage too: the trainer reads its dataset (loss masks, the train/validation split)
    if _online(spec):
        return (data_stage(spec), Stage.VOCAB)
    return (data_stage(spec), Stage.EXTRACT, Stage.VOCAB)


def _predicts(spec: Eagle3RunSpec) -> str | None:
    """The prediction is made before training: a pinned draft that trains nothing needs none."""
    return _trains(spec) or (None if spec.evaluation.predict else NO_PREDICTION)


def _export_upstream(spec: Eagle3RunSpec) -> tuple[Stage, ...]:
    # evaluate too with evaluation.sweep (its speculation-length table goes into the checkpoint's manifest)
    # or training.checkpointSelection acceptance or draft.candidates (it chose the checkpoint export ships)
    chooses = spec.training.checkpoint_selection is CheckpointSelection.ACCEPTANCE
    chooses = chooses or spec.draft.candidates is not None  # or which candidate (draft.candidates)
    evaluate = (Stage.EVALUATE,) if spec.evaluation.sweep is not None or chooses else ()
    return (Stage.TRAIN, Stage.VOCAB, *evaluate)


def _verifies(spec: Eagle3RunSpec) -> str | None:
    """verify checks a pinned draft's files against the digest in git; an export's digest is its own."""
    pinned = spec.serving.pinned_checkpoint
    if pinned is None:
        return "no serving.pinnedCheckpoint: the exported draft's sha256 is the one export computed"
    if pinned.sha256 is None:
        return "serving.pinnedCheckpoint.sha256 is not set: the pinned draft is served unchecked"
    return None


@dataclass(frozen=True)
class StageDef:
    """A stage: GPUs it needs (nodePool.device gpu: `stage_gpus`), whether it runs vLLM, its upstream stages,
    its parameters and its tuning.

    `params` is the stage's hashed payload and what its program reads as `ctx.params`; `tuning` is what the
    program reads that is NOT hashed (`ctx.tuning`, see eagle3_contract.params). `skip` says why the stage
    does not run for a spec (None: it runs); `reuses_output` false makes the program run again even when its
    output exists (a check must look at the files as they are now).
    """

    stage: Stage
    gpus: Callable[[Eagle3RunSpec], int]
    uses_vllm: Callable[[Eagle3RunSpec], bool]
    upstream: Callable[[Eagle3RunSpec], tuple[Stage, ...]]
    params: Callable[[Eagle3RunSpec], StageParams]
    tuning: Callable[[Eagle3RunSpec], StageTuning]
    token_budget: Callable[[Eagle3RunSpec], int] | None = None
    skip: Callable[[Eagle3RunSpec], str | None] = _trains
    reuses_output: bool = True


def _none(spec: Eagle3RunSpec) -> int:
    return 0


def on_cpu(spec: Eagle3RunSpec) -> bool:
    """nodePool.device cpu: a small verifier on nodes without GPUs; no stage (nor vLLM pod) asks for one."""
    return spec.node_pool.device is Device.CPU


def stage_gpus(spec: Eagle3RunSpec, stage: Stage) -> int:
    """GPUs of one pod of `stage`: its definition's count, 0 for every stage in CPU mode."""
    return 0 if on_cpu(spec) else DEFINITIONS[stage].gpus(spec)


def _tp(spec: Eagle3RunSpec) -> int:
    return spec.verifier.tensor_parallel_size


DEFINITIONS: dict[Stage, StageDef] = {
    Stage.PREDICT: StageDef(
        Stage.PREDICT,
        gpus=_tp,
        uses_vllm=lambda s: True,
        upstream=lambda s: (),
        params=predict_params,
        tuning=predict_tuning,
        skip=_predicts,
    ),
    Stage.PREPARE: StageDef(
        Stage.PREPARE,
        gpus=_none,
        uses_vllm=lambda s: False,
        upstream=lambda s: (),
        params=prepare_params,
        tuning=prepare_tuning,
    ),
    Stage.GENERATE: StageDef(
        Stage.GENERATE,
        gpus=_tp,
        uses_vllm=lambda s: True,
        upstream=lambda s: (Stage.PREPARE,),
        params=generate_params,
        tuning=generate_tuning,
        token_budget=lambda s: generate_tuning(s).token_budget,
        skip=_regenerates,
    ),
    Stage.EXTRACT: StageDef(
        Stage.EXTRACT,
        gpus=_tp,
        uses_vllm=lambda s: s.extraction.backend == "vllm",
        upstream=lambda s: (data_stage(s),),
        params=extract_params,
        tuning=extract_tuning,
        token_budget=lambda s: extract_tuning(s).token_budget,
        skip=_extracts,
    ),
    Stage.VOCAB: StageDef(
        Stage.VOCAB,
        gpus=_none,
        uses_vllm=lambda s: False,
        upstream=lambda s: (data_stage(s),),
        params=vocab_params,
        tuning=lambda s: VocabTuning(),
    ),
    Stage.TRAIN: StageDef(
        Stage.TRAIN,
        gpus=lambda s: s.training.gpus,
        uses_vllm=lambda s: False,
        upstream=_train_upstream,
        params=train_params,
        tuning=train_tuning,
    ),
    Stage.EVALUATE: StageDef(
        Stage.EVALUATE,
        gpus=_tp,
        uses_vllm=lambda s: True,
        upstream=lambda s: (data_stage(s), Stage.TRAIN),
        params=evaluate_params,
        tuning=evaluate_tuning,
    ),
    Stage.EXPORT: StageDef(
        Stage.EXPORT,
        gpus=_none,
        uses_vllm=lambda s: False,
        upstream=_export_upstream,
        params=export_params,
        tuning=lambda s: ExportTuning(),
    ),
    Stage.VERIFY: StageDef(
        Stage.VERIFY,
        gpus=_none,
        uses_vllm=lambda s: False,
        upstream=lambda s: (),
        params=verify_params,
        tuning=lambda s: VerifyTuning(),
        skip=_verifies,
        reuses_output=False,
    ),
}


@dataclass(frozen=True)
class StagePlan:
    """One stage resolved against a spec. `output_dir` and `inputs` are relative to the artifacts root."""

    stage: Stage
    hash: str
    output_dir: str
    inputs: dict[str, str] = field(default_factory=dict)
    gpus: int = 0
    uses_vllm: bool = False
    token_budget: int | None = None
    skipped: str | None = None
    reuses_output: bool = True

    @property
    def retries_oom(self) -> bool:
        return self.token_budget is not None


def content_hash(payload: dict[str, Any]) -> str:
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:HASH_LENGTH]


def plan_stages(spec: Eagle3RunSpec, fixed: Mapping[Stage, StagePlan] | None = None) -> list[StagePlan]:
    """Every stage in order, with its hash, directories and needs; disabled stages carry `skipped`. A stage
    in `fixed` is that plan as given (a later generation's own data stage, the first one's vocabulary:
    eagle3_contract.generation), and the stages after it hash its hash."""
    plans: dict[Stage, StagePlan] = {}
    for stage in ORDER:
        if fixed is not None and stage in fixed:
            plans[stage] = fixed[stage]
            continue
        d = DEFINITIONS[stage]
        upstream = {up: plans[up] for up in d.upstream(spec)}
        digest = content_hash(
            {
                "stage": stage.value,
                "format": STAGE_FORMAT_VERSION,
                "params": d.params(spec).model_dump(mode="json", by_alias=True),
                "inputs": {up.value: p.hash for up, p in upstream.items()},
            }
        )
        plans[stage] = StagePlan(
            stage=stage,
            hash=digest,
            output_dir=f"{stage.value}/{digest}",
            inputs={up.value: p.output_dir for up, p in upstream.items()},
            gpus=stage_gpus(spec, stage),
            uses_vllm=d.uses_vllm(spec),
            token_budget=d.token_budget(spec) if d.token_budget else None,
            skipped=d.skip(spec),
            reuses_output=d.reuses_output,
        )
    return list(plans.values())


def stage_argv(
    plan: StagePlan, spec_path: str, artifacts_root: str, token_budget: int | None = None
) -> list[str]:
    """The command line of a stage program: the same locally and in a Job's container."""
    argv = ["eagle3", "stage", plan.stage.value, "--spec", spec_path, "--artifacts", artifacts_root]
    argv += ["--output", plan.output_dir]
    for name, path in sorted(plan.inputs.items()):
        argv += ["--input", f"{name}={path}"]
    budget = token_budget if token_budget is not None else plan.token_budget
    if budget is not None:
        argv += ["--token-budget", str(budget)]
    return argv
