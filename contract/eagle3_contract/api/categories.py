"""Acceptance per category: what evaluate measures for each category of its held-out prompts.

A held-out prompt's category is its dataset row's `category` field, or, when dataset.source is a directory of
several files, the file it came from (its path in the directory without the data suffixes: `code.jsonl.gz`
is `code`). `evaluation.categories` names the categories reported; a prompt of any other category, or of
none, is counted in OTHER_CATEGORY. Without it, the categories found are reported when there are at most
MAX_CATEGORIES of them, else the MAX_CATEGORIES - 1 with the most prompts and OTHER_CATEGORY for the rest.
So a run reports at most MAX_CATEGORIES + 1 categories: the bound of the `category` label of the operator's
metrics.

vLLM's speculative-decoding counters are server-wide, not per request: a category's acceptance is the
counters' difference over a run that answers that category's prompts alone, on evaluate's draft server
after its main runs; its speedup is that run's output tokens/s over the same prompts' run on the verifier
alone. Pure: the pipeline writes the rows (EvaluateResult.categories), the operator copies them into
status.checkpoint.categories and exports them as metrics.
"""

from __future__ import annotations

from pydantic import ConfigDict, Field

from eagle3_contract.api.base import ApiModel

MAX_CATEGORIES = 16
OTHER_CATEGORY = "other"
CATEGORY_MAX_LENGTH = 63  # a category is a Prometheus label value and one word of `eagle3 status`
CATEGORY_NAME = r"^\S(.*\S)?$"  # no leading or trailing whitespace


class CategoryFigures(ApiModel):
    """One category's figures: its held-out prompts answered as a run of their own, with the draft and by the
    verifier alone."""

    model_config = ConfigDict(extra="ignore")  # lives in status, results and manifests

    category: str = Field(description="The category: a dataset row's `category`, a file's name, or `other`.")
    prompts: int = Field(description="Held-out prompts of this category measured (degenerate ones left out).")
    drafts: int | None = Field(None, description="Verifier steps that verified draft tokens in its run.")
    accepted_tokens: int | None = Field(None, description="Draft tokens the verifier accepted in its run.")
    acceptance_length: float | None = Field(
        None, description="Mean acceptance length (tokens per verifier step) of its run, greedy."
    )
    acceptance_rate: float | None = Field(
        None, description="Fraction of the draft tokens proposed in its run that the verifier accepted."
    )
    output_tokens: int | None = Field(None, description="Output tokens of its run with the draft.")
    output_tokens_per_second: float | None = Field(
        None, description="Output tokens/s of its run with the draft."
    )
    speedup: float | None = Field(
        None,
        description="Its output tokens/s with the draft over the verifier alone's on the same prompts; unset "
        "when the verifier alone was not measured.",
    )

    def line(self) -> str:
        """`code 2.41 (0.47, 1.62x, 5 prompts)`: one category for `eagle3 status`."""
        length = f"{self.acceptance_length:.2f}" if self.acceptance_length is not None else "n/a"
        rate = f"{self.acceptance_rate:.2f}, " if self.acceptance_rate is not None else ""
        speedup = f"{self.speedup:.2f}x, " if self.speedup is not None else ""
        return f"{self.category} {length} ({rate}{speedup}{self.prompts} prompts)"


def categories_line(rows: list[CategoryFigures]) -> str:
    """Every category's acceptance length (acceptance rate, speedup, prompts) on one line."""
    return "; ".join(row.line() for row in rows)
