"""`eagle3 promote RUN`: the git change that serves a run's evaluated draft, for a reviewed commit.

The operator never writes a run's spec, so a GitOps tool (Argo CD, Flux) sees no drift; promotion is a change
to the manifest in git. From a run as `kubectl get e3r RUN -o yaml` prints it, `build_promotion` makes either
the run's manifest with `spec.serving.pinnedCheckpoint: {path, sha256}` (its spec otherwise unchanged, without
status or server-set metadata) or a values snippet holding only the pin; `commit_message` says what the commit
promotes, with the acceptance the draft was evaluated at. Pure: the command line reads the run and writes.

A run is promoted only when its status names a checkpoint that its current spec exported (status and spec of
the same generation, stage export succeeded into that directory) with a sha256, and its evaluation gate, if
it has one, passed: with `serving.promotion: reviewed`, `status.candidate` (the new draft that waits while the
pin serves), else `status.checkpoint`. The operator checks the sha256 on the volume before vLLM rolls to the
pinned draft.
"""

from __future__ import annotations

import copy
import json
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import yaml
from pydantic import ValidationError

from eagle3_contract.api.base import API_VERSION, KIND
from eagle3_contract.api.spec import Eagle3RunSpec, PinnedCheckpoint, Promotion
from eagle3_contract.api.status import (
    Checkpoint,
    Condition,
    ConditionType,
    Eagle3RunStatus,
    StagePhase,
    StageStatus,
)
from eagle3_contract.api.validation import InvalidSpecError, parse_spec
from eagle3_contract.results import EvaluateResult, ExportResult
from eagle3_contract.stages import Stage

Format = Literal["manifest", "values"]
FORMATS: tuple[Format, ...] = ("manifest", "values")
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
# Metadata that tools write onto the live object; none of it belongs in git.
TOOL_PREFIXES = (
    "kubectl.kubernetes.io/",
    "argocd.argoproj.io/",
    "kustomize.toolkit.fluxcd.io/",
    "meta.helm.sh/",
    "kopf.zalando.org/",
)


class PromotionError(ValueError):
    """A run that cannot be promoted: the message says why and what to do."""


@dataclass(frozen=True)
class Candidate:
    """What a promotion pins, and what the commit message tells about it."""

    namespace: str | None
    name: str
    generation: int | None
    checkpoint: Checkpoint
    gate: float | None
    speculative_tokens: int
    replaces: PinnedCheckpoint | None = None  # reviewed: the pin that serves until the promotion is merged


def _label(run: Mapping[str, Any]) -> str:
    meta = run.get("metadata") or {}
    return "/".join(str(p) for p in (meta.get("namespace"), meta.get("name")) if p)


def _condition(status: Eagle3RunStatus, kind: ConditionType) -> Condition | None:
    return next((c for c in status.conditions if c.type == kind), None)


def _check_current(run: Mapping[str, Any], status: Eagle3RunStatus, who: str) -> None:
    """Status describes the spec as it is: the checkpoint was exported for this spec, not an earlier one."""
    generation = (run.get("metadata") or {}).get("generation")
    observed = status.observed_generation
    if generation is not None and observed != generation:
        raise PromotionError(
            f"Eagle3Run {who}: its status is of spec generation {observed}, its spec is at generation "
            f"{generation}: the operator has not caught up with the last edit, or the run is training again; "
            "wait until status.observedGeneration equals metadata.generation and the run is exported"
        )


def _check_gate(spec_gate: float | None, status: Eagle3RunStatus, who: str) -> None:
    gate = _condition(status, ConditionType.GATE_PASSED)
    if gate is not None and gate.status == "False":
        raise PromotionError(
            f"Eagle3Run {who} did not pass its evaluation gate ({gate.reason}: {gate.message}); its draft "
            "must not serve: improve the run (data, epochs, learning rate) and promote a run that passes"
        )
    if spec_gate is not None and (gate is None or gate.status != "True"):
        raise PromotionError(
            f"Eagle3Run {who} has an evaluation gate (evaluation.minAcceptanceLength {spec_gate}) that has "
            "not passed yet (no GatePassed=True condition); wait for stage evaluate, then promote"
        )


