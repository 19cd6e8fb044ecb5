"""What each stage program reports: one model per stage's result, shared by the programs and their readers.

A stage program's result is its `result.json` and its container's termination message; the operator copies
the message into `status.stages.<stage>.result`, and the gate, the checkpoint, the metrics, `eagle3 promote`
and `eagle3 run`'s summary read it. Typing it once here keeps the writer and its readers on the same keys.

The models describe the wire, so every field may be missing: Kubernetes keeps 4 KiB of a termination message
and `stage_main` drops the list and dict values of a longer one, an older program wrote fewer keys, and a
crashed one wrote text. Keys a newer program adds survive as extra fields (`extra="allow"`), so the status
keeps them. Types are strict (a bool is not a number, "2.5" is not a float), as the readers' checks were.
`parse_result` never raises: a value of the wrong type is dropped (and logged), text that is not JSON is kept
as `{"message": ...}`, so one malformed message cannot stop a reconcile.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any, ClassVar, Self, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from eagle3_contract.api.categories import CategoryFigures
from eagle3_contract.api.comparison import Comparison
from eagle3_contract.api.speculation import SpeculationTable
from eagle3_contract.stages import Stage

logger = logging.getLogger(__name__)

MESSAGE_TAIL = 2000  # the characters of a non-JSON termination message kept in the status


class ResultModel(BaseModel):
    """camelCase on the wire, snake_case in Python, strict types, unknown keys kept."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="allow", frozen=True, strict=True
    )

    def document(self) -> dict[str, Any]:
        """The camelCase JSON object: the keys that were given (an absent key stays absent), extras kept."""
        return self.model_dump(by_alias=True, exclude_unset=True)


class StageResult(ResultModel):
    """The fields every stage shares and the per-stage knowledge its readers need."""

    STAGE: ClassVar[Stage]
    # The fields `eagle3 run`'s summary table shows of this stage (its whole result is in result.json).
    SUMMARY: ClassVar[tuple[str, ...]] = ()

    seconds: float | None = None

    @property
    def tokens_processed(self) -> int | None:
        """The tokens this stage processed (the eagle3_run_tokens_processed metric); None: it counts none."""
        return None

    def summary(self) -> dict[str, Any]:
        """The SUMMARY fields this result has, by their camelCase keys, in SUMMARY's order."""
        fields = type(self).model_fields
        return {
            fields[name].alias or name: getattr(self, name)
            for name in self.SUMMARY
            if name in self.model_fields_set
        }

    @classmethod
    def parse(cls, payload: str | Mapping[str, Any] | None) -> Self | None:
        """This stage's result from a termination message (text) or a status document; None for nothing.

        Never raises: the fields whose values have the wrong type are dropped, the rest is kept.
        """
        document = parse_message(payload) if isinstance(payload, str) else payload
        if not document:
            return None
        values = dict(document)
        for _ in range(len(values) + 1):
            try:
                return cls.model_validate(values)
            except ValidationError as exc:
                bad = {str(err["loc"][0]) for err in exc.errors() if err["loc"]}
                logger.warning(
                    "stage %s: dropping result fields of the wrong type: %s", cls.STAGE, sorted(bad)
                )
                dropped = {k for k in values if k in bad or _alias(cls, k) in bad}
                if not dropped:
                    break
                values = {k: v for k, v in values.items() if k not in dropped}
        return cls()


def _alias(cls: type[BaseModel], key: str) -> str | None:
    field = cls.model_fields.get(key)
    return field.alias if field is not None else None


def parse_message(text: str | None) -> dict[str, Any] | None:
    """A termination message as a JSON object: non-JSON text as {"message": ...}, another JSON value as
    {"value": ...}; None for no message."""
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return {"message": text[-MESSAGE_TAIL:]}
    return value if isinstance(value, dict) else {"value": value}


def stage_error(text: str | None) -> str | None:
    """The error a failed stage program gave in its termination message (`{"error": ...}`); None when the
    message holds none (a crash before the program could write it, a plain text message)."""
    error = (parse_message(text) or {}).get("error")
    if not isinstance(error, str) or not error.strip():
        return None
    return error.strip()


