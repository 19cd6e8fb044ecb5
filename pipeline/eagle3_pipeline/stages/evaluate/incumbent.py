"""evaluation.incumbent: the draft serving now, measured beside the new one on the same prompts.

Whether a new draft (a later generation, trained on captured traffic) should replace the serving one is a
comparison, and a comparison means the same prompts, the same settings and the same counters. So after the
new draft's runs, a server with the incumbent (its own method's speculative config, at
evaluation.numSpeculativeTokens) answers the kept held-out prompts greedily, as the new draft's server did,
and each category's kept prompts as a run of their own (eagle3_pipeline.stages.evaluate.categories): a
mixed dataset's `captured` prompts and the original validation rows say apart where each draft is better.
The result's `incumbent` holds its figures and the new draft's acceptance length over its own
(`acceptanceRatio`). Greedy answers are the verifier's own whichever draft proposes, so the two drafts are
asked to predict the same text; output speed is left to the canary's paired windows on live traffic.

A path without a draft, or files whose digest is not evaluation.incumbent.sha256, fail the stage before
any server starts: a comparison with the wrong draft would be worse than none.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from eagle3_contract.api.spec import Incumbent
from eagle3_contract.mounts import draft_path
from eagle3_contract.results import IncumbentFigures
from eagle3_contract.vllm_command import draft_speculative_config
from eagle3_pipeline.data.draft_checkpoint import check_exported, checkpoint_method
from eagle3_pipeline.serving.requests import Measurement, Message, answer_all
from eagle3_pipeline.stages.evaluate.categories import CategoryRuns, acceptance_columns
from eagle3_pipeline.stages.evaluate.runs import Context, counted_run
from eagle3_pipeline.stages.evaluate.servers import ServerPool, draft_key

logger = logging.getLogger(__name__)

LOG_FILE = "vllm-incumbent.log"


def incumbent_dir(ctx: Context, incumbent: Incumbent) -> Path:
    """The incumbent's directory on this machine, checked: its files there, and its digest if given."""
    shown = draft_path(incumbent.path)  # as the pods see it: /artifacts/<path>
    directory = Path(ctx.local_path(shown))
    remedy = "point it at the exported draft that serves (status.checkpoint.path), or remove it"
    check_exported(directory, "evaluation.incumbent", incumbent, remedy)
    return directory


def measure_incumbent(
    ctx: Context,
    pool: ServerPool,
    prompts: list[list[Message]],
    kept: Sequence[int],
    categories: CategoryRuns | None,
    new_length: float | None,
) -> dict[str, Any]:
    """The result's `incumbent`: the incumbent's greedy run on the kept prompts (and per category), and the
    new draft's acceptance length `new_length` over its own."""
    incumbent = ctx.params.incumbent
    assert incumbent is not None
    directory = incumbent_dir(ctx, incumbent)
    method = checkpoint_method(directory)
    k = ctx.params.num_speculative_tokens
    subset = [prompts[i] for i in kept]
    own = CategoryRuns(ctx, categories.categories) if categories is not None else None
    ctx.progress.grow_total(len(subset) + (len(subset) if own is not None and own.groups(kept) else 0))
    config = draft_speculative_config(str(directory), k, method)
    with pool.serve(draft_key(directory, k), config, LOG_FILE, keep=False) as server:
        if len(subset) < len(prompts):
            asyncio.run(answer_all(server, subset, 1))  # prefixes cached, as on the new draft's server
        run = counted_run(ctx, server, subset, None, counted=True)
        server.check()
        if own is not None:
            own.measure(server, prompts, kept, counted=True)
    result = figures(incumbent.path, method.value, run, k, new_length) | {
        "categories": own.rows(kept) if own is not None else None
    }
    logger.info("evaluate: the new draft %s", IncumbentFigures.model_validate(result).line())
    return result


def figures(path: str, method: str, run: Measurement, k: int, new_length: float | None) -> dict[str, Any]:
    """The incumbent's acceptance columns and the new draft's ratio over them. Pure."""
    columns = acceptance_columns(run, "incumbent", k)
    length = columns["acceptanceLength"]
    ratio = round(new_length / length, 4) if new_length is not None and length else None
    return {"path": path, "method": method, **columns, "acceptanceRatio": ratio}
