"""Eagle3Run spec: THE schema. The CRD, the operator and the stage programs all read these models."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import Field, model_validator

from eagle3_contract.api.base import ApiModel
from eagle3_contract.api.categories import (
    CATEGORY_MAX_LENGTH,
    CATEGORY_NAME,
    MAX_CATEGORIES,
    OTHER_CATEGORY,
)
from eagle3_contract.api.comparison import DEFAULT_ROUNDS, MIN_ROUNDS
from eagle3_contract.api.fields import (
    DNS_LABEL,
    HTTP_URL,
    IMAGE,
    Duration,
    LabelValue,
    PositiveQuantity,
)
from eagle3_contract.api.kubernetes_types import Affinity
from eagle3_contract.api.pods import (
    MAX_METADATA,
    MAX_TOLERATIONS,
    DisruptionBudget,
    Monitoring,
    PodSettings,
    Resources,
    StageOverrides,
    Toleration,
)
from eagle3_contract.api.rules import check_cross_field_rules


class DatasetFormat(StrEnum):
    AUTO = "auto"
    SHAREGPT = "sharegpt"
    MESSAGES = "messages"
    PROMPTS = "prompts"
    CAPTURED = "captured"


class ReasoningMode(StrEnum):
    KEEP = "keep"
    DROP = "drop"


class ExtractionBackend(StrEnum):
    VLLM = "vllm"
    TRANSFORMERS = "transformers"


class ExtractionMode(StrEnum):
    OFFLINE = "offline"
    ONLINE = "online"


class HiddenStatesTransfer(StrEnum):
    VOLUME = "volume"
    MOONCAKE = "mooncake"


class StorageDtype(StrEnum):
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"
    FP8 = "fp8"


class Device(StrEnum):
    GPU = "gpu"
    CPU = "cpu"


class Promotion(StrEnum):
    AUTOMATIC = "automatic"
    REVIEWED = "reviewed"


class SpeculationLength(StrEnum):
    FIXED = "fixed"
    TUNED = "tuned"


class Scheduler(StrEnum):
    LINEAR = "linear"
    COSINE = "cosine"
    CONSTANT = "constant"


class CheckpointSelection(StrEnum):
    """Which epoch's checkpoint evaluate measures and export ships."""

    VAL_LOSS = "valLoss"
    ACCEPTANCE = "acceptance"


class Verifier(ApiModel):
    """The verifier (target) LLM whose hidden states train the draft and which serves with it."""

    model: str = Field(min_length=1, description="Hugging Face model id or a path on the model cache volume.")
    revision: str | None = Field(
        None,
        description=(
            "Model revision (branch, tag or commit); pin a commit for reproducible runs. Stages are keyed by "
            "the spec, not by the model's files (the operator cannot read them): for a path, any label here "
            "marks new files at the same path and re-runs every stage."
        ),
    )
    trust_remote_code: bool = Field(
        False, description="Allow the model's own code (needed by Kimi- and DeepSeek-style verifiers)."
    )
    tensor_parallel_size: int = Field(
        1, ge=1, le=64, description="GPUs the verifier is sharded over in vLLM (generate, extract, serve)."
    )
    max_model_len: int | None = Field(
        None, ge=128, description="vLLM --max-model-len; default: the model's own context length."
    )
    vllm_args: list[str] = Field(
        default_factory=list, max_length=64, description="Extra vLLM engine arguments, appended verbatim."
    )


