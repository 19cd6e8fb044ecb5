"""Before offline extract starts, `eagle3 run` checks that the local filesystem holds what it will store,
as the operator checks the volume's size (eagle3_contract.storage): a run too big for the disk is refused at
once, with both figures and what to change (room on this disk, not the claim's size), instead of failing
hours into extract with a full disk."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

from eagle3_contract.api.spec import Eagle3RunSpec
from eagle3_contract.estimates import known_from_results, run_estimates
from eagle3_contract.results import GenerateResult, PrepareResult
from eagle3_contract.stages import Stage, StagePlan
from eagle3_contract.storage import disk_too_small
from eagle3_pipeline.local.display import StageOutcome


def free_bytes(path: Path) -> int:
    """The free space of the filesystem `path` is on (its nearest existing parent's)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def storage_problem(
    plan: StagePlan, outcomes: Sequence[StageOutcome], spec: Eagle3RunSpec, artifacts: Path
) -> str | None:
    """Why `plan` (offline extract) must not start on this disk, from the data stages' results; or None."""
    if plan.stage != Stage.EXTRACT:
        return None
    results = {o.stage: o.result for o in outcomes}
    prepare, generate = results.get(Stage.PREPARE.value), results.get(Stage.GENERATE.value)
    shape, tokens = known_from_results(
        spec,
        prepare if isinstance(prepare, PrepareResult) else None,
        generate if isinstance(generate, GenerateResult) else None,
    )
    estimates = run_estimates(spec, shape, tokens)
    return disk_too_small(spec, estimates, free_bytes(artifacts), str(artifacts))
