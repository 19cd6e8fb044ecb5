"""Screening captured records: what live traffic holds that a curated dataset does not.

Served traffic repeats itself (a client's retries, a benchmark's fixed prompts, a health check that chats),
and a verifier sometimes answers with a repetition loop. Trained on, a repeated exchange weighs as many
times as it was sent, and a loop teaches the draft to predict loops (which also inflates its measured
acceptance: eagle3_pipeline.serving.degenerate). So prepare keeps the first of each exact exchange (the
messages, the tools and the answer) and leaves out an answer that is degenerate by the rules evaluate
applies to held-out answers (over the answer's words: the record holds its text, not its tokens).

Screened rows are counted by reason in prepare's result (`screened`), apart from the skipped ones: a skip
says the data could not be read as asked (and too many fail the stage: dataset.maxSkippedFraction), a
screened row was read and is not worth training on. Rows of other formats are not screened: a dataset's
author chose them.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from eagle3_pipeline.data.conversations import Conversation, Skips
from eagle3_pipeline.serving.degenerate import classify

DUPLICATE = "duplicate"
DIGEST_BYTES = 16  # of each exchange kept in memory: a million records cost about 100 MB, not their text


class CapturedScreen:
    """Screens captured conversations in the order read; what it leaves out is counted in `screened`."""

    def __init__(self) -> None:
        self.seen: set[bytes] = set()
        self.screened = Skips()

    def keeps(self, conv: Conversation) -> bool:
        """Whether `conv` is kept; if not, it is counted in `screened` under its reason."""
        reason, detail = self._reason(conv)
        if reason is None:
            return True
        self.screened.add(reason, conv["id"], detail)
        return False

    def _reason(self, conv: Conversation) -> tuple[str | None, str]:
        answer = conv["messages"][-1]
        if not answer.get("tool_calls"):  # an answer that only calls tools has no text to judge
            text = answer.get("content") or answer.get("reasoning_content") or ""
            degenerate = classify(text)
            if degenerate is not None:
                return str(degenerate), f"the answer is degenerate ({degenerate}): {text[:80]!r}"
        digest = _digest(conv)
        if digest in self.seen:
            return DUPLICATE, "the same messages, tools and answer as an earlier record"
        self.seen.add(digest)
        return None, ""


def _digest(conv: Conversation) -> bytes:
    exchange: dict[str, Any] = {"messages": conv["messages"], "tools": conv.get("tools")}
    canonical = json.dumps(exchange, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.blake2b(canonical.encode("utf-8"), digest_size=DIGEST_BYTES).digest()