class DatasetRows(ApiModel):
    """What prepare makes of the dataset: every field here changes its output (the part that is hashed)."""

    source: str = Field(
        min_length=1,
        description="Hugging Face dataset id, or the path of a .jsonl, .ndjson, .json or .parquet file "
        "(optionally .gz or .zst compressed) or of a directory of them: its other files and hidden entries "
        "are named in a warning and not read, and links are followed inside the directory only.",
    )
    revision: str | None = Field(
        None,
        description=(
            "A label for the dataset's contents (a Hub revision is not read from it: pin one in source's "
            "files). Stages are keyed by the spec, not by the files: a new label marks new files at the same "
            "path and re-runs prepare and everything after it."
        ),
    )
    format: DatasetFormat = Field(
        DatasetFormat.AUTO,
        description=(
            "Row layout: 'messages' (OpenAI role/content, tool_calls and tool turns), "
            "'sharegpt' (conversations with from/value, function_call and observation turns), "
            "'prompts' (a 'prompt' string per row, answered by regeneration), 'captured' (the records "
            "serving.capture writes: the request's messages and the verifier's response; source is capture/ "
            "on the artifacts volume, or files copied from it; exact duplicates and degenerate answers are "
            "screened out), or 'auto' to detect it. A row's 'tools' are rendered with it."
        ),
    )
    split: str = Field("train", min_length=1, description="Dataset split to read.")
    max_samples: int | None = Field(None, ge=1, description="Use at most this many rows; default all.")
    max_sequence_length: int = Field(
        2048, ge=16, le=1_048_576, description="Tokens per sample after templating; longer rows are skipped."
    )
    validation_fraction: float = Field(
        0.1, ge=0.0, lt=1.0, description="Fraction of samples held out for validation and evaluation."
    )
    seed: int = Field(0, ge=0, description="Seed for shuffling and the train/validation split.")
    loss_on_reasoning: bool = Field(
        True,
        description=(
            "Train on the reasoning block (<think>...</think>) of assistant turns; false keeps it as context "
            "but masks it out of the loss."
        ),
    )


class Dataset(DatasetRows):
    """The chat dataset the draft learns from."""

    max_skipped_fraction: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description=(
            "prepare fails when more than this share of the rows is skipped (malformed, empty, too long, "
            "...), reporting the counts by reason, rather than training on a sliver of the data; 1 never "
            "fails. "
            "Only accepts or refuses the rows: editing it re-runs nothing."
        ),
    )


class Regeneration(ApiModel):
    """Optional regeneration of assistant turns by the verifier itself, so the draft learns its style."""

    enabled: bool = Field(False, description="Regenerate assistant turns with the verifier in vLLM.")
    max_tokens: int = Field(4096, ge=1, description="Maximum new tokens per regenerated turn.")
    temperature: float = Field(0.6, ge=0.0, le=2.0, description="Sampling temperature for regeneration.")
    reasoning: ReasoningMode = Field(
        ReasoningMode.KEEP, description="Keep or drop the verifier's reasoning in the training targets."
    )
    concurrency: int = Field(64, ge=1, le=4096, description="Concurrent requests against the vLLM server.")
    token_budget: int = Field(
        16384, ge=16, description="vLLM max batched tokens; halved automatically after an out-of-memory."
    )
    max_failed_fraction: float = Field(
        0.02,
        ge=0.0,
        le=1.0,
        description=(
            "Fraction of rows whose regeneration may fail (recorded, then dropped) before the stage fails."
        ),
    )


class Extraction(ApiModel):
    """Hidden-state extraction from the verifier."""

    layers: list[Annotated[int, Field(ge=0)]] | None = Field(
        None,
        min_length=1,
        max_length=16,
        description=(
            "Auxiliary verifier layer ids the draft reads (id i = input of decoder layer i); default "
            "[2, n/2, n-3]. The last layer's output (id n) is always stored too, for the verifier's logits."
        ),
    )
    token_budget: int = Field(
        8192, ge=16, description="Tokens per extraction batch; halved automatically after an out-of-memory."
    )
    gpu_memory_utilization: float = Field(
        0.9, gt=0.0, le=1.0, description="Fraction of GPU memory vLLM may use during extraction."
    )
    backend: ExtractionBackend = Field(
        ExtractionBackend.VLLM, description="vllm (GPUs) or transformers (small verifiers, CPU)."
    )
    dtype: StorageDtype = Field(StorageDtype.BFLOAT16, description="Storage dtype of the hidden states.")
    mode: ExtractionMode = Field(
        ExtractionMode.OFFLINE,
        description=(
            "offline: the extract stage stores every sample's hidden states on the artifacts volume before "
            "training (4 layers x hidden size x 2 bytes per token in bf16). online: a Deployment of vLLM "
            "producers computes them while the train stage asks for each sample, and each is deleted once "
            "consumed; the extract stage does not run. status.plan.estimates gives both sizes."
        ),
    )
    transfer: HiddenStatesTransfer = Field(
        HiddenStatesTransfer.VOLUME,
        description=(
            "online: how hidden states reach the trainer. volume: files on the artifacts volume (needs "
            "ReadWriteMany across nodes); mooncake: a Mooncake store (an operator-run master), no shared "
            "file system."
        ),
    )
    servers: int = Field(
        1,
        ge=1,
        le=256,
        description="online: hidden-state producer replicas, each verifier.tensorParallelSize GPUs.",
    )
    keep: bool = Field(
        False,
        description=(
            "online: keep every generated sample in the train stage's output (later epochs read it "
            "instead of asking again); default false deletes each once consumed."
        ),
    )


