"""`eagle3 run FILE --retrain RECORDS`: a later generation of the run's draft, on this machine.

After the run's own stages (reused when done), the records captured from its serving (serving.capture's
files, copied out of `capture/` on the claim, or any file of such records) train the draft's next
generation as the operator's would (eagle3_contract.generation): the records screened and split, mixed with
the run's prepared data at `--original-ratio`, warm-started from the run's exported draft for `--epochs`,
and evaluated beside it on the same held-out prompts. The generation's manifest is written beside the run's
snapshot (`.runs/<run>-generation-2.yaml`), so its stages run, resume and show in `eagle3 status` like the
run's. The last line says whether the new draft is accepted more than the one it would replace.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from eagle3_contract.api.manifest import Manifest, load_manifest
from eagle3_contract.api.spec import ExportedDraft
from eagle3_contract.generation import (
    DEFAULT_EPOCHS,
    DEFAULT_ORIGINAL_RATIO,
    Generation,
    generation_manifest,
    plan_generation,
)
from eagle3_contract.results import EvaluateResult
from eagle3_contract.stages import Stage, plan_stages
from eagle3_pipeline.local.display import Observers, RunObserver, StageOutcome
from eagle3_pipeline.local.status import StatusRecorder, generation_record, snapshot_name, status_file
from eagle3_pipeline.runtime.context import is_complete

logger = logging.getLogger(__name__)

NUMBER = 2  # locally, a generation is always the run's second: from the run's own exported draft


@dataclass(frozen=True)
class Retrain:
    records: Path
    original_ratio: float = DEFAULT_ORIGINAL_RATIO
    epochs: int = DEFAULT_EPOCHS


class RetrainError(ValueError):
    """What stops the generation before its stages (the message says what to do)."""


def plan(manifest: Manifest, artifacts: Path, retrain: Retrain) -> tuple[Generation, Path]:
    """The generation from the run's exported draft, and its manifest written beside the run's snapshot."""
    export = next(p for p in plan_stages(manifest.spec) if p.stage is Stage.EXPORT)
    if export.skipped is not None or not is_complete(artifacts / export.output_dir):
        raise RetrainError(
            f"--retrain trains the next generation from the run's exported draft, and {export.output_dir} is "
            f"not there ({export.skipped or 'the run did not export'}): let the run finish first"
        )
    if not retrain.records.exists():
        raise RetrainError(f"--retrain {retrain.records}: no such file or directory of captured records")
    generation = Generation(
        number=NUMBER,
        capture=str(retrain.records.resolve()),
        serving=ExportedDraft(path=export.output_dir),
        original_ratio=retrain.original_ratio,
        epochs=retrain.epochs,
    )
    document = generation_manifest(manifest.document, manifest.spec, generation)
    path = artifacts / ".runs" / snapshot_name(generation_record(manifest.name, NUMBER), ".yaml")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return generation, path


def run_generation(
    manifest: Manifest, artifacts: Path, retrain: Retrain, run_plans: Any, display: RunObserver
) -> list[StageOutcome]:
    """The generation's stages, by `run_plans` (eagle3_pipeline.local.run's), shown and recorded."""
    generation, path = plan(manifest, artifacts, retrain)
    plans = plan_generation(manifest.spec, generation)
    name = generation_record(manifest.name, NUMBER)
    recorder = StatusRecorder(status_file(artifacts, name), name)
    observers = Observers([display, recorder])
    error: str | None = None
    try:
        outcomes: list[StageOutcome] = run_plans(load_manifest(path), plans, path, observers)
        return outcomes
    except Exception as exc:
        error = str(exc.args[0]) if exc.args else str(exc)
        raise
    finally:
        observers.close(error)


def verdict(outcomes: list[StageOutcome]) -> str | None:
    """One line: the new draft's acceptance against the draft it would replace, overall and on the
    held-out captured requests; None without evaluate's comparison."""
    result = next((o.result for o in outcomes if o.stage == Stage.EVALUATE.value), None)
    if not isinstance(result, EvaluateResult) or result.incumbent is None:
        return None
    incumbent = result.incumbent
    ours = {c.category: c.acceptance_length for c in result.categories or []}
    theirs = {c.category: c.acceptance_length for c in incumbent.categories or []}
    captured = ""
    if ours.get("captured") is not None and theirs.get("captured") is not None:
        captured = (
            f"; on the held-out captured requests {ours['captured']:.2f} against {theirs['captured']:.2f}"
        )
    better = (incumbent.acceptance_ratio or 0) > 1
    word = "accepted more than" if better else "not accepted more than"
    return f"generation {NUMBER} is {word} the serving draft: {incumbent.line()}{captured}"
