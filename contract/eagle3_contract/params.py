"""What each stage program reads from the spec, in two typed parts: its parameters and its tuning.

`<Stage>Params` is everything that changes what the stage writes. It is the one payload hashed into the
stage's content hash (with its inputs' hashes and the format version), so it names the stage's Job and output
directory, and it is exactly what the program receives as `ctx.params`: a field a program reads that is not
hashed cannot exist, and a spec edit re-runs a stage only when its parameters (or an upstream output) change.

`<Stage>Tuning` is what a program reads that never changes a successful run's output: batch sizes, memory
fractions, parallelism, the backend, checks that only accept or refuse an input. It is NOT hashed: editing
it re-runs nothing, and an output written under other tuning is reused. The token budget a program uses
comes from its command line (`--token-budget`, halved on out-of-memory retries); the tuning's is the spec's
starting value.

Models are frozen and camelCase like the API models (the hash payload is `model_dump(mode="json",
by_alias=True)`); where a whole spec section is hashed, the section's own API model is reused.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer

from eagle3_contract.api.base import ApiModel
from eagle3_contract.api.spec import (
    CandidateMethod,
    CheckpointSelection,
    DatasetRows,
    Device,
    Draft,
    DraftMethod,
    Eagle3RunSpec,
    ExtractionBackend,
    ExtractionMode,
    HiddenStatesTransfer,
    Incumbent,
    PinnedCheckpoint,
    ReasoningMode,
    Sampling,
    StorageDtype,
    Sweep,
    Training,
    trained_methods,
    training_free,
)
from eagle3_contract.vllm_command import VllmEngine


class StageParams(ApiModel):
    """The hashed parameters of a stage (the base of every `<Stage>Params`)."""


class StageTuning(ApiModel):
    """The unhashed settings of a stage (the base of every `<Stage>Tuning`): none changes its output."""


# --- the verifier, as much of it as a stage reads ---------------------------------------------------------


class VerifierName(ApiModel):
    """The verifier as a draft names it (export's manifest, the serving config)."""

    model: str
    revision: str | None = None


class VerifierRef(VerifierName):
    """The verifier as a stage loads it (tokenizer, config, weights)."""

    trust_remote_code: bool = False


class VllmVerifier(VerifierRef):
    """The verifier as vLLM serves it: the engine options that change what it generates are hashed."""

    max_model_len: int | None = None
    vllm_args: tuple[str, ...] = ()

    def engine(self, tensor_parallel_size: int) -> VllmEngine:
        """The engine `vllm serve` loads, with the (unhashed) tensor parallelism."""
        return VllmEngine(
            model=self.model,
            tensor_parallel_size=tensor_parallel_size,
            revision=self.revision,
            trust_remote_code=self.trust_remote_code,
            max_model_len=self.max_model_len,
            vllm_args=self.vllm_args,
        )


def verifier_name(spec: Eagle3RunSpec) -> VerifierName:
    return VerifierName(model=spec.verifier.model, revision=spec.verifier.revision)


def verifier_ref(spec: Eagle3RunSpec) -> VerifierRef:
    v = spec.verifier
    return VerifierRef(model=v.model, revision=v.revision, trust_remote_code=v.trust_remote_code)


def vllm_verifier(spec: Eagle3RunSpec) -> VllmVerifier:
    v = spec.verifier
    return VllmVerifier(
        model=v.model,
        revision=v.revision,
        trust_remote_code=v.trust_remote_code,
        max_model_len=v.max_model_len,
        vllm_args=tuple(v.vllm_args),
    )


# --- prepare ------------------------------------------------------------------------------------------------


class GenerationData(ApiModel):
    """A later generation's dataset (eagle3_contract.generation): the captured records served in (after,
    until], screened and split by dataset.validationFraction, mixed with the first generation's prepared
    conversations (its data stage's output, the input `base`) at `originalRatio` of them per captured row, in
    each split."""

    capture: str = Field(description="The capture directory as the pods see it, or a file of records.")
    after: str | None = Field(None, description="Records served after this instant (RFC 3339), if set.")
    until: str | None = Field(
        None, description="Records served up to this instant (RFC 3339): the trigger's time; unset: all."
    )
    original_ratio: float = Field(ge=0.0, description="Original conversations per captured one, per split.")


class PrepareParams(StageParams):
    """The dataset, tokenized with the verifier's chat template; with `generation`, a later generation's
    mix of captured records and the first generation's conversations."""

    verifier: VerifierRef
    dataset: DatasetRows
    generation: GenerationData | None = None

    @model_serializer(mode="wrap")
    def _unset_revision_unhashed(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """An unset dataset.revision is left out of the hash payload: the hashes of specs written before it
        existed stay the same (every stage after prepare is keyed on prepare's hash)."""
        data: dict[str, Any] = handler(self)
        if self.dataset.revision is None:
            data["dataset"].pop("revision", None)
        if self.generation is None:
            data.pop("generation", None)
        return data


class PrepareTuning(StageTuning):
    """`regenerationEnabled` only lets a prompts-only dataset through (generate answers it); with answers in
    the dataset prepare writes the same output either way, and without regeneration such a dataset fails.
    `maxSkippedFraction` only accepts or refuses the rows read."""

    regeneration_enabled: bool
    max_skipped_fraction: float = 0.5


def prepare_params(spec: Eagle3RunSpec) -> PrepareParams:
    rows = spec.dataset.model_dump(include=set(DatasetRows.model_fields))
    return PrepareParams(verifier=verifier_ref(spec), dataset=DatasetRows.model_validate(rows))


def prepare_tuning(spec: Eagle3RunSpec) -> PrepareTuning:
    return PrepareTuning(
        regeneration_enabled=spec.regeneration.enabled,
        max_skipped_fraction=spec.dataset.max_skipped_fraction,
    )


# --- generate -----------------------------------------------------------------------------------------------


class RegenerationSampling(ApiModel):
    """How the verifier answers, and how many rows may fail (they are dropped from the output)."""

    max_tokens: int
    temperature: float
    reasoning: ReasoningMode
    max_failed_fraction: float


class GenerateParams(StageParams):
    """The verifier's answers, sampled with `seed`, then tokenized like prepare's output."""

    verifier: VllmVerifier
    regeneration: RegenerationSampling
    seed: int
    max_sequence_length: int
    loss_on_reasoning: bool


class GenerateTuning(StageTuning):
    """Requests in flight, vLLM's batch size and GPUs: how fast the answers come, not what they are."""

    tensor_parallel_size: int = Field(ge=1)
    concurrency: int = Field(ge=1)
    token_budget: int = Field(ge=16)


def generate_params(spec: Eagle3RunSpec) -> GenerateParams:
    r, ds = spec.regeneration, spec.dataset
    return GenerateParams(
        verifier=vllm_verifier(spec),
        regeneration=RegenerationSampling(
            max_tokens=r.max_tokens,
            temperature=r.temperature,
            reasoning=r.reasoning,
            max_failed_fraction=r.max_failed_fraction,
        ),
        seed=ds.seed,
        max_sequence_length=ds.max_sequence_length,
        loss_on_reasoning=ds.loss_on_reasoning,
    )


def generate_tuning(spec: Eagle3RunSpec) -> GenerateTuning:
    r = spec.regeneration
    return GenerateTuning(
        tensor_parallel_size=spec.verifier.tensor_parallel_size,
        concurrency=r.concurrency,
        token_budget=r.token_budget,
    )


# --- extract ------------------------------------------------------------------------------------------------


class ExtractParams(StageParams):
    """The hidden states of these verifier layers (None: the default ids), stored in `dtype`."""

    verifier: VerifierRef
    layers: tuple[int, ...] | None
    dtype: StorageDtype


class ExtractTuning(StageTuning):
    """How the states are computed: a prefill of the prepared rows at the verifier's own weights, whichever
    backend, batch, memory fraction, parallelism or engine options run it. `maxModelLen` only refuses a row
    that does not fit; `vllmArgs` and `seed` reach `vllm serve` (extraction samples nothing)."""

    backend: ExtractionBackend
    token_budget: int = Field(ge=16)
    gpu_memory_utilization: float = Field(gt=0.0, le=1.0)
    tensor_parallel_size: int = Field(ge=1)
    max_model_len: int | None
    vllm_args: tuple[str, ...]
    seed: int

    def engine(self, verifier: VerifierRef) -> VllmEngine:
        """The engine extraction's `vllm serve` loads: the hashed verifier, unhashed engine options."""
        hashed = VllmVerifier(
            model=verifier.model, revision=verifier.revision, trust_remote_code=verifier.trust_remote_code
        )
        return hashed.model_copy(
            update={"max_model_len": self.max_model_len, "vllm_args": self.vllm_args}
        ).engine(self.tensor_parallel_size)


def extract_params(spec: Eagle3RunSpec) -> ExtractParams:
    x = spec.extraction
    layers = tuple(x.layers) if x.layers is not None else None
    return ExtractParams(verifier=verifier_ref(spec), layers=layers, dtype=x.dtype)


def extract_tuning(spec: Eagle3RunSpec) -> ExtractTuning:
    x, v = spec.extraction, spec.verifier
    return ExtractTuning(
        backend=x.backend,
        token_budget=x.token_budget,
        gpu_memory_utilization=x.gpu_memory_utilization,
        tensor_parallel_size=v.tensor_parallel_size,
        max_model_len=v.max_model_len,
        vllm_args=tuple(v.vllm_args),
        seed=spec.dataset.seed,
    )


# --- vocab, train -------------------------------------------------------------------------------------------


class VocabParams(StageParams):
    """The `vocabSize` most frequent assistant tokens, mapped onto the verifier's vocabulary."""

    verifier: VerifierRef
    vocab_size: int


class VocabTuning(StageTuning):
    """Nothing: vocab reads no setting that leaves its output alone."""


def vocab_params(spec: Eagle3RunSpec) -> VocabParams:
    return VocabParams(verifier=verifier_ref(spec), vocab_size=spec.draft.vocab_size)


class OnlineHiddenStates(ApiModel):
    """Online extraction: the train stage asks vLLM producers for these verifier layers (None: the default
    ids) of each sample, in `dtype`, instead of reading extract's files."""

    layers: tuple[int, ...] | None
    dtype: StorageDtype


class TrainParams(StageParams):
    """The draft's shape and training, seeded. `training.gpus` and `training.nodes` are hashed: the
    data-parallel world size sets the global batch and the sample order, so the weights trained. `online` is
    set in online mode (offline, the hidden states are an input: extract's hash)."""

    verifier: VerifierRef
    draft: Draft
    training: Training
    seed: int
    online: OnlineHiddenStates | None = None

    @model_serializer(mode="wrap")
    def _defaults_unhashed(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """`training.nodes` 1, an offline run and draft.method eagle3 leave their fields out of the hash
        payload: the hashes of specs written before they existed stay the same. training.checkpointSelection
        and checkpointsToEvaluate are never in it: they choose among the epochs trained (evaluate's)."""
        data: dict[str, Any] = handler(self)
        if self.training.nodes == 1:
            data["training"].pop("nodes", None)
        if self.draft.method == DraftMethod.EAGLE3:
            data["draft"].pop("method", None)
        if self.draft.block_size is None:
            data["draft"].pop("block_size", None)
            data["draft"].pop("blockSize", None)
        if self.draft.candidates is None:
            data["draft"].pop("candidates", None)
        for key in ("checkpoint_selection", "checkpointSelection", "checkpoints_to_evaluate"):
            data["training"].pop(key, None)  # train_params sets their defaults: evaluate's, not train's
        data["training"].pop("checkpointsToEvaluate", None)
        if self.online is None:
            data.pop("online", None)
        if self.training.warm_start is None:
            data["training"].pop("warm_start", None)
            data["training"].pop("warmStart", None)
        return data


class TrainTuning(StageTuning):
    """Online only: how hidden states travel from the producers (`transfer`, over `servers` replicas) and
    whether the trainer keeps a copy of each (`keep`). `device` (nodePool.device): with cpu, training.gpus
    is the CPU training processes of a node (torchrun, gloo: the same world size as on GPUs); a GPU spec on a
    machine without GPUs trains in one process per node. None is hashed: training.gpus and nodes are."""

    mode: ExtractionMode = ExtractionMode.OFFLINE
    transfer: HiddenStatesTransfer = HiddenStatesTransfer.VOLUME
    servers: int = Field(1, ge=1)
    keep: bool = False
    device: Device = Device.GPU


def train_params(spec: Eagle3RunSpec) -> TrainParams:
    x = spec.extraction
    online = None
    if x.mode == ExtractionMode.ONLINE:
        online = OnlineHiddenStates(layers=tuple(x.layers) if x.layers is not None else None, dtype=x.dtype)
    trained = trained_methods(spec.draft.candidates)  # draft.candidates' training-free rivals: evaluate's
    kept = [CandidateMethod(m.value) for m in trained] if len(trained) > 1 else None
    draft = spec.draft.model_copy(update={"candidates": kept})
    return TrainParams(
        verifier=verifier_ref(spec),
        draft=draft,
        # which epoch ships is evaluate's choice among the epochs trained (evaluate_params), not train's
        training=spec.training.model_copy(
            update={
                "checkpoint_selection": Training.model_fields["checkpoint_selection"].default,
                "checkpoints_to_evaluate": Training.model_fields["checkpoints_to_evaluate"].default,
            }
        ),
        seed=spec.dataset.seed,
        online=online,
    )


def train_tuning(spec: Eagle3RunSpec) -> TrainTuning:
    x = spec.extraction
    return TrainTuning(
        mode=x.mode, transfer=x.transfer, servers=x.servers, keep=x.keep, device=spec.node_pool.device
    )


# --- evaluate, export, verify -------------------------------------------------------------------------------


class EvaluateParams(StageParams):
    """What is measured: the verifier as vLLM serves it, the held-out prompts, the draft tokens per step, the
    serving traffic's sampling settings (None: greedy only), which a second measurement uses, and the sweep
    of the speculation length (None: none) with the concurrencies it measures at (None without a sweep:
    evaluation.concurrencies is not read then, so editing it re-runs nothing)."""

    verifier: VllmVerifier
    prompts: int
    num_speculative_tokens: int
    max_tokens: int
    sampling: Sampling | None = None
    sweep: Sweep | None = None
    concurrencies: tuple[int, ...] | None = None
    checkpoints_to_evaluate: int | None = None
    rivals: tuple[CandidateMethod, ...] | None = None  # draft.candidates' training-free ones (None: none)
    rounds: int | None = None  # evaluation.rounds where a speed decides something (sweep, candidates)
    categories: tuple[str, ...] | None = None  # evaluation.categories (None: the categories found)
    incumbent: Incumbent | None = None  # evaluation.incumbent: measured beside the draft (None: not)

    @model_serializer(mode="wrap")
    def _unset_fields_unhashed(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """An unset evaluation.sampling, sweep or categories, and checkpoint selection by validation loss,
        are left out of the hash payload: the hashes of specs written before they existed stay the same."""
        data: dict[str, Any] = handler(self)
        for key, value in (
            ("sampling", self.sampling),
            ("sweep", self.sweep),
            ("concurrencies", self.concurrencies),
            ("checkpoints_to_evaluate", self.checkpoints_to_evaluate),
            ("checkpointsToEvaluate", self.checkpoints_to_evaluate),
            ("rounds", self.rounds),
            ("rivals", self.rivals),
            ("categories", self.categories),
            ("incumbent", self.incumbent),
        ):
            if value is None:
                data.pop(key, None)
        return data


class EvaluateTuning(StageTuning):
    """GPUs and vLLM's server seed (the greedy answers do not depend on it; the sampled ones are seeded per
    request by evaluation.sampling.seed, a param). The gate, `evaluation.minAcceptanceLength`, is neither:
    the stage does not read it (the operator and `eagle3 run` judge its result against the spec's current
    gate), so editing it re-runs nothing."""

    tensor_parallel_size: int = Field(ge=1)
    seed: int


def evaluate_params(spec: Eagle3RunSpec) -> EvaluateParams:
    e = spec.evaluation
    return EvaluateParams(
        verifier=vllm_verifier(spec),
        prompts=e.prompts,
        num_speculative_tokens=e.num_speculative_tokens,
        max_tokens=e.max_tokens,
        sampling=e.sampling,
        sweep=e.sweep,
        concurrencies=tuple(e.concurrencies) if e.sweep is not None else None,
        checkpoints_to_evaluate=checkpoints_to_evaluate(spec),
        rivals=tuple(training_free(spec.draft.candidates)) or None,
        rounds=e.rounds if e.sweep is not None or spec.draft.candidates is not None else None,
        categories=tuple(e.categories) if e.categories is not None else None,
        incumbent=e.incumbent,
    )


def checkpoints_to_evaluate(spec: Eagle3RunSpec) -> int | None:
    """With training.checkpointSelection acceptance, how many of the last epochs evaluate measures (at most
    the epochs trained); None with selection by validation loss (train's checkpoint_best is measured)."""
    t = spec.training
    if t.checkpoint_selection is not CheckpointSelection.ACCEPTANCE:
        return None
    return min(t.checkpoints_to_evaluate, t.epochs)


def evaluate_tuning(spec: Eagle3RunSpec) -> EvaluateTuning:
    return EvaluateTuning(
        tensor_parallel_size=spec.verifier.tensor_parallel_size,
        seed=spec.dataset.seed,
    )


class ExportParams(StageParams):
    """The verifier the exported draft names (its config and manifest)."""

    verifier: VerifierName


class ExportTuning(StageTuning):
    """Nothing: export converts train's best checkpoint."""


def export_params(spec: Eagle3RunSpec) -> ExportParams:
    return ExportParams(verifier=verifier_name(spec))


class VerifyParams(StageParams):
    """The pinned draft and its digest (None: nothing is pinned and verify is skipped)."""

    pinned_checkpoint: PinnedCheckpoint | None


class VerifyTuning(StageTuning):
    """Nothing: verify reads the pinned files every time it runs."""


def verify_params(spec: Eagle3RunSpec) -> VerifyParams:
    return VerifyParams(pinned_checkpoint=spec.serving.pinned_checkpoint)


# --- predict ------------------------------------------------------------------------------------------------


class PredictSettings(ApiModel):
    """What the prediction measures: the verifier as vLLM serves it, an untrained draft of the spec's shape
    at k speculative tokens, the answers' length, the concurrencies, the acceptance lengths predicted at (the
    reference table's version and the user's target), and where the prompts come from (dataset.source)."""

    verifier: VllmVerifier
    draft_layers: int
    draft_vocab_size: int
    num_speculative_tokens: int
    max_tokens: int
    concurrencies: tuple[int, ...]
    target_acceptance_length: float | None
    references_version: int
    dataset: str


class PredictParams(StageParams):
    """evaluation.predict: the settings, hashed; None (the stage is skipped) when the prediction is off, so
    no field of it changes a hash then."""

    prediction: PredictSettings | None = None


class PredictTuning(StageTuning):
    """GPUs and the servers' seed: how fast the figures come, not what they are."""

    tensor_parallel_size: int = Field(ge=1)
    seed: int


def predict_params(spec: Eagle3RunSpec) -> PredictParams:
    from eagle3_contract.acceptance_references import REFERENCES_VERSION

    e = spec.evaluation
    if not e.predict:
        return PredictParams()
    return PredictParams(
        prediction=PredictSettings(
            verifier=vllm_verifier(spec),
            draft_layers=spec.draft.layers,
            draft_vocab_size=spec.draft.vocab_size,
            num_speculative_tokens=e.num_speculative_tokens,
            max_tokens=e.max_tokens,
            concurrencies=tuple(e.concurrencies),
            target_acceptance_length=e.target_acceptance_length,
            references_version=REFERENCES_VERSION,
            dataset=spec.dataset.source,
        )
    )


def predict_tuning(spec: Eagle3RunSpec) -> PredictTuning:
    return PredictTuning(tensor_parallel_size=spec.verifier.tensor_parallel_size, seed=spec.dataset.seed)