class DraftMethod(StrEnum):
    """How the draft proposes its tokens (eagle3_contract.draft_methods has what each one needs)."""

    EAGLE3 = "eagle3"
    PEAGLE = "peagle"
    DFLASH = "dflash"


class CandidateMethod(StrEnum):
    """A method draft.candidates may name: a trained draft method, or a training-free rival."""

    EAGLE3 = "eagle3"
    PEAGLE = "peagle"
    DFLASH = "dflash"
    NGRAM = "ngram"  # vLLM's prompt lookup: proposes the tokens that followed the last n-gram in the context
    SUFFIX = (
        "suffix"  # vLLM's suffix decoding (arctic-inference): proposes from a suffix tree of past outputs
    )


TRAINING_FREE = frozenset({CandidateMethod.NGRAM, CandidateMethod.SUFFIX})


def trained_methods(candidates: list[CandidateMethod] | None) -> list[DraftMethod]:
    """The trained methods among draft.candidates, in their order."""
    return [DraftMethod(c.value) for c in candidates or () if c not in TRAINING_FREE]


def training_free(candidates: list[CandidateMethod] | None) -> list[CandidateMethod]:
    """The training-free rivals among draft.candidates, in their order."""
    return [c for c in candidates or () if c in TRAINING_FREE]


class Draft(ApiModel):
    """The draft model: its method and its shape."""

    method: DraftMethod = Field(
        DraftMethod.EAGLE3,
        description=(
            "eagle3: an EAGLE-3 draft, one draft forward per proposed token. peagle: P-EAGLE, an EAGLE-3 "
            "draft trained to propose all its tokens in one forward (vLLM's eagle3 with parallel drafting; "
            "at most 8 tokens a step). dflash: DFlash, a block diffusion draft that fills a block of "
            "draft.blockSize positions in one forward (vLLM's dflash; at most blockSize - 1 tokens a step). "
            "All three read the same verifier layers (extraction.layers)."
        ),
    )
    vocab_size: int = Field(32000, ge=16, description="Draft vocabulary size (most frequent target tokens).")
    layers: int = Field(1, ge=1, le=8, description="Decoder layers in the draft.")
    candidates: list[CandidateMethod] | None = Field(
        None,
        min_length=2,
        max_length=5,
        description=(
            "Methods to compare (draft.method among them): the train stage trains each trained one "
            "(eagle3, peagle, dflash) from the same data; ngram (vLLM's prompt lookup) and suffix (vLLM's "
            "suffix decoding, arctic-inference) need no training and are rivals. evaluate serves every "
            "candidate and the verifier alone side by side in evaluation.rounds paired rounds; a trained "
            "draft ships only if it is faster than every rival and than no speculation with the interval "
            "clear, and the fastest trained one only if it beats the others so (else: not "
            "distinguishable, draft.method ships). Offline extraction and training.nodes 1 only."
        ),
    )
    block_size: int | None = Field(
        None,
        ge=2,
        le=32,
        description=(
            "draft.method dflash only: the positions of a drafted block (the anchor, the verifier's token, "
            "and blockSize - 1 proposals); default 16, speculators'. The speculation length is at most "
            "blockSize - 1."
        ),
    )


class ExportedDraft(ApiModel):
    """An exported draft on the artifacts volume, by its directory and, where that is not content-addressed,
    its digest."""

    path: str = Field(
        min_length=1,
        description="Directory of an exported draft on the artifacts volume (export/<hash>, or a pinned "
        "checkpoint's path).",
    )
    sha256: str | None = Field(
        None,
        pattern=r"^[0-9a-f]{64}$",
        description="Expected sha256 of its model.safetensors: the stage refuses other files at the path "
        "(ChecksumMismatch). Set it for a path that is not content-addressed: the stage's hash covers the "
        "path, not the files.",
    )


class WarmStart(ExportedDraft):
    """An exported draft whose weights the training starts from, instead of fresh ones."""


class Incumbent(ExportedDraft):
    """An exported draft (the one serving) measured beside the new one on the same held-out prompts."""


