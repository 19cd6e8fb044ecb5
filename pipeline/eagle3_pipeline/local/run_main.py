"""`eagle3 run FILE`: the run's stages on this machine (eagle3_pipeline.local.run), their tables, and with
`--retrain RECORDS` the draft's next generation after them (eagle3_pipeline.local.retrain)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eagle3_contract.api.manifest import Manifest, load_manifest
from eagle3_contract.stages import StagePlan
from eagle3_pipeline.local.display import LogDisplay, RunObserver, display_for, summary_table
from eagle3_pipeline.local.evaluation_tables import bake_off_table, sweep_table
from eagle3_pipeline.local.retrain import Retrain, RetrainError, run_generation, verdict
from eagle3_pipeline.local.run import (
    LocalOptions,
    LocalRunError,
    check_verifier_config,
    default_artifacts,
    run_local,
    run_plans,
)


def main(
    path: str,
    artifacts: str | None,
    models: str | None,
    vllm: str | None,
    until: str | None,
    retrain: Retrain | None = None,
) -> int:
    from rich.console import Console
    from rich.markup import escape

    console = Console(stderr=True)
    try:
        manifest = load_manifest(path)
        check_verifier_config(manifest, Path(models) if models else None)
    except ValueError as exc:
        # escaped: error text quotes the user's keys and patterns, whose brackets are no markup
        console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False, soft_wrap=True)
        return 2
    options = LocalOptions(
        artifacts=Path(artifacts) if artifacts else default_artifacts(manifest),
        models=Path(models) if models else None,
        vllm=vllm,
        until=until,
    )
    shown = display_for(console)
    table = not isinstance(shown, LogDisplay)  # in JSON, each stage's record carries its figures
    try:
        outcomes = run_local(manifest, options, shown)
    except LocalRunError as exc:
        done = exc.args[1] if len(exc.args) > 1 else []
        if done and table:
            console.print(summary_table(done))
            if (bake_off := bake_off_table(done)) is not None:  # why nothing ships, when that is why
                console.print(bake_off)
        console.print(f"[red]error:[/red] {escape(str(exc.args[0]))}", highlight=False, soft_wrap=True)
        return 1
    if table:
        console.print(summary_table(outcomes))
        if (bake_off := bake_off_table(outcomes)) is not None:
            console.print(bake_off)
        if (sweep := sweep_table(outcomes)) is not None:
            console.print(sweep)
    if retrain is not None:  # --retrain: the next generation, from the draft just exported (a display anew)
        return main_generation(console, manifest, options, retrain, display_for(console))
    console.print(f"artifacts: {options.artifacts.resolve()}", highlight=False, markup=False)
    return 0


def main_generation(
    console: Any, manifest: Manifest, options: LocalOptions, retrain: Retrain, shown: RunObserver
) -> int:
    """`--retrain`: the generation's stages after the run's, their table, and whether it is accepted more."""
    from rich.markup import escape

    def with_options(gen: Manifest, plans: list[StagePlan], spec_file: Path, observer: RunObserver) -> Any:
        return run_plans(gen, options, plans, spec_file, observer)

    table = not isinstance(shown, LogDisplay)  # in JSON, each stage's record carries its figures
    try:
        outcomes = run_generation(manifest, options.artifacts, retrain, with_options, shown)
    except (LocalRunError, RetrainError) as exc:
        done = exc.args[1] if isinstance(exc, LocalRunError) and len(exc.args) > 1 else []
        if done and table:
            console.print(summary_table(done))
        console.print(f"[red]error:[/red] {escape(str(exc.args[0]))}", highlight=False, soft_wrap=True)
        return 1
    if table:
        console.print(summary_table(outcomes))
    line = verdict(outcomes)
    if line is not None:
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    console.print(f"artifacts: {options.artifacts.resolve()}", highlight=False, markup=False)
    return 0
