"""`eagle3 run FILE --dry-run`: the stage plan and the run's estimates, without running anything.

Which stages would run, be reused (their output is complete under --artifacts) or be skipped, then the figures
of status.plan.estimates (eagle3_contract.estimates): GPUs and tokens per stage, and the hidden-state bytes
offline extraction would store and online extraction would move. What this machine can read refines them:
complete data-stage outputs give the exact token count; the verifier's config.json (a local directory, the
Hub cache, the Hub), the table of known verifiers (eagle3_contract.verifier_shapes) or --hidden-size give its
shape (where none does, the output says why: a local path that does not exist, a config.json that is not
JSON or lacks the hidden size, a Hub id neither cached nor known);
a local dataset is counted cheaply, by tokenizing up to SAMPLE_ROWS evenly spread rows with the verifier's
chat template and extrapolating to every row (the output says which). Offline extraction's bytes are held
against spec.storage.artifacts.size and the free space under --artifacts, as the operator and `eagle3 run`
check them before extract (eagle3_contract.storage).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3_contract.api.manifest import Manifest, load_manifest
from eagle3_contract.api.spec import Eagle3RunSpec, trained_methods
from eagle3_contract.api.status import Estimates, ModeEstimate
from eagle3_contract.estimates import (
    TokenCount,
    VerifierShape,
    human_bytes,
    known_from_results,
    run_estimates,
    shape_from_config,
    stored_layers,
)
from eagle3_contract.mounts import MODEL_CACHE_MOUNT
from eagle3_contract.results import ExtractResult, GenerateResult, PrepareResult, StageResult, parse_result
from eagle3_contract.stages import Stage, StagePlan, plan_stages
from eagle3_contract.storage import claim_too_small, disk_too_small, offline_bytes, requested_bytes
from eagle3_contract.verifier_shapes import known_shape
from eagle3_pipeline.data.conversations import RowError, load_conversations
from eagle3_pipeline.data.masking import ChatTemplate, tokenize_conversation
from eagle3_pipeline.data.verifier import CONFIG_FILE, ConfigUnreadable, estimated_shape, local_config
from eagle3_pipeline.local.run import check_verifier_config, default_artifacts
from eagle3_pipeline.local.storage_check import free_bytes
from eagle3_pipeline.runtime.context import is_complete, map_mounts, models_root, read_result

logger = logging.getLogger(__name__)
SAMPLE_ROWS = 256  # rows tokenized to estimate a dataset's tokens


GIVE_SHAPE = "give the shape with --hidden-size (and --layers); once prepare has run, its result gives it"


@dataclass(frozen=True)
class ShapeLookup:
    """The verifier's shape as the dry run finds it, or why it finds none (said with what to do)."""

    shape: VerifierShape | None
    unknown: str = ""


@dataclass(frozen=True)
class StageLine:
    plan: StagePlan
    would: str  # run | reuse | skip
    result: StageResult | None = None


def local_path(path: str, artifacts: Path, models: Path | None) -> str:
    """A spec path on this machine: /models under the models root (as `eagle3 run` maps it), /artifacts."""
    if path == MODEL_CACHE_MOUNT or path.startswith(MODEL_CACHE_MOUNT + "/"):
        return str(models_root(str(models) if models else None)) + path[len(MODEL_CACHE_MOUNT) :]
    return map_mounts(path, artifacts)


def stage_lines(spec: Eagle3RunSpec, artifacts: Path) -> list[StageLine]:
    """What `eagle3 run` would do with each stage now, with the results of the outputs it would reuse."""
    lines = []
    for plan in plan_stages(spec):
        output = artifacts / plan.output_dir
        if plan.skipped:
            lines.append(StageLine(plan, "skip"))
        elif plan.reuses_output and is_complete(output):
            lines.append(StageLine(plan, "reuse", parse_result(plan.stage, read_result(output))))
        else:
            lines.append(StageLine(plan, "run"))
    return lines