class Training(ApiModel):
    """Training of the draft with speculators."""

    epochs: int = Field(10, ge=1, le=1000, description="Training epochs.")
    learning_rate: float = Field(1e-4, gt=0.0, le=1.0, description="Peak learning rate.")
    scheduler: Scheduler = Field(Scheduler.LINEAR, description="Learning-rate schedule after warmup.")
    warmup_ratio: float = Field(0.01, ge=0.0, lt=1.0, description="Fraction of steps spent warming up.")
    ttt_steps: int = Field(3, ge=1, le=16, description="Training-time-test steps (draft positions trained).")
    gpus: int = Field(1, ge=1, le=64, description="GPUs per training node for data-parallel training.")
    nodes: int = Field(
        1,
        ge=1,
        le=64,
        description=(
            "Nodes the train stage spans: an Indexed Job of this many pods (training.gpus each) behind a "
            "headless Service, joined by torchrun's c10d rendezvous."
        ),
    )
    sequence_length: int = Field(
        8192, ge=16, le=1_048_576, description="Tokens per packed training row; at least the sample length."
    )
    checkpoint_selection: CheckpointSelection = Field(
        CheckpointSelection.VAL_LOSS,
        description=(
            "Which epoch's draft ships: valLoss, the lowest validation loss (speculators' checkpoint_best); "
            "acceptance, the one vLLM accepts most of: evaluate serves each of the last "
            "training.checkpointsToEvaluate epochs' drafts on the held-out prompts (one vLLM server each) "
            "and export ships the most accepted. Opt-in: it costs a vLLM server per checkpoint."
        ),
    )
    checkpoints_to_evaluate: int = Field(
        3,
        ge=1,
        le=32,
        description=(
            "With checkpointSelection acceptance: the last epochs whose checkpoints evaluate measures "
            "(at most training.epochs)."
        ),
    )
    warm_start: WarmStart | None = Field(
        None,
        description="Fine-tune this exported draft rather than train a fresh one (fewer epochs do). It "
        "starts warm only when it fits: the same draft method, layers, verifier layers and vocabulary "
        "mapping as this run's vocab stage made; otherwise training starts cold, and train's result says "
        "why (warmStart).",
    )


class Sampling(ApiModel):
    """Sampling settings of requests (vLLM's SamplingParams)."""

    temperature: float = Field(ge=0.0, le=2.0, description="Sampling temperature; 0 is greedy.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling: keep this share of the mass.")
    top_k: int = Field(-1, ge=-1, description="Keep the k most likely tokens; -1 keeps all.")
    seed: int = Field(0, ge=0, description="Seed of the sampled requests, for repeatable figures.")


class Sweep(ApiModel):
    """evaluate's sweep of the speculation length.

    Output tokens/s per k and concurrency, each against the no-draft baseline at that concurrency.
    """

    num_speculative_tokens: list[Annotated[int, Field(ge=1, le=16)]] = Field(
        default_factory=lambda: [1, 2, 3, 4, 5, 6, 7],
        min_length=1,
        max_length=16,
        description="The k values measured (one vLLM server each, evaluation.numSpeculativeTokens's reused).",
    )
    prompts: int | None = Field(
        None,
        ge=1,
        le=100_000,
        description="Held-out prompts per cell; default the larger of 2 x the concurrency and 8.",
    )