# --- the data stages ----------------------------------------------------------------------------------------


class PreparedResult(StageResult):
    """A tokenized dataset's figures (eagle3_pipeline.data.prepared.write_prepared), of prepare and
    generate."""

    samples: int | None = None
    train: int | None = None
    validation: int | None = None
    train_ratio: float | None = None  # train reads it to split the dataset as the data stage did
    skipped: dict[str, int] | None = None
    skipped_total: int | None = None
    skipped_examples: dict[str, list[str]] | None = None
    # the samples by what they hold: chat, tool_calls, tool_calls_untrained, tool_results
    kept: dict[str, int] | None = None
    tokens: int | None = None
    assistant_tokens: int | None = None
    unique_assistant_tokens: int | None = None
    max_seq_len: int | None = None
    tokenize_seconds: float | None = None
    tokens_per_second: float | None = None


class PrepareResult(PreparedResult):
    """prepare; with regeneration on and a dataset without answers: format, conversations, samples 0."""

    STAGE = Stage.PREPARE
    SUMMARY = ("samples", "skipped_total", "tokens", "assistant_tokens", "tokens_per_second")

    format: str | None = None
    conversations: int | None = None
    # captured records read and left out, by reason: duplicate, repetition (eagle3_pipeline.stages.prepare)
    screened: dict[str, int] | None = None
    # a later generation's mix: captured {records, outsideWindow, train, validation, screened} and original
    # {train, validation} (eagle3_pipeline.stages.prepare.generation)
    generation: dict[str, dict[str, Any]] | None = None
    # local dataset files' paths, sizes and mtimes, hashed: `eagle3 run` warns when a cached output's differs
    dataset_fingerprint: str | None = None
    # the verifier's shape from its config, for status.plan.estimates (eagle3_contract.estimates)
    hidden_size: int | None = None
    num_hidden_layers: int | None = None

    @property
    def tokens_processed(self) -> int | None:
        return self.tokens  # tokenized conversation tokens


class GenerateResult(PreparedResult):
    """generate: the regenerated dataset's figures and the regeneration's (tokensPerSecond: generated)."""

    STAGE = Stage.GENERATE
    SUMMARY = (
        "samples", "skipped_total", "regenerated", "failed", "tokens", "assistant_tokens",
        "tokens_per_second",
    )  # fmt: skip

    rows: int | None = None
    regenerated: int | None = None
    kept_as_recorded: int | None = None  # conversations with tools: not regenerated
    failed: int | None = None
    resumed: int | None = None
    output_tokens: int | None = None
    generation_seconds: float | None = None
    server_start_seconds: float | None = None

    @property
    def tokens_processed(self) -> int | None:
        return self.output_tokens  # tokens the verifier generated


class ExtractResult(StageResult):
    STAGE = Stage.EXTRACT
    SUMMARY = ("samples", "tokens", "tokens_per_second", "bytes_per_token", "bytes")

    samples: int | None = None
    tokens: int | None = None
    extracted_samples: int | None = None
    extracted_tokens: int | None = None
    extract_seconds: float | None = None
    tokens_per_second: float | None = None
    bytes: int | None = None
    bytes_per_token: float | None = None
    layers: list[int] | None = None
    hidden_size: int | None = None
    dtype: str | None = None
    transfer: str | None = None
    backend: str | None = None
    token_budget: int | None = None
    resumed: int | None = None

    @property
    def tokens_processed(self) -> int | None:
        return self.tokens  # tokens whose hidden states are stored


class VocabResult(StageResult):
    """vocab (also its vocab.json): train and export open the d2t/t2d files it names."""

    STAGE = Stage.VOCAB
    SUMMARY = ("assistant_tokens", "draft_vocab_size", "coverage")

    draft_vocab_size: int | None = None
    target_vocab_size: int | None = None
    d2t: str | None = Field(None, alias="d2t")  # the file names (to_camel would write d2T)
    t2d: str | None = Field(None, alias="t2d")
    assistant_tokens: int | None = None
    unique_assistant_tokens: int | None = None
    coverage: float | None = None
    unique_coverage: float | None = None