def _phase(stage: StageStatus | None) -> str:
    return stage.phase.value if stage is not None else "not started"


def _no_candidate(spec: Eagle3RunSpec, export: StageStatus | None, who: str) -> PromotionError:
    """Why a reviewed run has no status.candidate: already promoted, or not exported yet."""
    pin = spec.serving.pinned_checkpoint
    if export is not None and export.phase == StagePhase.SUCCEEDED and pin is not None:
        sha256 = (ExportResult.parse(export.result) or ExportResult()).sha256
        if pin.path == export.output_dir or (sha256 and pin.sha256 == sha256):
            return PromotionError(
                f"Eagle3Run {who} has no candidate to promote: its pin {pin.path} is the draft its current "
                "spec exported (already promoted); edit the training in git to train a new candidate"
            )
    return PromotionError(
        f"Eagle3Run {who} has no candidate to promote (status.candidate is empty; stage export: "
        f"{_phase(export)}); wait until the run exports a draft past its gate, then promote"
    )


def _exported(status: Eagle3RunStatus, spec: Eagle3RunSpec, who: str) -> Checkpoint:
    """The checkpoint to pin: status.candidate of a reviewed run, else status.checkpoint."""
    reviewed = spec.serving.promotion is Promotion.REVIEWED
    field, checkpoint = ("candidate", status.candidate) if reviewed else ("checkpoint", status.checkpoint)
    export = status.stages.get(Stage.EXPORT.value)
    if reviewed and (checkpoint is None or not checkpoint.path):
        raise _no_candidate(spec, export, who)
    if checkpoint is None or not checkpoint.path:
        raise PromotionError(
            f"Eagle3Run {who} has no exported checkpoint (status.checkpoint is empty; stage export: "
            f"{_phase(export)}); wait until the run reaches stage export and it succeeds, then promote"
        )
    if export is None or export.phase != StagePhase.SUCCEEDED or export.output_dir != checkpoint.path:
        output = export.output_dir if export is not None else None
        raise PromotionError(
            f"Eagle3Run {who}: status.{field} {checkpoint.path} is not the export of its current spec "
            f"(stage export: {_phase(export)}, output {output}); wait until the run exports its current "
            "spec, then promote"
        )
    if not checkpoint.sha256:
        raise PromotionError(
            f"Eagle3Run {who}: status.{field} {checkpoint.path} has no sha256 (export reported none), so "
            "the operator could not verify it; re-run stage export with this version of the pipeline"
        )
    return checkpoint


def _figures(checkpoint: Checkpoint, status: Eagle3RunStatus) -> Checkpoint:
    """The acceptance figures of the checkpoint, else of evaluate's result (a status of an older operator)."""
    if checkpoint.acceptance_length is not None:
        return checkpoint
    evaluate = status.stages.get(Stage.EVALUATE.value)
    evaluated = EvaluateResult.parse(evaluate.result if evaluate is not None else None) or EvaluateResult()
    figures = {"acceptance_length": evaluated.acceptance_length, "acceptance_rate": evaluated.acceptance_rate}
    return checkpoint.model_copy(update={k: v for k, v in figures.items() if v is not None})


def _status(run: Mapping[str, Any], who: str) -> Eagle3RunStatus:
    """The run's status as the operator wrote it; PromotionError when there is none or it cannot be read."""
    document = run.get("status")
    if not isinstance(document, Mapping) or not document:
        raise PromotionError(f"Eagle3Run {who} has no status yet: the operator has not reconciled it")
    try:
        return Eagle3RunStatus.model_validate(document)
    except ValidationError as err:
        raise PromotionError(
            f"Eagle3Run {who}: its status cannot be read by this eagle3 ({err.error_count()} problem(s), "
            f"first: {err.errors()[0]['loc']}: {err.errors()[0]['msg']}); use the eagle3 of the operator's "
            "version"
        ) from None


