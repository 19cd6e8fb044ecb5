"""serving.canary's refusal by category: a new draft whose evaluated acceptance length in any category falls
below 1 - tolerance times the incumbent's is rolled back (CategoryRegressed), whatever its mean does.

vLLM's live counters are server-wide, not per request, so the live tracks cannot be read per category. What
is per category is evaluate's measurement on the held-out prompts (eagle3_contract.api.categories): each
category's prompts answered as a run of their own, greedy, so a category's acceptance length is a figure of
the draft and the prompts, not of the machine's load. The canary compares the new draft's rows (its
Checkpoint: the rollout, status.checkpoint.categories) with the incumbent's: the rows of the draft that
served when the canary started (status.checkpoint then, whose path is the serving Deployment's draft), kept
in status.canary.incumbentCategories while the canary runs (status.checkpoint names the new draft from then
on). The figures are known before any live traffic, so a regression refuses the canary at its start.

A category counts where both drafts have its acceptance length over at least MIN_CATEGORY_PROMPTS prompts:
a category of one to three prompts is one or two odd prompts away from any figure (a prompt of the tiny
corpus moves its category's acceptance length by 0.1 to 0.3), and four is the fewest the tiny example's
categories have. Its ratio (new over incumbent) below 1 - serving.canary.tolerance is a regression. Where
either draft has no rows (a pinned draft: pins carry no evaluated figures; a run evaluated with a single
category), nothing is compared and the message says so: the canary decides on its live figures alone.

Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from eagle3_contract.api.categories import CategoryFigures

MIN_CATEGORY_PROMPTS = 4


@dataclass(frozen=True)
class CategoryCheck:
    """The categories below the threshold (one text each: `code 1.20 vs 1.60 (0.75x, 6 and 6 prompts)`) and
    what was compared, for status and the messages."""

    regressed: tuple[str, ...]
    note: str


def check_categories(
    new: list[CategoryFigures] | None, incumbent: list[CategoryFigures] | None, tolerance: float
) -> CategoryCheck:
    """The new draft's evaluated acceptance length per category against the incumbent's."""
    threshold = 1.0 - tolerance
    if not incumbent or not new:
        which = "the incumbent's" if not incumbent else "the new draft's"
        return CategoryCheck(
            (),
            f"acceptance per category not compared: {which} evaluated figures per category are unknown (a "
            "pinned draft, or an evaluation with one category)",
        )
    theirs = {row.category: row for row in incumbent}
    compared: list[str] = []
    few: list[str] = []
    regressed: list[str] = []
    for row in new:
        old = theirs.get(row.category)
        if old is None or not row.acceptance_length or not old.acceptance_length:
            continue
        if min(row.prompts, old.prompts) < MIN_CATEGORY_PROMPTS:
            few.append(row.category)
            continue
        compared.append(row.category)
        ratio = row.acceptance_length / old.acceptance_length
        if ratio < threshold:
            regressed.append(
                f"{row.category} {row.acceptance_length:.2f} vs {old.acceptance_length:.2f} ({ratio:.2f}x, "
                f"{row.prompts} and {old.prompts} prompts)"
            )
    left_out = (
        f"; left out, fewer than {MIN_CATEGORY_PROMPTS} prompts on a side: {', '.join(few)}" if few else ""
    )
    if regressed:
        found = f"below {threshold:.2f}x the incumbent's: {'; '.join(regressed)}"
    else:
        found = f"none below {threshold:.2f}x the incumbent's"
    note = (
        f"evaluated acceptance length per category, {len(compared)} compared "
        f"({', '.join(compared) or 'none'}): {found}{left_out}"
    )
    return CategoryCheck(tuple(regressed), note)