# --- training and after -------------------------------------------------------------------------------------


class TrainEpoch(ResultModel):
    """One line of metrics.jsonl (eagle3_pipeline.stages.train.metrics), without speculators' raw record."""

    epoch: int | None = None  # speculators' 0-based index (its checkpoints/<epoch>); people read epoch + 1
    train_loss: float | None = None
    val_loss: float | None = None
    train_accuracy_by_position: list[float] | None = None
    val_accuracy_by_position: list[float] | None = None
    val_full_accuracy_by_position: list[float] | None = None
    val_loss_by_position: list[float] | None = None
    estimated_acceptance_length: float | None = None
    train_steps: int | None = None
    train_tokens: int | None = None
    train_seconds: float | None = None
    seconds: float | None = None
    learning_rate: Any = None  # speculators' value as it logs it ({optimizer: lr} today)


class TrainCandidate(ResultModel):
    """draft.candidates: one method's training, in the train stage's `candidates/<method>/`."""

    method: str
    checkpoint: str  # relative to train's output
    best_epoch: int | None = None
    best_val_loss: float | None = None
    estimated_acceptance_length: float | None = None
    train_seconds: float | None = None
    parameters: int | None = None


class TrainResult(StageResult):
    STAGE = Stage.TRAIN
    SUMMARY = ("draft_vocab_size", "best_val_loss", "estimated_acceptance_length")

    epochs: list[TrainEpoch] | None = None
    best_epoch: int | None = None  # the 0-based index, as TrainEpoch.epoch; shown as epoch best_epoch + 1
    best_val_loss: float | None = None  # the lowest over the epochs (best_epoch's), not the last epoch's
    val_accuracy_by_position: list[float] | None = None
    estimated_acceptance_length: float | None = None
    train_tokens_per_second: float | None = None
    checkpoint: str | None = None
    metrics: str | None = None
    parameters: int | None = None
    device: str | None = None
    world_size: int | None = None
    resumed_from_epoch: int | None = None
    train_seconds: float | None = None
    draft_vocab_size: int | None = None
    aux_layers: list[int] | None = None
    ttt_steps: int | None = None
    # draft.candidates: every method trained (the figures above are draft.method's); None without
    candidates: list[TrainCandidate] | None = None
    # training.warmStart: {"from": path, "start": "warm" | "cold", "reason": why cold}; None without
    warm_start: dict[str, str] | None = None

    @property
    def tokens_processed(self) -> int | None:
        """The epochs' trainTokens summed; None if a 4 KiB message lost the list or an epoch lacks them."""
        if not self.epochs:
            return None
        counts = [e.train_tokens for e in self.epochs]
        return None if any(c is None for c in counts) else sum(c for c in counts if c is not None)


class ServerStartSeconds(ResultModel):
    draft: float | None = None
    baseline: float | None = None


class SampledAcceptance(ResultModel):
    """evaluate's second measurement, at evaluation.sampling (the serving traffic's settings)."""

    temperature: float
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    prompts: int | None = None
    drafts: int | None = None
    draft_tokens: int | None = None
    accepted_tokens: int | None = None
    acceptance_rate: float | None = None
    acceptance_length: float | None = None
    acceptance_by_position: list[float] | None = None


class CheckpointFigures(ResultModel):
    """One epoch's draft as evaluate measured it for training.checkpointSelection acceptance: greedy, on the
    kept held-out prompts, at evaluation.numSpeculativeTokens (one vLLM server each)."""

    epoch: int
    checkpoint: str  # relative to train's output
    method: str | None = None  # draft.candidates: the candidate's method
    val_loss: float | None = None
    acceptance_length: float | None = None
    acceptance_rate: float | None = None
    output_tokens_per_second: float | None = None
    # draft.candidates: the paired rounds' speedup over the verifier alone, and each round's tokens/s
    comparison: Comparison | None = None
    rounds: list[float | None] | None = None
    # draft.candidates: of the first round's greedy answers, those identical token for token to the
    # verifier alone's (lossless speculative decoding: all of them, up to numerics)
    outputs_compared: int | None = None
    outputs_matching_alone: int | None = None