class Evaluation(ApiModel):
    """Acceptance measured by vLLM with the verifier and the new draft on held-out prompts."""

    prompts: int = Field(64, ge=1, le=100_000, description="Held-out prompts to generate from.")
    num_speculative_tokens: int = Field(
        3, ge=1, le=16, description="Draft tokens proposed per verifier step."
    )
    max_tokens: int = Field(
        128,
        ge=1,
        le=32_768,
        description=(
            "Most new tokens per held-out prompt, with and without the draft: longer answers measure "
            "acceptance deeper into a reply, and cost more time."
        ),
    )
    min_acceptance_length: float | None = Field(
        None,
        ge=1.0,
        description="Gate: the draft serves only if mean acceptance length reaches this (greedy, at "
        "temperature 0); default no gate.",
    )
    sampling: Sampling | None = Field(
        None,
        description=(
            "The sampling settings of the serving traffic (e.g. temperature 0.7, topP 0.95): evaluate also "
            "measures acceptance at these, after the greedy measurement the gate reads, and the live "
            "acceptance alert compares the traffic with that figure. Default: greedy only."
        ),
    )
    sweep: Sweep | None = Field(
        None,
        description="Measure output tokens/s per speculation length and concurrency against the verifier "
        "alone, and derive the best k per batch-size range (serving.speculationLength tuned serves it). "
        "Default: no sweep.",
    )
    concurrencies: list[Annotated[int, Field(ge=1, le=4096)]] = Field(
        default_factory=lambda: [1, 8, 32],
        min_length=1,
        max_length=16,
        description="The serving concurrencies (requests in flight) the sweep measures and the prediction "
        "predicts at: the batch sizes the tuned schedule is derived at.",
    )
    rounds: int = Field(
        DEFAULT_ROUNDS,
        ge=MIN_ROUNDS,
        le=50,
        description=(
            "Paired rounds behind every decision taken from a speed (the sweep's schedule, which of "
            "draft.candidates ships): each round runs the same prompts on every server compared, in "
            "alternating order, and a decision needs the 95 % interval of the median ratio to clear its "
            "threshold (else: not distinguishable, the safe default stays). At least 6: fewer cannot give "
            "a 95 % interval."
        ),
    )
    predict: bool = Field(
        False,
        description="Predict, before training, the speedup this verifier would get at the acceptance "
        "lengths published drafts reach and at targetAcceptanceLength (status.plan.prediction).",
    )
    target_acceptance_length: float | None = Field(
        None, ge=1.0, le=17.0, description="Your own target acceptance length, predicted too."
    )
    incumbent: Incumbent | None = Field(
        None,
        description="Also measure this exported draft (the one serving now) on the same kept held-out "
        "prompts, greedily, overall and per category, so the result's `incumbent` says whether the new "
        "draft is accepted more: both acceptance lengths and their ratio. One vLLM server more.",
    )
    categories: (
        list[Annotated[str, Field(min_length=1, max_length=CATEGORY_MAX_LENGTH, pattern=CATEGORY_NAME)]]
        | None
    ) = Field(
        None,
        max_length=MAX_CATEGORIES,
        description="The held-out prompts' categories to report acceptance and speedup for (a dataset row's "
        "`category`, or its file's name when dataset.source is a directory of several files); prompts of any "
        f"other category count as `{OTHER_CATEGORY}`. Default: the categories found, at most "
        f"{MAX_CATEGORIES} (the rest as `{OTHER_CATEGORY}`). Each category's prompts are answered once more "
        "with the draft and by the verifier alone; one category: no per-category runs.",
    )


class PinnedCheckpoint(ApiModel):
    """An existing exported draft to serve instead of training one (GitOps promotion)."""

    path: str = Field(min_length=1, description="Directory of the exported draft on the artifacts volume.")
    sha256: str | None = Field(
        None,
        pattern=r"^[0-9a-f]{64}$",
        description=(
            "Expected sha256 of the draft's model.safetensors: the verify stage checks it on the volume "
            "before vLLM rolls to the draft, and a mismatch is refused (ChecksumMismatch)."
        ),
    )


class Canary(ApiModel):
    """Roll a new draft out as a canary next to the serving one, and promote it on live figures."""

    replicas: int = Field(
        1, ge=1, le=1000, description="Canary vLLM replicas: the Service splits traffic by replica count."
    )
    duration: Duration = Field(
        "10m",
        description="Observe the canary at least this long, e.g. '10m'; when the comparison cannot tell the "
        "tracks apart by then, it is observed once more as long before the incumbent is kept.",
    )
    windows: int = Field(
        DEFAULT_ROUNDS,
        ge=MIN_ROUNDS,
        le=60,
        description="Sub-windows the duration is cut into (duration / windows each, 1s at the least; give "
        "each a few Prometheus scrapes): both tracks' figures are paired sub-window by sub-window and "
        "compared as a median ratio with a 95 % interval. At least 6: the fewest whose interval reaches "
        "95 %.",
    )
    min_requests: int = Field(
        100, ge=1, le=100_000_000, description="Requests the canary must finish before a decision."
    )
    tolerance: float = Field(
        0.05,
        ge=0.0,
        lt=1.0,
        description="Promote when the 95 % intervals of the canary's mean acceptance length and output "
        "tokens/s per request over the incumbent's (sub-window by sub-window) both lie above "
        "1 - tolerance; roll back when either lies below; otherwise observe once more, then keep the "
        "incumbent.",
    )
    timeout: Duration = Field(
        "2h",
        description="Roll back when no decision could be taken by then (too little traffic); bounds the "
        "extension too (give it more than twice the duration).",
    )
    prometheus_url: str | None = Field(
        None,
        pattern=HTTP_URL,
        description="Prometheus that scrapes the vLLM pods; default the operator's --prometheus-url.",
    )