def promotion_candidate(run: Mapping[str, Any]) -> Candidate:
    """The checkpoint `run` may promote, or PromotionError saying why not."""
    who = _label(run) or "(unnamed)"
    if run.get("kind", KIND) != KIND:
        raise PromotionError(f"{who}: a {run.get('kind')}, not an {KIND}; pass `kubectl get e3r RUN -o yaml`")
    try:
        spec = parse_spec(run.get("spec"))
    except InvalidSpecError as exc:
        raise PromotionError(f"Eagle3Run {who}: {exc}") from None
    reviewed = spec.serving.promotion is Promotion.REVIEWED
    if spec.serving.pinned_checkpoint is not None and not reviewed:
        raise PromotionError(
            f"Eagle3Run {who} already serves a pinned draft ({spec.serving.pinned_checkpoint.path}) and "
            "exported none of its own; promote the run that trained it, or copy this run's manifest"
        )
    status = _status(run, who)
    _check_current(run, status, who)
    _check_gate(spec.evaluation.min_acceptance_length, status, who)
    checkpoint = _figures(_exported(status, spec, who), status)
    meta = run.get("metadata") or {}
    return Candidate(
        namespace=meta.get("namespace"),
        name=str(meta.get("name") or ""),
        generation=meta.get("generation"),
        checkpoint=checkpoint,
        gate=spec.evaluation.min_acceptance_length,
        speculative_tokens=spec.evaluation.num_speculative_tokens,
        replaces=spec.serving.pinned_checkpoint,
    )


def pin(checkpoint: Checkpoint) -> dict[str, Any]:
    return {"path": checkpoint.path, "sha256": checkpoint.sha256}


def _tool_free(items: Mapping[str, Any] | None) -> dict[str, Any]:
    return {k: v for k, v in (items or {}).items() if not k.startswith(TOOL_PREFIXES)}


def source_spec(run: Mapping[str, Any]) -> dict[str, Any]:
    """The run's spec as written: the last `kubectl apply`'s (Argo CD applies that way) when it is the live
    spec, else the live spec without the values the API server defaulted (they mean the same)."""
    live = parse_spec(run.get("spec"))
    applied_text = ((run.get("metadata") or {}).get("annotations") or {}).get(LAST_APPLIED)
    try:
        applied = json.loads(applied_text)["spec"] if applied_text else None
        if isinstance(applied, dict) and parse_spec(applied) == live:
            return copy.deepcopy(applied)
    except (ValueError, KeyError, TypeError):
        pass  # not a readable last-applied spec: use the live one
    out: dict[str, Any] = live.model_dump(mode="json", by_alias=True, exclude_defaults=True)
    return out


def pinned_manifest(run: Mapping[str, Any], checkpoint: Checkpoint) -> dict[str, Any]:
    """The run's manifest serving `checkpoint`: its spec with the pin, name, namespace, labels and
    annotations (without what tools set), and neither status nor server-set metadata."""
    spec = source_spec(run)
    serving = spec.setdefault("serving", {})
    serving["pinnedCheckpoint"] = pin(checkpoint)
    if serving.get("enabled") is False:
        del serving["enabled"]  # a pinned run only serves (a CEL rule); enabled is the default
    meta = run.get("metadata") or {}
    metadata: dict[str, Any] = {"name": meta.get("name")}
    if meta.get("namespace"):
        metadata["namespace"] = meta["namespace"]
    for key in ("labels", "annotations"):
        kept = _tool_free(meta.get(key))
        if kept:
            metadata[key] = kept
    manifest = {"apiVersion": run.get("apiVersion", API_VERSION), "kind": KIND, "metadata": metadata}
    parse_spec(spec)  # the pin keeps the spec valid: a bug here must not reach git
    return manifest | {"spec": spec}


def pinned_values(checkpoint: Checkpoint, values_key: str = "spec") -> dict[str, Any]:
    """Values holding only the pin, nested under the dotted `values_key` (where a chart keeps the run's spec;
    empty: at the top)."""
    values: dict[str, Any] = {"serving": {"pinnedCheckpoint": pin(checkpoint)}}
    for part in reversed([p for p in values_key.split(".") if p]):
        values = {part: values}
    return values