class RivalFigures(ResultModel):
    """draft.candidates: a training-free rival (ngram, suffix) or `none` (the verifier alone), as the
    bake-off measured it beside the trained drafts."""

    method: str
    acceptance_length: float | None = None
    output_tokens_per_second: float | None = None
    comparison: Comparison | None = None  # its speedup over the verifier alone (None for `none`)
    rounds: list[float | None] | None = None  # each round's output tokens/s
    outputs_compared: int | None = None  # as CheckpointFigures' (None for `none`)
    outputs_matching_alone: int | None = None


class Versus(ResultModel):
    """One paired comparison of the bake-off: `method` over `rival`, round by round."""

    method: str
    rival: str
    comparison: Comparison


BETTER = "better"  # CheckpointChoice.verdict: the shipped draft beat every rival and the other candidates
NOT_DISTINGUISHABLE = "notDistinguishable"  # it beat every rival, not the other trained candidates
RIVAL_NOT_BEATEN = "rivalNotBeaten"  # no trained draft beat every rival with its interval clear


def _differing(c: CheckpointFigures | RivalFigures) -> str:
    """`, 2 of 8 answers not the verifier alone's` where a contender's greedy answers differ from it."""
    compared, matching = c.outputs_compared, c.outputs_matching_alone
    if compared is None or matching is None or matching == compared:
        return ""
    return f", {compared - matching} of {compared} answers not the verifier alone's"


class IncumbentFigures(ResultModel):
    """evaluation.incumbent: the draft serving now, measured on the same kept held-out prompts as the new one
    (greedy, at evaluation.numSpeculativeTokens), overall and per category."""

    path: str
    method: str
    drafts: int | None = None
    accepted_tokens: int | None = None
    acceptance_length: float | None = None
    acceptance_rate: float | None = None
    # the new draft's acceptance length over the incumbent's (>1: the new one is accepted more); None when
    # either has none
    acceptance_ratio: float | None = None
    categories: list[CategoryFigures] | None = None

    def line(self) -> str:
        """`against the incumbent export/abc (eagle3): 2.41 over 2.02, 1.19x`: one line for a person."""
        ours = "n/a" if self.acceptance_ratio is None else f"{self.acceptance_ratio:.2f}x"
        theirs = "n/a" if self.acceptance_length is None else f"{self.acceptance_length:.2f}"
        return f"against the incumbent {self.path} ({self.method}, acceptance length {theirs}): {ours}"


