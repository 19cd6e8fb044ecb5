"""`eagle3 plan FILE`: the predict stage run locally, and its prediction as a table people can read.

The manifest is run with evaluation.predict true (its predict stage's output is cached in the artifacts
directory like `eagle3 run`'s, so a second plan of the same spec prints at once). `--acceptance-length L`
adds rows read off the measured ones (linear in L: exact for step-cost, interpolated for synthetic).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from eagle3_contract.api.manifest import Manifest, load_manifest
from eagle3_contract.api.spec import Eagle3RunSpec
from eagle3_contract.results import PredictedAcceptance, PredictResult, check_result, parse_result
from eagle3_contract.stages import Stage, plan_stages
from eagle3_pipeline.local.run import (
    LocalOptions,
    LocalRunError,
    default_artifacts,
    run_stage_with_retries,
    stage_env,
)
from eagle3_pipeline.runtime.context import RESULT_FILE, is_complete, read_result
from eagle3_pipeline.stages.predict.prediction import break_even, interpolate, verdict

logger = logging.getLogger(__name__)
ASKED = "--acceptance-length"


def with_lengths(result: PredictResult, lengths: Sequence[float]) -> PredictResult:
    """`result` with a row per extra acceptance length, read off its rows, and the break-evens redone."""
    if not lengths or not result.acceptance_lengths or not result.speedup:
        return result
    base = result.baseline_tokens_per_second or []
    known = [a.acceptance_length for a in result.acceptance_lengths]
    rows = list(zip(known, result.speedup, strict=True))
    table: list[tuple[PredictedAcceptance, list[float | None]]] = list(
        zip(result.acceptance_lengths, result.speedup, strict=True)
    )
    for length in lengths:
        row = []
        for i in range(len(base)):
            points = [(k, r[i]) for k, r in rows if k is not None and r[i] is not None]
            row.append(interpolate(points, length))  # type: ignore[arg-type]
        table.append((PredictedAcceptance(acceptance_length=length, source=ASKED), row))
    table.sort(key=lambda item: item[0].acceptance_length or 0.0)
    k = result.num_speculative_tokens or 0
    values = [a.acceptance_length or 0.0 for a, _ in table]
    speedups = [r for _, r in table]
    evens = [break_even(values, [r[i] for r in speedups], k) for i in range(len(base))]
    tokens = [
        [s * b if s is not None and b else None for s, b in zip(r, base, strict=True)] for r in speedups
    ]
    return result.model_copy(
        update={
            "acceptance_lengths": [a for a, _ in table],
            "speedup": speedups,
            "tokens_per_second": tokens,
            "break_even": evens,
            "verdict": verdict(result.concurrencies or [], evens, result.num_speculative_tokens or 0),
        }
    )


def _cell(speedup: float | None, tokens: float | None) -> str:
    if speedup is None:
        return "-"
    return f"{speedup:.2f}x ({tokens:.0f} tok/s)" if tokens is not None else f"{speedup:.2f}x"


def plan_table(result: PredictResult) -> Any:
    """A rich Table: a row per acceptance length with its source beside it (for a published figure: the
    benchmark, k, the temperature, the URL that publishes it (naming the draft's model id) and the date), a
    column per concurrency."""
    from rich.table import Table

    concurrencies = result.concurrencies or []
    where = f", verifier class {result.model_class}" if result.model_class else ""
    table = Table(title=f"predicted speedup ({result.method}, k={result.num_speculative_tokens}{where})")
    table.add_column("acceptance length")
    table.add_column("source", overflow="fold", min_width=24)
    for c in concurrencies:
        table.add_column(f"concurrency {c}", justify="right")
    tokens = result.tokens_per_second or []
    for i, length in enumerate(result.acceptance_lengths or []):
        speed = (result.speedup or [])[i]
        tps = tokens[i] if i < len(tokens) else [None] * len(speed)
        cells = [_cell(s, t) for s, t in zip(speed, tps, strict=True)]
        table.add_row(f"{length.acceptance_length:.2f}", length.source or "", *cells)
    base = result.baseline_tokens_per_second or []
    table.add_row("verifier alone", "measured", *[f"{b:.0f} tok/s" if b else "-" for b in base])
    evens = result.break_even or []
    table.add_row("break-even", "speedup 1", *[f"{b:.2f}" if b is not None else "never" for b in evens])
    return table


def plan_lines(result: PredictResult) -> list[str]:
    """The lines under the table: the verdict, the method and the prompts."""
    k = result.num_speculative_tokens or 0
    lines = [result.verdict or verdict(result.concurrencies or [], result.break_even or [], k)]
    if result.method_note:
        lines.append(f"method {result.method_note}")
    if result.measured_acceptance_length:
        measured = ", ".join(f"{x:.2f}" if x else "-" for x in result.measured_acceptance_length)
        lines.append(f"the untrained draft's own acceptance length per concurrency: {measured}")
    lines.append(
        f"prompts: {result.prompts} ({result.prompts_source}), at most {result.max_tokens} tokens each"
    )
    return lines


def predict_manifest(manifest: Manifest, artifacts: Path) -> Path:
    """A copy of the manifest's Eagle3Run (as load_manifest read it: the other documents of its file left
    out) with evaluation.predict true, in the artifacts directory."""
    doc = copy.deepcopy(manifest.document)
    doc.setdefault("spec", {}).setdefault("evaluation", {})["predict"] = True
    out = artifacts / ".runs" / f"{manifest.path.stem}-plan.yaml"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


def run_plan(path: str, artifacts: str | None, models: str | None, vllm: str | None) -> PredictResult:
    """The predict stage of `path` (with evaluation.predict true), run or read from the cache."""
    manifest = load_manifest(path)
    root = Path(artifacts) if artifacts else default_artifacts(manifest)
    spec_file = predict_manifest(manifest, root)
    predicting = load_manifest(spec_file)
    plan = next(p for p in plan_stages(predicting.spec) if p.stage is Stage.PREDICT)
    options = LocalOptions(artifacts=root, models=Path(models) if models else None, vllm=vllm)
    output = root / plan.output_dir
    if not is_complete(output):
        outcome = run_stage_with_retries(plan, spec_file, options, predicting.spec, stage_env(options))
        if outcome.status != "done":
            raise LocalRunError(f"stage predict failed: {outcome.note}")
    return cached_prediction(output)


def cached_prediction(output: Path) -> PredictResult:
    """The predict result at `output`, checked: a document of the wrong shape (a field of the wrong type, or
    no table) is a LocalRunError naming the file, never an empty table and exit code 0."""
    from pydantic import ValidationError

    path = output / RESULT_FILE
    fix = f"delete {output} and run `eagle3 plan` again to predict anew"
    try:
        parsed = parse_result(Stage.PREDICT, check_result(Stage.PREDICT, read_result(output)))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise LocalRunError(f"{path}: not a predict result ({where}: {first['msg']}); {fix}") from None
    if not isinstance(parsed, PredictResult) or not (parsed.concurrencies and parsed.acceptance_lengths):
        raise LocalRunError(f"{path}: a predict result with no table (no concurrencies or lengths); {fix}")
    if parsed.speedup is None or len(parsed.speedup) != len(parsed.acceptance_lengths):
        raise LocalRunError(f"{path}: a predict result whose speedup table does not match its lengths; {fix}")
    return parsed


def plan_refusal(spec: Eagle3RunSpec) -> str | None:
    """Why `eagle3 plan` cannot predict this spec's draft (None: it can), in the user's own fields: the plan
    runs the predict stage, which knows EAGLE-3's published acceptance and step costs only."""
    if spec.draft.method != "eagle3":
        return (
            f"draft.method is {spec.draft.method}: `eagle3 plan` predicts an EAGLE-3 draft's speedup from "
            "EAGLE-3's published acceptance and step costs, and has no such figures for it; plan with "
            "draft.method eagle3, or run the pipeline and read evaluate's measured speedup"
        )
    if spec.draft.candidates is not None:
        return (
            "draft.candidates is set: `eagle3 plan` predicts one EAGLE-3 draft; plan without candidates, "
            "or run the pipeline, whose evaluate measures each trained candidate"
        )
    return None


def main(
    path: str, artifacts: str | None, models: str | None, vllm: str | None, lengths: Sequence[float]
) -> int:
    from rich.console import Console
    from rich.markup import escape

    console = Console()
    try:
        spec = load_manifest(path).spec
        if unpredictable := plan_refusal(spec):  # before evaluation.predict is set on the user's behalf
            Console(stderr=True).print(
                f"[red]error:[/red] {escape(unpredictable)}", highlight=False, soft_wrap=True
            )
            return 2
        k = spec.evaluation.num_speculative_tokens
        beyond = [length for length in lengths if length > k + 1]
        if beyond:  # a usage error, found before any server starts
            Console(stderr=True).print(
                f"[red]error:[/red] --acceptance-length {beyond[0]:g}: at most k + 1 = {k + 1} "
                f"(evaluation.numSpeculativeTokens is {k}: a step accepts at most k draft tokens and adds "
                "one of its own)",
                highlight=False,
                soft_wrap=True,
            )
            return 2
        result = with_lengths(run_plan(path, artifacts, models, vllm), lengths)
    except (ValueError, LocalRunError) as exc:
        Console(stderr=True).print(f"[red]error:[/red] {escape(str(exc))}", highlight=False, soft_wrap=True)
        return 1
    console.print(plan_table(result))
    for line in plan_lines(result):
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    return 0