def count_tokens(spec: Eagle3RunSpec, source: str, model: str) -> TokenCount | None:
    """A local dataset's tokens: a sample of rows tokenized and extrapolated; None if it is not local."""
    if not Path(source).exists():
        return None

    ds = spec.dataset
    conversations, _, _ = load_conversations(source, ds.split, ds.format.value, ds.max_samples)
    rows, length = len(conversations), ds.max_sequence_length
    bound = TokenCount(rows * length, f"upper bound: {rows} rows x maxSequenceLength {length}")
    if not rows:
        return bound
    try:
        lengths = _sample_lengths(spec, conversations, model)
    except Exception as exc:  # no tokenizer here (a Hub id, no chat template): the bound is what is known
        logger.info("cannot tokenize the dataset with %s (%s: %s)", model, type(exc).__name__, exc)
        return bound
    if not lengths:
        return bound
    kept = [n for n in lengths if n <= length]  # prepare skips longer rows
    tokens = round(sum(kept) / len(lengths) * rows)
    how = "prepare's own count may differ by the rows it skips"
    if spec.regeneration.enabled:
        how = (
            "with the dataset's own answers, which regeneration rewrites (each up to regeneration.maxTokens)"
        )
    if len(lengths) == rows:
        return TokenCount(
            tokens, f"counted: all {rows} rows tokenized with the verifier's chat template; {how}"
        )
    return TokenCount(
        tokens,
        f"estimated: {len(lengths)} of {rows} rows tokenized with the verifier's chat template and "
        f"extrapolated; {how}",
    )