class CheckpointChoice(ResultModel):
    """Which draft evaluate measured in full and export ships, and why: `by` acceptance
    (training.checkpointSelection: of the last epochs, the most accepted; ties to the lower validation loss,
    then the later epoch) or outputTokensPerSecond (draft.candidates: of the candidates' best checkpoints,
    the fastest; ties to the more accepted)."""

    by: str
    epoch: int
    checkpoint: str  # relative to train's output
    val_loss_epoch: int | None = None  # the epoch validation loss would have chosen (checkpoint_best)
    checkpoints: list[CheckpointFigures] = []
    # draft.candidates: the bake-off's verdict, the rivals, the comparison that decided it (the shipped draft
    # over the rival closest to it, or the best trained draft over the rival it did not beat) and, when the
    # trained ones are not distinguishable, the best over the runner-up
    verdict: str | None = None
    rivals: list[RivalFigures] = []
    decided_by: Versus | None = None
    runner_up: Versus | None = None

    def line(self) -> str:
        """One line for a person (evaluate's log, the run's Event, `eagle3 status`): each epoch's acceptance
        next to its validation loss, and the choice."""
        if self.verdict is not None:  # draft.candidates' bake-off
            shown: list[CheckpointFigures | RivalFigures] = [*self.checkpoints, *self.rivals]
            cells = ", ".join(
                f"{c.method}: {_shown(c.output_tokens_per_second, 1)} output tokens/s"
                + (f" ({c.comparison.text()} over none)" if c.comparison is not None else "")
                + _differing(c)
                for c in shown
            )
            return f"bake-off: {cells}; {self.bake_off_text()}"
        if self.by == OUTPUT_TOKENS_PER_SECOND:
            cells = ", ".join(
                f"{c.method}: {_shown(c.output_tokens_per_second, 1)} output tokens/s (acceptance length "
                f"{_shown(c.acceptance_length)})"
                for c in self.checkpoints
            )
            chosen = next((c.method for c in self.checkpoints if c.checkpoint == self.checkpoint), None)
            return f"candidates: {cells}; {chosen} ships"
        cells = ", ".join(
            f"epoch {c.epoch}: {_shown(c.acceptance_length)} (val loss {_shown(c.val_loss)})"
            for c in self.checkpoints
        )
        lowest = f"; the lowest validation loss was epoch {self.val_loss_epoch}'s"
        return f"acceptance length by epoch: {cells}; epoch {self.epoch} ships" + (
            lowest if self.val_loss_epoch not in (None, self.epoch) else ""
        )

    def margin(self) -> str:
        """Which draft won and by how much over the runner-up, for the GatePassed condition."""
        if self.verdict is not None:
            return self.bake_off_text()
        chosen = next((c for c in self.checkpoints if c.checkpoint == self.checkpoint), None)
        others = [c for c in self.checkpoints if c is not chosen]
        if self.by == OUTPUT_TOKENS_PER_SECOND:
            key, unit = "output_tokens_per_second", "output tokens/s"
        else:
            key, unit = "acceptance_length", "acceptance length"
        mine = getattr(chosen, key) if chosen is not None else None
        values = [(getattr(c, key), c) for c in others if getattr(c, key) is not None]
        name = (chosen.method or f"epoch {chosen.epoch}") if chosen is not None else self.checkpoint
        if mine is None or not values:
            return f"{name} ships"
        best, runner = max(values, key=lambda v: v[0])
        other = runner.method or f"epoch {runner.epoch}"
        ratio = f" ({mine / best:.2f}x)" if best > 0 else ""
        return f"{name} ships: {unit} {mine:.3f} against {other}'s {best:.3f}{ratio}"

    def bake_off_text(self) -> str:
        """The bake-off's verdict with the comparison that decided it."""
        chosen = next((c.method for c in self.checkpoints if c.checkpoint == self.checkpoint), None)
        decided, runner = self.decided_by, self.runner_up
        against = (
            f"{decided.method} over {decided.rival}: {decided.comparison.text()}"
            if decided is not None
            else ""
        )
        if self.verdict == RIVAL_NOT_BEATEN:
            return f"no trained draft beats every training-free rival with its interval clear ({against})"
        shipped = f"{chosen} ships, beating every rival ({against})"
        if self.verdict == NOT_DISTINGUISHABLE and runner is not None:
            return (
                f"{shipped}; the trained candidates are not distinguishable ({runner.method} over "
                f"{runner.rival}: {runner.comparison.text()}), so draft.method ships"
            )
        if runner is not None:
            return f"{shipped}, and {runner.rival} ({runner.comparison.text()})"
        return shipped


OUTPUT_TOKENS_PER_SECOND = "outputTokensPerSecond"  # CheckpointChoice.by for draft.candidates


def _shown(value: float | None, digits: int = 3) -> str:
    return f"{value:.{digits}f}" if value is not None else "n/a"