class Capture(ApiModel):
    """Record a sample of live chat completions from the serving pods, for the draft's next generation."""

    sample_rate: float = Field(
        0.1,
        gt=0.0,
        le=1.0,
        description="Fraction of chat completions recorded (chosen at random before anything is buffered).",
    )
    max_bytes: PositiveQuantity = Field(
        "10Gi",
        description="Bytes of records kept on the artifacts volume (capture/), all pods together: the "
        "oldest segments are deleted first.",
    )
    retention: Duration = Field(
        "168h", description="Records older than this are deleted, e.g. '168h' (a week)."
    )


class Serving(ApiModel):
    """The vLLM speculative-decoding Deployment rolled out with the draft."""

    enabled: bool = Field(True, description="Roll out a vLLM Deployment and Service with the draft.")
    replicas: int = Field(1, ge=0, le=1000, description="vLLM replicas.")
    num_speculative_tokens: int = Field(3, ge=1, le=16, description="Draft tokens proposed per step.")
    image: str | None = Field(
        None, pattern=IMAGE, description="vLLM image of this Deployment; default images.vllm."
    )
    extra_args: list[str] = Field(
        default_factory=list, max_length=64, description="Extra `vllm serve` arguments, appended verbatim."
    )
    pinned_checkpoint: PinnedCheckpoint | None = Field(
        None,
        description="Serve this exported draft. With promotion 'automatic' every training stage is "
        "skipped; with 'reviewed' the run still trains, and the new draft waits in status.candidate.",
    )
    promotion: Promotion = Field(
        Promotion.AUTOMATIC,
        description=(
            "automatic: a draft that passes the evaluation gate serves at once. reviewed: it waits in "
            "status.candidate while vLLM keeps serving pinnedCheckpoint (nothing, before the first "
            "promotion), until `eagle3 promote RUN` is merged into the manifest in git."
        ),
    )
    resources: Resources | None = Field(
        None,
        description="CPU and memory of each vLLM container (GPUs are set by the operator); default: "
        "requests of 4 CPUs and 16Gi per GPU (4 CPUs and 8Gi with nodePool.device cpu), a memory limit "
        "of twice the request.",
    )
    disruption_budget: DisruptionBudget = Field(
        default_factory=lambda: DisruptionBudget(),
        description="PodDisruptionBudget of the vLLM pods.",
    )
    canary: Canary | None = Field(
        None,
        description="Serve a new draft as a canary first, next to the serving one behind the same "
        "Service, and promote or roll it back on its live acceptance and speed. Default: replace at once.",
    )
    capture: Capture | None = Field(
        None,
        description="Record a sample of live requests (the messages, the verifier's answer, vLLM's "
        "acceptance for the request, when it was served) on the artifacts volume under capture/, bounded "
        "by size and age. User data: whoever can read the artifacts claim can read them. Off by default.",
    )
    speculation_length: SpeculationLength = Field(
        SpeculationLength.FIXED,
        description="fixed: numSpeculativeTokens at every batch size. tuned: the best k per batch-size "
        "range from evaluate's sweep (evaluation.sweep), as vLLM's num_speculative_tokens_per_batch_size; "
        "speculation is off in a range where no k beat the verifier alone.",
    )


class NodePool(ApiModel):
    """Where GPU stages and serving run."""

    node_selector: dict[str, LabelValue] = Field(
        default_factory=dict,
        max_length=MAX_METADATA,
        description="Node labels pods must match (label keys and values).",
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=MAX_TOLERATIONS, description="Tolerations for GPU taints."
    )
    affinity: Affinity = Field(default_factory=dict, description="A core/v1 Affinity of the GPU pods.")
    gpu_resource_name: str = Field("nvidia.com/gpu", min_length=1, description="Extended resource of a GPU.")
    gpus_per_node: int = Field(8, ge=1, le=64, description="GPUs on one node of the pool.")
    device: Device = Field(
        Device.GPU,
        description=(
            "gpu, or cpu for a small verifier on nodes without GPUs (a kind or minikube cluster, CI): no "
            "pod requests GPUs, vLLM runs its CPU backend (images.pipeline, and images.vllm if set, must "
            "then be CPU builds: the pipeline's CPU image holds both), training.gpus is the training "
            "processes of a node."
        ),
    )


