"""The dashboard's live-capture row: what serving.capture records for the draft's next generation.

The capture package (eagle3_contract.capture) counts on vLLM's own /metrics, so the serving pods' scrape
carries its series with the run's labels (the PodMonitor's), without vLLM's `model_name`. Records by
outcome (docs/metrics.md): `written` (on the claim), `dropped` (the bounded queue was full, or a body over
4 MiB: the request itself was served), `skipped` (not a single answered chat: an error, `n` > 1), `failed`
(unparseable, or the write failed, e.g. a full volume). Bytes are those written, before pruning by
serving.capture.retention and maxBytes.
"""

from __future__ import annotations

from eagle3_operator.observability import panels as p
from eagle3_operator.observability import queries as q

OUTCOMES = (
    "Outcome written: on the artifacts claim under capture/; dropped: the writer's bounded queue was full, "
    "or a body over 4 MiB (the request was served, its record lost); skipped: not a single answered chat "
    "(an error, n > 1); failed: unparseable, or the write failed (a full volume)."
)


def capture_panels() -> list[p.Panel]:
    return [
        p.graph(
            "Captured records per second, by outcome",
            f"rate({q.CAPTURE_RECORDS}) per run and outcome, all vLLM replicas summed. {OUTCOMES} Sampled "
            "at serving.capture.sampleRate before anything is buffered.",
            "reqps",
            [p.Target(q.captured_records_per_second(), "{{outcome}} {{namespace}}/{{run}}")],
            min_val=0,
        ),
        p.graph(
            "Captured bytes per second",
            f"rate({q.CAPTURE_BYTES}) per run: what the records add to the claim before pruning "
            "(serving.capture.retention, then maxBytes across the pods).",
            "Bps",
            [p.Target(q.captured_bytes_per_second())],
            min_val=0,
        ),
    ]
