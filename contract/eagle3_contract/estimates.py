"""What a run would take, before it runs: tokens, hidden-state bytes in either extraction mode, GPUs by stage.

The operator cannot see the model or the dataset before the stages run, so every figure says its basis: the
token count is an upper bound (`dataset.maxSamples` x `maxSequenceLength`) until a data stage's result gives
the exact count, and the hidden-state bytes need the verifier's hidden size, which prepare's result records
(`eagle3 run --dry-run` reads it from a local config.json). The operator fills `status.plan.estimates` with
`estimates_from_stages`; the local dry run calls `run_estimates` with what it can read on this machine.

Per token, a hidden-state file holds (len(aux layers) + 1) x hiddenSize values in the storage dtype (the last
layer's output is always stored), its int64 token id and, in fp8, a float32 scale. Offline extraction stores
every token once; online producers compute each sample again every epoch (once with `extraction.keep`, which
then stores what offline would) and store only the samples in flight.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from eagle3_contract.api.rules import _text_config
from eagle3_contract.api.spec import Eagle3RunSpec, trained_methods
from eagle3_contract.api.status import (
    Estimates,
    HiddenStatesEstimate,
    ModeEstimate,
    ServingEstimate,
    StageEstimate,
    StageStatus,
)
from eagle3_contract.params import checkpoints_to_evaluate
from eagle3_contract.results import ExtractResult, GenerateResult, PrepareResult
from eagle3_contract.stages import Stage, StagePlan, on_cpu, plan_stages

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "fp8": 1}
TOKEN_ID_BYTES = 8  # int64 token_ids
BAKE_OFF_ROUND_PROMPTS = 16  # the kept prompts a round of draft.candidates' bake-off answers (at most)
FP8_SCALE_BYTES = 4  # float32 per-token scale of fp8 files
DEFAULT_AUX_LAYERS = 3  # [2, n // 2, n - 3]
_UNITS = ("B", "kB", "MB", "GB", "TB", "PB", "EB")


@dataclass(frozen=True)
class VerifierShape:
    hidden_size: int
    num_hidden_layers: int | None
    basis: str  # where the figures came from


@dataclass(frozen=True)
class TokenCount:
    tokens: int
    basis: str  # "exact: ...", "upper bound: ...", "estimated: ..."


def human_bytes(n: int) -> str:
    """Decimal units, one decimal: 86_028_000_000_000 -> '86.0 TB'."""
    value = float(n)
    for unit in _UNITS:
        if abs(value) < 1000 or unit == _UNITS[-1]:
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


def stored_layers(spec: Eagle3RunSpec) -> int:
    """Layers stored per token: the auxiliary layers (extraction.layers, default 3) and the last one."""
    layers = spec.extraction.layers
    return (len(layers) if layers else DEFAULT_AUX_LAYERS) + 1


def bytes_per_token(layers: int, hidden_size: int, dtype: str) -> int:
    """One token of a hidden-state file: its layers in the storage dtype, its token id, fp8's scale."""
    scale = FP8_SCALE_BYTES if dtype == "fp8" else 0
    return layers * hidden_size * DTYPE_BYTES[dtype] + TOKEN_ID_BYTES + scale


def shape_from_config(config: Mapping[str, Any], basis: str) -> VerifierShape | None:
    """The hidden size and depth from a config.json (the text config of multimodal ones); None without."""
    text = _text_config(config)
    hidden, depth = text.get("hidden_size"), text.get("num_hidden_layers")
    if not isinstance(hidden, int) or isinstance(hidden, bool) or hidden <= 0:
        return None
    return VerifierShape(hidden, depth if isinstance(depth, int) else None, basis)


def upper_bound(spec: Eagle3RunSpec) -> TokenCount | None:
    """dataset.maxSamples x maxSequenceLength; None without maxSamples (the dataset's size is unknown)."""
    ds = spec.dataset
    if ds.max_samples is None:
        return None
    return TokenCount(
        ds.max_samples * ds.max_sequence_length,
        f"upper bound from dataset.maxSamples x maxSequenceLength ({ds.max_samples} x "
        f"{ds.max_sequence_length})",
    )