class ArtifactsVolume(ApiModel):
    """The volume the stages exchange files on; ReadWriteMany when serving runs on other nodes."""

    claim_name: str | None = Field(
        None, pattern=DNS_LABEL, description="Existing PVC to use; default: create '<run>-artifacts'."
    )
    size: PositiveQuantity = Field("500Gi", description="Size of the PVC the operator creates (more than 0).")
    storage_class_name: str | None = Field(None, description="Storage class of the PVC the operator creates.")
    access_modes: list[str] = Field(
        default_factory=lambda: ["ReadWriteMany"],
        min_length=1,
        description="Access modes of the created PVC.",
    )
    delete_with_run: bool = Field(
        False, description="Delete the operator-created PVC with the run; default keep the artifacts."
    )


class ModelCache(ApiModel):
    """Where verifier weights are cached (HF_HOME)."""

    claim_name: str | None = Field(
        None, pattern=DNS_LABEL, description="PVC holding the Hugging Face cache; default an emptyDir."
    )


class Storage(ApiModel):
    """Volumes of the run."""

    artifacts: ArtifactsVolume = Field(default_factory=ArtifactsVolume, description="Artifacts volume.")
    model_cache: ModelCache = Field(default_factory=ModelCache, description="Model cache volume.")


DEFAULT_PIPELINE_IMAGE = "eagle3-operator/pipeline:0.1.0"
DEFAULT_VLLM_IMAGE = "vllm/vllm-openai:v0.32.0"


class Images(ApiModel):
    """Container images."""

    pipeline: str | None = Field(
        None,
        min_length=1,
        pattern=IMAGE,
        description="Image running `eagle3 stage`; default: the operator's (`eagle3 operator "
        f"--pipeline-image`, the chart's pipelineImage), else {DEFAULT_PIPELINE_IMAGE}.",
    )
    vllm: str | None = Field(
        None,
        min_length=1,
        pattern=IMAGE,
        description="Image running `vllm serve` (serving); default: the operator's (`eagle3 operator "
        f"--vllm-image`, the chart's vllmImage), else {DEFAULT_VLLM_IMAGE}; with nodePool.device cpu, "
        "images.pipeline (the pipeline's CPU image holds vLLM's CPU build).",
    )


class SecretKeyRef(ApiModel):
    """A key of a Secret in the run's namespace."""

    name: str = Field(pattern=DNS_LABEL, description="Secret name.")
    key: str = Field("token", min_length=1, description="Key in the Secret.")


class Eagle3RunSpec(ApiModel):
    """Desired state of an Eagle3Run: a verifier and dataset in, a serving speculative-decoding draft out."""

    verifier: Verifier = Field(description="The verifier LLM.")
    dataset: Dataset = Field(description="The chat dataset.")
    regeneration: Regeneration = Field(default_factory=Regeneration, description="Answer regeneration.")
    extraction: Extraction = Field(default_factory=Extraction, description="Hidden-state extraction.")
    draft: Draft = Field(default_factory=Draft, description="Draft model shape.")
    training: Training = Field(default_factory=Training, description="Draft training.")
    evaluation: Evaluation = Field(default_factory=Evaluation, description="Acceptance evaluation and gate.")
    serving: Serving = Field(default_factory=Serving, description="vLLM rollout with the draft.")
    node_pool: NodePool = Field(default_factory=NodePool, description="GPU node pool placement.")
    storage: Storage = Field(default_factory=Storage, description="Artifacts and model cache volumes.")
    images: Images = Field(default_factory=Images, description="Container images.")
    hf_token_secret: SecretKeyRef | None = Field(
        None, description="Secret key holding a Hugging Face token (HF_TOKEN) for gated models."
    )
    suspend: bool = Field(False, description="Create no new stage Jobs while true.")
    queue_name: str | None = Field(
        None, pattern=DNS_LABEL, max_length=63, description="Kueue LocalQueue for the stage Jobs."
    )
    stages: StageOverrides = Field(default_factory=StageOverrides, description="Per-stage Job overrides.")
    pod: PodSettings = Field(
        default_factory=PodSettings, description="Settings of every pod of the run (stages and serving)."
    )
    monitoring: Monitoring = Field(default_factory=Monitoring, description="Prometheus discovery.")

    @model_validator(mode="after")
    def _cross_field_rules(self) -> Eagle3RunSpec:
        check_cross_field_rules(self)
        return self
