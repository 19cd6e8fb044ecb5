"""evaluate's held-out prompts and what their answers say about the figures.

The prompts are the data stage's validation conversations, each up to its first assistant turn, sent as chat
messages: vLLM renders them with the verifier's own chat template (`evaluate_requests`), never as raw
completion text, whose answers to random text are often degenerate loops. A conversation with no user turn
to answer there (no user turn at all, or an assistant's turn first) is skipped and counted.

The verifier's greedy answers are screened (`eagle3_pipeline.serving.degenerate`): a prompt answered with a
repetition loop or nothing visible is left out of the acceptance and speed figures, and the result counts
them by reason with a few of their conversation ids.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from eagle3_pipeline.data.conversations import prompt_of
from eagle3_pipeline.data.prepared import VAL, read_conversations
from eagle3_pipeline.runtime.errors import StageError
from eagle3_pipeline.serving.degenerate import Screening
from eagle3_pipeline.serving.requests import Measurement, Message

logger = logging.getLogger(__name__)

DEGENERATE_EXAMPLES = 3


@dataclass(frozen=True)
class HeldOut:
    """The held-out prompts taken (in file order) and their conversations' ids."""

    prompts: list[list[Message]]
    ids: list[str]
    available: int  # validation conversations with a user turn to answer
    skipped: int  # validation conversations without one
    categories: list[str | None] = field(default_factory=list)  # each prompt's (the row's `category`)


def held_out_prompts(path: Path, wanted: int) -> HeldOut:
    """Up to `wanted` prompts from the validation rows of `path`, in file order."""
    rows = [row for row in read_conversations(path) if row.get("split") == VAL]
    found = [(str(row.get("id", i)), prompt_of(row.get("messages") or []), row) for i, row in enumerate(rows)]
    prompts = [(row_id, p, row) for row_id, p, row in found if p is not None]
    if not prompts:
        raise StageError(
            f"{path} has no validation conversation with a user turn to answer ({len(rows)} validation "
            "rows): evaluation needs held-out prompts; set dataset.validationFraction above 0"
        )
    if len(prompts) < wanted:
        logger.warning("only %d held-out prompts for evaluation.prompts %d", len(prompts), wanted)
    skipped = len(rows) - len(prompts)
    if skipped:
        logger.info("%d validation conversations have no user turn to answer: skipped", skipped)
    taken = prompts[:wanted]
    categories = [row.get("category") if isinstance(row.get("category"), str) else None for *_, row in taken]
    return HeldOut([p for _, p, _ in taken], [i for i, _, _ in taken], len(prompts), skipped, categories)


def degenerate_note(screening: Screening, ids: Sequence[str]) -> str | None:
    """What the result says of the prompts left out (None when none was)."""
    left_out = screening.degenerate
    if not left_out:
        return None
    reasons = ", ".join(f"{n} {reason}" for reason, n in screening.counts().items() if n)
    examples = ", ".join(ids[i] for i in left_out[:DEGENERATE_EXAMPLES] if i < len(ids))
    total, kept = len(screening.reasons), len(screening.kept)
    if not kept:
        return (
            f"every one of the {total} held-out prompts got a degenerate answer from the verifier "
            f"({reasons}; e.g. conversations {examples}): there is nothing to measure the draft on, so "
            "the acceptance is null; check the dataset's validation conversations and the verifier's chat "
            "template"
        )
    return (
        f"{len(left_out)} of {total} held-out prompts got a degenerate answer from the verifier ({reasons}; "
        f"e.g. conversations {examples}): the acceptance and speed figures are measured on the other {kept}"
    )


def degenerate_examples(screening: Screening, ids: Sequence[str]) -> list[str]:
    return [ids[i] for i in screening.degenerate[:DEGENERATE_EXAMPLES] if i < len(ids)]


def answered(prompts: int, kept: int, passes: int) -> int:
    """The prompts answered in all: every one once (screened), the kept ones again when some were left out,
    and the kept ones in each other pass."""
    return prompts + (kept if kept < prompts else 0) + (passes - 1) * kept


def write_answers(path: Path, held: HeldOut, screening: Screening, run: Measurement | None) -> None:
    """The screened answers, one JSON line per prompt: its conversation id, what vLLM rendered (the prompt's
    token ids), the answer and whether it was left out as degenerate."""
    answers = (run.screened or run) if run is not None else None
    if answers is None:
        return
    with path.open("w") as out:
        for i, reason in enumerate(screening.reasons):
            row = {
                "id": held.ids[i],
                "degenerate": str(reason) if reason is not None else None,
                "promptTokenIds": answers.prompt_token_ids[i],
                "answer": answers.outputs[i],
                "answerTokens": len(answers.token_ids[i] or []),
            }
            out.write(json.dumps(row) + "\n")