def _mode_estimates(
    spec: Eagle3RunSpec, per_token: int | None, tokens: int | None, measured: int | None
) -> tuple[ModeEstimate, ModeEstimate]:
    total = per_token * tokens if per_token is not None and tokens is not None else None
    offline_total = measured if measured is not None else total
    epochs, keep = spec.training.epochs, spec.extraction.keep
    rounds = 1 if keep else epochs
    moved = total * rounds if total is not None else None
    online_stored = offline_total if keep else 0
    offline = ModeEstimate(
        stored_bytes=offline_total,
        stored=_human(offline_total),
        moved_bytes=offline_total,
        moved=_human(offline_total),
        note=("measured by extract" if measured is not None else "tokens x bytesPerToken")
        + ": extract computes and stores every sample once; train reads them from the volume each epoch",
    )
    online = ModeEstimate(
        stored_bytes=online_stored,
        stored=_human(online_stored),
        moved_bytes=moved,
        moved=_human(moved),
        note=(
            "extraction.keep: each sample is computed once and kept in the train stage's output"
            if keep
            else f"each sample is computed again every epoch (x{epochs} training.epochs); only samples in "
            "flight are stored (extraction.keep keeps them, storing what offline stores)"
        ),
    )
    return offline, online


def _human(n: int | None) -> str | None:
    return human_bytes(n) if n is not None else None


def hidden_states_estimate(
    spec: Eagle3RunSpec, shape: VerifierShape | None, tokens: int | None, measured: int | None = None
) -> HiddenStatesEstimate:
    layers, dtype = stored_layers(spec), spec.extraction.dtype.value
    per_token = bytes_per_token(layers, shape.hidden_size, dtype) if shape is not None else None
    offline, online = _mode_estimates(spec, per_token, tokens, measured)
    return HiddenStatesEstimate(
        mode=spec.extraction.mode.value,
        dtype=dtype,
        layers=layers,
        hidden_size=shape.hidden_size if shape is not None else None,
        bytes_per_token=per_token,
        offline=offline,
        online=online,
        basis=(
            f"hidden size {shape.basis}"
            if shape is not None
            else "the verifier's hidden size is not known until prepare has run (the operator cannot read "
            "the model)"
        ),
    )


def _stage_tokens(spec: Eagle3RunSpec, plan: StagePlan, tokens: int | None) -> tuple[int | None, str | None]:
    if plan.skipped:
        return None, None
    stage = plan.stage
    if stage in (Stage.PREPARE, Stage.GENERATE, Stage.EXTRACT, Stage.VOCAB) and tokens is not None:
        return tokens, "the dataset's tokens"
    if stage is Stage.TRAIN and tokens is not None:
        epochs, candidates = spec.training.epochs, trained_methods(spec.draft.candidates)
        basis = f"the dataset's tokens x {epochs} training.epochs"
        if len(candidates) > 1:  # trained in turn, each from the same data (ngram, suffix: not trained)
            names = ", ".join(c.value for c in candidates)
            return tokens * epochs * len(
                candidates
            ), f"{basis} x {len(candidates)} draft.candidates ({names})"
        return tokens * epochs, basis
    if stage is Stage.EVALUATE:
        ev = spec.evaluation
        if spec.draft.candidates:  # the bake-off: each draft, each rival and the verifier alone, in rounds
            contenders = len(spec.draft.candidates) + 1
            answers = contenders * 2 * ev.rounds * min(ev.prompts, BAKE_OFF_ROUND_PROMPTS)
            return (2 * ev.prompts + answers) * ev.max_tokens, (
                "upper bound: evaluation.prompts x maxTokens without and with the draft, and the bake-off's "
                f"{contenders} servers x up to {2 * ev.rounds} rounds (evaluation.rounds, doubled when "
                f"undecided) x {min(ev.prompts, BAKE_OFF_ROUND_PROMPTS)} prompts x maxTokens"
            )
        chosen = checkpoints_to_evaluate(spec)
        if chosen is None:
            return 2 * ev.prompts * ev.max_tokens, (
                "upper bound: evaluation.prompts x maxTokens, generated with and without the draft"
            )
        return (2 + chosen) * ev.prompts * ev.max_tokens, (
            "upper bound: evaluation.prompts x maxTokens, generated without the draft, with it, and with "
            f"each of {chosen} drafts to choose from (the last epochs)"
        )
    return None, None


def stage_estimate(spec: Eagle3RunSpec, plan: StagePlan, tokens: int | None) -> StageEstimate:
    """GPUs per pod x pods (skipped, or nodePool.device cpu: 0), the online producers' GPUs for train, and the
    stage's tokens."""
    count, basis = _stage_tokens(spec, plan, tokens)
    if plan.skipped:
        return StageEstimate(stage=plan.stage.value, gpus=0, pods=0, skipped=plan.skipped)
    pods = spec.training.nodes if plan.stage is Stage.TRAIN else 1
    producers = None
    if plan.stage is Stage.TRAIN and spec.extraction.mode == "online":
        producers = 0 if on_cpu(spec) else spec.extraction.servers * spec.verifier.tensor_parallel_size
    return StageEstimate(
        stage=plan.stage.value,
        gpus=plan.gpus * pods,
        pods=pods,
        producer_gpus=producers,
        tokens=count,
        basis=basis,
    )