class EvaluateResult(StageResult):
    """evaluate: the gate's input (eagle3_contract.gate); the verdict is not part of it.

    `message` holds what the figures do not say (fewer prompts than asked for, failed requests, a mapping
    problem, embeddings of another verifier), None when there is nothing to add.
    """

    STAGE = Stage.EVALUATE
    SUMMARY = ("acceptance_length", "acceptance_rate", "speedup", "speedup_concurrency")

    prompts: int | None = None
    prompts_requested: int | None = None
    held_out_prompts: int | None = None
    failed_prompts: int | None = None
    num_speculative_tokens: int | None = None
    max_tokens: int | None = None
    drafts: int | None = None
    draft_tokens: int | None = None
    accepted_tokens: int | None = None
    accepted_tokens_by_position: list[int] | None = None
    acceptance_rate: float | None = None
    acceptance_length: float | None = None
    acceptance_by_position: list[float] | None = None
    output_tokens: int | None = None
    output_tokens_per_second: float | None = None
    baseline_output_tokens: int | None = None
    baseline_output_tokens_per_second: float | None = None
    # the headline speedup: output tokens/s with the draft at num_speculative_tokens over the verifier
    # alone's, both at speedup_concurrency requests in flight; evaluation.sweep's cell there when the sweep
    # measured that k (its servers measure with the prompts' prefixes cached), else the main runs' figures
    speedup: float | None = None
    speedup_concurrency: int | None = None
    outputs_matching_baseline: int | None = None
    message: str | None = None
    mapping_consistent: bool | None = None
    embeddings_match_verifier: bool | None = None
    draft_checkpoint: str | None = None
    server_start_seconds: ServerStartSeconds | None = None
    sampled: SampledAcceptance | None = None
    # evaluation.sweep: acceptance and output tokens/s per k and concurrency, and the schedule they justify
    speculation: SpeculationTable | None = None
    # held-out prompts whose answer degenerated (a repetition loop, an empty answer), left out of the figures
    degenerate_prompts: int | None = None
    degenerate: dict[str, int] | None = None  # by reason: repetition, empty
    degenerate_examples: list[str] | None = None  # a few of those prompts' ids
    # training.checkpointSelection acceptance: every measured epoch's figures and the one chosen
    checkpoint_selection: CheckpointChoice | None = None
    # acceptance and speedup per category of the held-out prompts (eagle3_contract.api.categories); None
    # when they have one category only
    categories: list[CategoryFigures] | None = None
    # evaluation.incumbent: the serving draft's figures on the same prompts, and the new one's ratio over them
    incumbent: IncumbentFigures | None = None

    @property
    def tokens_processed(self) -> int | None:
        return self.output_tokens  # tokens generated with the draft

    def speedup_comparison(self) -> Comparison | None:
        """The paired rounds behind the headline speedup: evaluation.sweep's cell at its k and concurrency;
        None where the headline is the main runs' (one run each, unpaired)."""
        table, k = self.speculation, self.num_speculative_tokens
        if table is None or self.speedup is None:
            return None
        at = (k, self.speedup_concurrency)
        cell = next((c for c in table.cells if (c.num_speculative_tokens, c.concurrency) == at), None)
        return cell.comparison if cell is not None and cell.speedup == self.speedup else None


class ExportResult(StageResult):
    """export: `sha256` and `bytes` become the run's status.checkpoint."""

    STAGE = Stage.EXPORT
    SUMMARY = ("bytes",)

    sha256: str | None = None
    bytes: int | None = None
    expected_bytes: int | None = None
    ratio: float | None = None
    trainable_parameters: int | None = None
    draft_head_parameters: int | None = None
    mapping_bytes: int | None = None
    source_bytes: int | None = None
    reduction: float | None = None
    dropped_tensors: list[str] | None = None
    dropped_files: list[str] | None = None
    verifier: str | None = None
    files: list[str] | None = None
    method: str | None = None  # the draft's method (its speculators_model_type): what serving rolls out


class VerifiedFile(ResultModel):
    sha256: str | None = None
    bytes: int | None = None