def _sample_lengths(spec: Eagle3RunSpec, conversations: list[Any], model: str) -> list[int]:
    from transformers import AutoTokenizer

    v = spec.verifier
    template = ChatTemplate(
        AutoTokenizer.from_pretrained(
            model, revision=v.revision, trust_remote_code=v.trust_remote_code, local_files_only=True
        )
    )
    rows = len(conversations)
    picked = min(rows, SAMPLE_ROWS)  # evenly spread over the file: its start may differ from its end
    lengths = []
    for conv in (conversations[i * rows // picked] for i in range(picked)):
        try:
            tokenized = tokenize_conversation(
                template, conv["messages"], spec.dataset.loss_on_reasoning, conv.get("tools")
            )
        except RowError:
            continue
        lengths.append(len(tokenized.input_ids))
    return lengths


def dry_run_estimates(
    spec: Eagle3RunSpec,
    lines: list[StageLine],
    artifacts: Path,
    models: Path | None,
    given: tuple[int, int | None] | None = None,
) -> tuple[Estimates, str]:
    """The estimates from the reused outputs' results, else the local verifier and dataset, else the spec,
    with why the verifier's shape is unknown ("" where it is known).
    The verifier's shape: `given` (--hidden-size, --layers), else prepare's result, else `verifier_shape`."""
    results = {line.plan.stage: line.result for line in lines if line.result is not None}
    prepare, generate = results.get(Stage.PREPARE), results.get(Stage.GENERATE)
    shape, tokens = known_from_results(
        spec,
        prepare if isinstance(prepare, PrepareResult) else None,
        generate if isinstance(generate, GenerateResult) else None,
    )
    model, unknown = local_path(spec.verifier.model, artifacts, models), ""
    if given is not None:
        shape = VerifierShape(given[0], given[1], "given on the command line (--hidden-size, --layers)")
    elif shape is None:
        lookup = verifier_shape(spec, model)
        shape, unknown = lookup.shape, lookup.unknown
    if tokens is None or tokens.basis.startswith("upper bound"):  # the rows here bound it at least as tightly
        tokens = count_tokens(spec, local_path(spec.dataset.source, artifacts, models), model) or tokens
    extract = results.get(Stage.EXTRACT)
    measured = extract.bytes if isinstance(extract, ExtractResult) else None
    return run_estimates(spec, shape, tokens, measured, [line.plan for line in lines]), unknown


def is_local_path(model: str) -> bool:
    """spec.verifier.model names a path on this machine, not a Hub id."""
    return model.startswith(("/", "./", "../", "~"))


def verifier_shape(spec: Eagle3RunSpec, model: str) -> ShapeLookup:
    """The verifier's shape without running anything (`model`: spec.verifier.model as a path here): a local
    path's config.json; a Hub id's config.json in the Hub cache, else the table of known verifiers, else its
    config from the Hub (a few KB; where there is a network). Where none gives it, why."""
    v = spec.verifier
    if is_local_path(v.model) or Path(model).expanduser().is_dir():
        return local_shape(v.model, model)
    basis = f"from the verifier's config ({model} in the Hub cache)"
    found = estimated_shape(model, v.revision, v.trust_remote_code, basis, offline=True)
    found = found or known_shape(v.model)
    if found is None:
        basis = f"from the verifier's config ({model} on the Hub)"
        found = estimated_shape(model, v.revision, v.trust_remote_code, basis, offline=False)
    if found is not None:
        return ShapeLookup(found)
    return ShapeLookup(
        None,
        f"spec.verifier.model {v.model} is a Hub id whose config.json is neither in the Hub cache here nor "
        "in the table of known verifiers, and the Hub did not give it (offline, HF_HUB_OFFLINE, no access to "
        f"a gated repository, or no such id); fetch it into the Hub cache (`hf download {v.model} "
        f"config.json`), or {GIVE_SHAPE}",
    )


def local_shape(name: str, model: str) -> ShapeLookup:
    """The shape in the config.json of the verifier at `model` (spec.verifier.model `name` on this
    machine), or why there is none: the path does not exist, or its config.json is missing, not JSON, or
    has no hidden size."""
    where = f"spec.verifier.model {name}" + (f" (here {model})" if model != name else "")
    directory = Path(model).expanduser()
    if not directory.exists():
        return ShapeLookup(
            None,
            f"{where} does not exist on this machine (a path, not a Hub id); correct the path (--models maps "
            f"/models), or {GIVE_SHAPE}",
        )
    try:
        config = local_config(directory)
    except ConfigUnreadable as exc:
        return ShapeLookup(
            None,
            f"{where}: {exc}; a checkpoint's config.json is a JSON object with hidden_size and "
            f"num_hidden_layers: fix or restore it, or {GIVE_SHAPE}",
        )
    found = shape_from_config(config, f"from the verifier's config ({model})")
    if found is None:
        return ShapeLookup(
            None,
            f"{where}: {directory / CONFIG_FILE} has no positive hidden_size (nor has its text_config); "
            f"add the checkpoint's own, or {GIVE_SHAPE}",
        )
    return ShapeLookup(found)


def storage_lines(spec: Eagle3RunSpec, estimates: Estimates, artifacts: Path) -> list[str]:
    """Offline extraction's bytes against spec.storage.artifacts.size, as the operator holds them before
    extract (StorageTooSmall), and against the free space under `artifacts`, as `eagle3 run` does."""
    need = offline_bytes(spec, estimates)
    if need is None:
        return []
    lines = []
    if (short := claim_too_small(spec, estimates)) is not None:
        lines.append(
            f"storage: too small for the operator (it fails the run StorageTooSmall before extract): {short}"
        )
    elif (size := requested_bytes(spec)) is not None:
        lines.append(
            f"storage: extract would store {human_bytes(need)}; spec.storage.artifacts.size "
            f"{spec.storage.artifacts.size} ({human_bytes(size)}) holds it"
        )
    if (short := disk_too_small(spec, estimates, free_bytes(artifacts), str(artifacts))) is not None:
        lines.append(f"storage: too small for `eagle3 run` here (it stops before extract): {short}")
    return lines


def _n(value: int | None) -> str:
    return f"{value:,}" if value is not None else "-"


def plan_table(lines: list[StageLine], estimates: Estimates) -> Any:
    from rich.table import Table
    from rich.text import Text

    table = Table(title="eagle3 run --dry-run: stages")
    for column in ("stage", "would", "gpus", "pods", "tokens", "note"):
        table.add_column(column)
    by_stage = {e.stage: e for e in estimates.stages}
    for line in lines:
        e = by_stage[line.plan.stage.value]
        note = line.plan.skipped or line.plan.output_dir
        if e.producer_gpus:
            note = f"+ {e.producer_gpus} GPUs of hidden-state producers; {note}"
        table.add_row(line.plan.stage.value, line.would, str(e.gpus), str(e.pods), _n(e.tokens), Text(note))
    for row in serving_rows(estimates):
        table.add_row(*row[:-1], Text(row[-1]))
    return table


def serving_rows(estimates: Estimates) -> list[tuple[str, ...]]:
    """The table's rows for what serving holds after export: the Deployment, and the canary beside it."""
    serving = estimates.serving
    if serving is None:
        return [("serve", "skip", "0", "0", "-", "serving.enabled is false: nothing is rolled out")]
    rows: list[tuple[str, ...]] = [
        ("serve", "serve", str(serving.gpus), str(serving.replicas), "-",
         "the vLLM Deployment with the draft, from the rollout on (serving.replicas)"),
    ]  # fmt: skip
    if serving.canary_gpus is not None:
        rows.append(
            ("canary", "serve", str(serving.canary_gpus), str(serving.canary_replicas), "-",
             "a new draft's canary, beside the Deployment while it is observed (serving.canary.replicas)")
        )  # fmt: skip
    return rows


def hidden_states_table(spec: Eagle3RunSpec, estimates: Estimates) -> Any:
    from rich.table import Table
    from rich.text import Text

    hs = estimates.hidden_states
    table = Table(title=f"hidden states ({hs.layers} layers x hidden {_n(hs.hidden_size)}, {hs.dtype})")
    for column in ("extraction.mode", "stored", "moved", "note"):
        table.add_column(column)
    modes: dict[str, ModeEstimate] = {"offline": hs.offline, "online": hs.online}
    for mode, m in modes.items():
        name = f"{mode} (this spec)" if mode == hs.mode else mode
        table.add_row(name, m.stored or "-", m.moved or "-", Text(m.note))
    return table


def summary_lines(spec: Eagle3RunSpec, estimates: Estimates, shape_unknown: str) -> list[str]:
    """The figures under the tables; `shape_unknown`: why the verifier's shape is not known."""
    hs = estimates.hidden_states
    if hs.bytes_per_token is None:
        per_token = f"unknown ({stored_layers(spec)} layers x the hidden size x {hs.dtype}): {shape_unknown}"
    else:
        scale = " + fp8 scale" if hs.dtype == "fp8" else ""
        per_token = (
            f"{_n(hs.bytes_per_token)} B ({stored_layers(spec)} layers x {hs.hidden_size} x {hs.dtype} + "
            f"token id{scale}); {hs.basis}"
        )
    return [
        f"tokens: {_n(estimates.tokens)} ({estimates.tokens_basis})",
        f"hidden states per token: {per_token}",
        f"GPUs at once, at most: {_n(estimates.peak_gpus)} (the largest stage with its producers, or serving "
        "with its canary during a rollout)",
        *candidate_lines(spec, estimates),
    ]


def candidate_lines(spec: Eagle3RunSpec, estimates: Estimates) -> list[str]:
    """draft.candidates: what each trained candidate costs, trained in turn by the one train stage from the
    same hidden states (so the bytes above are stored once), and the bake-off evaluate adds."""
    candidates, trained = spec.draft.candidates or [], trained_methods(spec.draft.candidates)
    train = next((s for s in estimates.stages if s.stage == Stage.TRAIN.value), None)
    if not candidates or train is None:
        return []
    served = ", ".join(c.value for c in candidates)
    bake_off = (
        f"evaluate serves {served} beside the verifier alone "
        f"({len(candidates) + 1} vLLM servers at once) in {spec.evaluation.rounds} paired rounds (doubled "
        "when undecided); a trained draft ships only if it beats every rival with its interval clear"
    )
    if len(trained) < 2:
        return [f"draft.candidates {served}: {bake_off}"]
    each = _n(train.tokens // len(trained)) if train.tokens is not None else "unknown"
    return [
        f"draft.candidates {served}: each trained one trains {each} tokens on "
        f"{_n(train.gpus)} GPUs in the train stage (in turn, from the same stored hidden states), and "
        f"{bake_off}"
    ]


def main(
    path: str, artifacts: str | None, models: str | None, shape: tuple[int, int | None] | None = None
) -> int:
    """Print the plan and the estimates of the manifest at `path`; nothing runs, nothing is written.
    `shape`: the verifier's (hidden size, layers) as given on the command line."""
    from rich.console import Console
    from rich.markup import escape

    console, errors = Console(), Console(stderr=True)
    try:
        manifest: Manifest = load_manifest(path)
        check_verifier_config(manifest, Path(models) if models else None)
    except ValueError as exc:
        errors.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False, soft_wrap=True)
        return 2
    spec, root = manifest.spec, Path(artifacts) if artifacts else default_artifacts(manifest)
    models_dir = Path(models) if models else None
    lines = stage_lines(spec, root)
    estimates, shape_unknown = dry_run_estimates(spec, lines, root, models_dir, shape)
    console.print(plan_table(lines, estimates))
    console.print(hidden_states_table(spec, estimates))
    for text in [*summary_lines(spec, estimates, shape_unknown), *storage_lines(spec, estimates, root)]:
        console.print(text, highlight=False, markup=False, soft_wrap=True)
    console.print(f"artifacts: {root.resolve()} (nothing was run or written)", highlight=False, markup=False)
    return 0