def vllm_pod_gpus(spec: Eagle3RunSpec) -> int:
    """GPUs of one serving vLLM pod: the verifier's tensor parallelism; none on CPU (nodePool.device)."""
    return 0 if on_cpu(spec) else spec.verifier.tensor_parallel_size


def serving_estimate(spec: Eagle3RunSpec) -> ServingEstimate | None:
    """The Deployment's GPUs and, with serving.canary, the canary's beside it; None without serving."""
    serving = spec.serving
    if not serving.enabled:
        return None
    per_pod, canary = vllm_pod_gpus(spec), serving.canary
    return ServingEstimate(
        replicas=serving.replicas,
        gpus=serving.replicas * per_pod,
        canary_replicas=canary.replicas if canary is not None else None,
        canary_gpus=canary.replicas * per_pod if canary is not None else None,
    )


def peak_gpus(stages: Sequence[StageEstimate], serving: ServingEstimate | None) -> int:
    """The most GPUs held at once: the largest stage's (with train's producers), or serving's with its
    canary during a rollout."""
    stage = max((e.gpus + (e.producer_gpus or 0) for e in stages), default=0)
    rollout = (serving.gpus + (serving.canary_gpus or 0)) if serving is not None else 0
    return max(stage, rollout)


def run_estimates(
    spec: Eagle3RunSpec,
    shape: VerifierShape | None = None,
    tokens: TokenCount | None = None,
    measured_bytes: int | None = None,
    plans: Sequence[StagePlan] | None = None,
) -> Estimates:
    """The run's estimates from the spec, the verifier's shape and the token count where known (else the
    spec's upper bound); `measured_bytes`: what extract stored, once it has; `plans`: the spec's stage plans
    (default: planned here)."""
    count = tokens if tokens is not None else upper_bound(spec)
    n = count.tokens if count is not None else None
    stages = [stage_estimate(spec, plan, n) for plan in (plans if plans is not None else plan_stages(spec))]
    serving = serving_estimate(spec)
    return Estimates(
        tokens=n,
        tokens_basis=(
            count.basis
            if count is not None
            else "unknown until prepare has run: dataset.maxSamples is not set (it would give an upper bound)"
        ),
        hidden_states=hidden_states_estimate(spec, shape, n, measured_bytes),
        stages=stages,
        serving=serving,
        peak_gpus=peak_gpus(stages, serving),
    )


def known_from_results(
    spec: Eagle3RunSpec, prepare: PrepareResult | None, generate: GenerateResult | None
) -> tuple[VerifierShape | None, TokenCount | None]:
    """The verifier's shape and the token count the data stages' results give (None: not yet)."""
    shape = None
    if prepare is not None and prepare.hidden_size is not None:
        shape = VerifierShape(prepare.hidden_size, prepare.num_hidden_layers, "from prepare's result")
    if spec.regeneration.enabled:
        if generate is not None and generate.tokens is not None:
            return shape, TokenCount(generate.tokens, "exact: from generate's result")
        if prepare is not None and prepare.tokens is not None and prepare.samples:
            return shape, TokenCount(
                prepare.tokens,
                "estimated: from prepare's result, with the dataset's own answers, which regeneration "
                "rewrites (each up to regeneration.maxTokens)",
            )
        rows = prepare.conversations if prepare is not None else None
        if rows is None:
            return shape, None
        length = spec.dataset.max_sequence_length
        return shape, TokenCount(
            rows * length,
            f"upper bound from prepare's conversations x maxSequenceLength ({rows} x {length}): "
            "regeneration rewrites the answers",
        )
    if prepare is not None and prepare.tokens is not None:
        return shape, TokenCount(prepare.tokens, "exact: from prepare's result")
    return shape, None


def estimates_from_stages(
    spec: Eagle3RunSpec, stages: Mapping[str, StageStatus], plans: Sequence[StagePlan] | None = None
) -> Estimates:
    """The operator's status.plan.estimates: the spec, refined by the results in status.stages."""

    def result(stage: Stage) -> dict[str, Any] | None:
        found = stages.get(stage.value)
        return found.result if found is not None else None

    prepare = PrepareResult.parse(result(Stage.PREPARE))
    generate = GenerateResult.parse(result(Stage.GENERATE))
    extract = ExtractResult.parse(result(Stage.EXTRACT))
    shape, tokens = known_from_results(spec, prepare, generate)
    if shape is None and extract is not None and extract.hidden_size is not None:
        shape = VerifierShape(extract.hidden_size, None, "from extract's result")
    measured = extract.bytes if extract is not None and spec.extraction.mode == "offline" else None
    return run_estimates(spec, shape, tokens, measured, plans)