def build_promotion(
    run: Mapping[str, Any], fmt: Format = "manifest", values_key: str = "spec"
) -> dict[str, Any]:
    """The document to commit: the pinned-draft manifest, or the values snippet; PromotionError if `run` may
    not be promoted."""
    candidate = promotion_candidate(run)
    if fmt == "values":
        return pinned_values(candidate.checkpoint, values_key)
    return pinned_manifest(run, candidate.checkpoint)


def _size(n: int | None) -> str:
    if n is None:
        return "unknown"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit} ({n} bytes)"
    return f"{n} bytes"


def acceptance(candidate: Candidate) -> str:
    c = candidate.checkpoint
    if c.acceptance_length is None:
        return "acceptance not reported"
    rate = f", acceptance rate {c.acceptance_rate:.3f}" if c.acceptance_rate is not None else ""
    return f"mean acceptance length {c.acceptance_length:.3f}{rate}"


def commit_message(candidate: Candidate) -> str:
    """A commit message: what is pinned, from which run, and how well the draft was evaluated."""
    c = candidate.checkpoint
    who = "/".join(p for p in (candidate.namespace, candidate.name) if p)
    subject = f"eagle3: serve the draft of {who} ({acceptance(candidate).split(',')[0]})"
    gate = (
        f"over its gate evaluation.minAcceptanceLength {candidate.gate}"
        if candidate.gate is not None
        else "with no gate set (evaluation.minAcceptanceLength)"
    )
    at = f" at generation {candidate.generation}" if candidate.generation is not None else ""
    lines = [
        subject,
        "",
        *textwrap.wrap(f"Pin spec.serving.pinnedCheckpoint to the draft Eagle3Run {who} exported{at}.", 72),
        *_replaces(candidate.replaces),
        "",
        f"  path:   {c.path}",
        f"  sha256: {c.sha256}",
        f"  size:   {_size(c.bytes)}",
        "",
        *textwrap.wrap(
            f"Evaluated with {candidate.speculative_tokens} speculative tokens: {acceptance(candidate)}, "
            f"{gate}. The operator verifies the sha256 on the artifacts volume before vLLM rolls to it.",
            72,
        ),
    ]
    return "\n".join(lines) + "\n"


def _replaces(pin: PinnedCheckpoint | None) -> list[str]:
    if pin is None:
        return []
    return textwrap.wrap(f"It replaces the pinned draft {pin.path} (sha256 {pin.sha256 or 'not set'}).", 72)


def render(document: Mapping[str, Any], candidate: Candidate) -> str:
    """YAML for git, with a comment naming where the pin came from."""
    who = "/".join(p for p in (candidate.namespace, candidate.name) if p)
    header = f"# Promoted with `eagle3 promote` from Eagle3Run {who}: {acceptance(candidate)}.\n"
    return header + yaml.safe_dump(dict(document), sort_keys=False, default_flow_style=False)


def promotion_text(
    run: Mapping[str, Any], fmt: Format = "manifest", values_key: str = "spec"
) -> tuple[str, Candidate]:
    """What `eagle3 promote` prints for `run` (the document to commit, as YAML) and what it promotes."""
    document = build_promotion(run, fmt, values_key)
    candidate = promotion_candidate(run)
    return render(document, candidate), candidate


def select_run(documents: list[Any], name: str) -> Mapping[str, Any]:
    """The run called `name` among documents read from a file (one run, several, or a `kind: List`)."""
    items: list[Any] = []
    for doc in documents:
        listed = isinstance(doc, Mapping) and doc.get("kind") == "List"
        items.extend((doc.get("items") or []) if listed else [doc])
    runs = [d for d in items if isinstance(d, Mapping) and d.get("kind") == KIND]
    named = [r for r in runs if (r.get("metadata") or {}).get("name") == name]
    if not named:
        found = sorted(str((r.get("metadata") or {}).get("name")) for r in runs)
        raise PromotionError(
            f"no Eagle3Run named {name!r} in the file (it holds {found or 'no Eagle3Run'}); pass the output "
            f"of `kubectl get e3r {name} -o yaml`"
        )
    return named[0]