class VerifyResult(StageResult):
    STAGE = Stage.VERIFY
    SUMMARY = ("bytes",)

    path: str | None = None
    sha256: str | None = None
    bytes: int | None = None
    files: dict[str, VerifiedFile] | None = None
    manifest: bool | None = None
    # the pinned draft's speculation-length table, from its manifest (export's copy of evaluate's): what
    # serving.speculationLength tuned serves for a pinned draft; None when the manifest has none
    speculation: SpeculationTable | None = None
    # the pinned draft's method (its config.json's speculators_model_type): what serving rolls out; None for a
    # config this version does not know
    method: str | None = None


class PredictedAcceptance(ResultModel):
    """An acceptance length predicted at, and where it comes from (eagle3_contract.acceptance_references)."""

    acceptance_length: float | None = None
    source: str | None = None
    published: float | None = None  # the published figure, where it was clamped to k + 1
    clamped: bool | None = None


class PredictResult(StageResult):
    """predict: the speedup an EAGLE-3 draft would give this verifier, on this hardware, at acceptance
    lengths published drafts reach, before any training.

    `tokensPerSecond` and `speedup` are rows per `acceptanceLengths` entry, columns per `concurrencies`;
    `baselineTokensPerSecond` is the verifier alone per concurrency; `breakEven` the acceptance length at
    which the speedup is 1 per concurrency (None: not reachable with k speculative tokens). `method` is
    `synthetic` (vLLM's synthetic rejection sampling at each length) or `step-cost` (the untrained draft's
    measured step cost, scaled by L / its own acceptance `measuredAcceptanceLength`).
    """

    STAGE = Stage.PREDICT
    SUMMARY = ("method", "break_even")

    method: str | None = None
    method_note: str | None = None
    model_class: str | None = None
    num_speculative_tokens: int | None = None
    max_tokens: int | None = None
    concurrencies: list[int] | None = None
    acceptance_lengths: list[PredictedAcceptance] | None = None
    tokens_per_second: list[list[float | None]] | None = None
    speedup: list[list[float | None]] | None = None
    baseline_tokens_per_second: list[float | None] | None = None
    draft_tokens_per_second: list[float | None] | None = None  # step-cost: the untrained draft's
    measured_acceptance_length: list[float | None] | None = None  # step-cost: the untrained draft's L0
    break_even: list[float | None] | None = None
    verdict: str | None = None
    prompts: int | None = None
    prompts_source: str | None = None
    failed_requests: int | None = None
    server_start_seconds: dict[str, float] | None = None
    message: str | None = None


RESULT_MODELS: dict[Stage, type[StageResult]] = {
    m.STAGE: m
    for m in (
        PrepareResult, GenerateResult, ExtractResult, VocabResult, TrainResult, EvaluateResult, ExportResult,
        VerifyResult, PredictResult,
    )
}  # fmt: skip
R = TypeVar("R", bound=StageResult)


def parse_result(stage: Stage | str, payload: str | Mapping[str, Any] | None) -> StageResult | None:
    """`stage`'s result from a termination message or a status document (see StageResult.parse); None for
    no payload or a stage this version does not know. Never raises."""
    try:
        model = RESULT_MODELS[Stage(stage)]
    except ValueError:
        return None
    return model.parse(payload)


def check_result(stage: Stage | str, result: Mapping[str, Any] | StageResult) -> dict[str, Any]:
    """What a stage program returned, checked against its stage's model: the document to commit.

    Unlike `parse_result` it raises (ValidationError) on a value of the wrong type: a program that writes
    what its readers cannot read is a bug to catch in its tests, not a field to drop later.
    """
    model = RESULT_MODELS[Stage(stage)]
    if isinstance(result, StageResult):
        if not isinstance(result, model):
            raise TypeError(f"stage {stage} returned a {type(result).__name__}, not a {model.__name__}")
        return result.document()
    model.model_validate(result)
    return dict(result)


def result_of(results: Mapping[Stage, StageResult], model: type[R]) -> R | None:
    """The result of `model`'s stage in `results`, typed."""
    found = results.get(model.STAGE)
    return found if isinstance(found, model) else None
