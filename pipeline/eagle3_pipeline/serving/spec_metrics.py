"""vLLM's speculative-decoding counters, read from its Prometheus `/metrics` text, and the acceptance figures.

vLLM counts, per engine (labels `model_name`, `engine`):
  vllm:spec_decode_num_drafts_total                 verifier steps that checked a draft
  vllm:spec_decode_num_draft_tokens_total           draft tokens proposed (k per draft)
  vllm:spec_decode_num_accepted_tokens_total        draft tokens the verifier accepted
  vllm:spec_decode_num_accepted_tokens_per_pos_total{position="0".."k-1"}

The stage reads them before and after its requests, like `vllm bench serve`, and takes the difference,
summed over engines (data-parallel replicas): acceptance rate = accepted / draft tokens, mean acceptance
length = 1 + accepted / drafts (tokens per verifier step, the bonus token included), and the acceptance at
position i = accepted at i / drafts.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass

PREFIX = "vllm:spec_decode_"
DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"


@dataclass(frozen=True)
class SpecDecodeCounters:
    """The counters at one moment (or a difference of two moments), summed over engines."""

    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    accepted_per_position: tuple[float, ...] = ()
    generation_tokens: float = 0.0

    def __sub__(self, before: SpecDecodeCounters) -> SpecDecodeCounters:
        width = max(len(self.accepted_per_position), len(before.accepted_per_position))
        after_pos = _padded(self.accepted_per_position, width)
        before_pos = _padded(before.accepted_per_position, width)
        return SpecDecodeCounters(
            drafts=self.drafts - before.drafts,
            draft_tokens=self.draft_tokens - before.draft_tokens,
            accepted=self.accepted - before.accepted,
            accepted_per_position=tuple(a - b for a, b in zip(after_pos, before_pos, strict=True)),
            generation_tokens=self.generation_tokens - before.generation_tokens,
        )

    def __add__(self, other: SpecDecodeCounters) -> SpecDecodeCounters:
        """The sum of two differences (rounds measured apart on one server)."""
        width = max(len(self.accepted_per_position), len(other.accepted_per_position))
        mine, theirs = _padded(self.accepted_per_position, width), _padded(other.accepted_per_position, width)
        return SpecDecodeCounters(
            drafts=self.drafts + other.drafts,
            draft_tokens=self.draft_tokens + other.draft_tokens,
            accepted=self.accepted + other.accepted,
            accepted_per_position=tuple(a + b for a, b in zip(mine, theirs, strict=True)),
            generation_tokens=self.generation_tokens + other.generation_tokens,
        )


@dataclass(frozen=True)
class Acceptance:
    """What the counters say about the draft."""

    rate: float  # accepted / draft tokens
    length: float  # 1 + accepted / drafts: tokens per verifier step
    by_position: tuple[float, ...]  # accepted at position i / drafts

    @classmethod
    def from_counters(cls, counters: SpecDecodeCounters) -> Acceptance:
        if counters.drafts <= 0 or counters.draft_tokens <= 0:
            raise ValueError(
                f"no drafts were verified ({counters.drafts:g} drafts, {counters.draft_tokens:g} draft "
                "tokens): acceptance is undefined"
            )
        return cls(
            rate=counters.accepted / counters.draft_tokens,
            length=1.0 + counters.accepted / counters.drafts,
            by_position=tuple(a / counters.drafts for a in counters.accepted_per_position),
        )


def parse_counters(text: str, model_name: str | None = None) -> SpecDecodeCounters | None:
    """The spec-decode counters in a /metrics page, or None when it has none (no draft is configured).

    Samples of another served model name are ignored when `model_name` is given; `_created` samples are not
    counters and are ignored too.
    """
    from prometheus_client.parser import text_string_to_metric_families

    totals: dict[str, float] = defaultdict(float)
    per_position: dict[int, float] = defaultdict(float)
    found = False
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if model_name is not None and sample.labels.get("model_name", model_name) != model_name:
                continue
            if sample.name == ACCEPTED_PER_POS:
                per_position[int(sample.labels["position"])] += sample.value
                found = True
            elif sample.name in (DRAFTS, DRAFT_TOKENS, ACCEPTED):
                totals[sample.name] += sample.value
                found = True
            elif sample.name == GENERATION_TOKENS:
                totals[sample.name] += sample.value
    if not found:
        return None
    width = max(per_position) + 1 if per_position else 0
    return SpecDecodeCounters(
        drafts=totals[DRAFTS],
        draft_tokens=totals[DRAFT_TOKENS],
        accepted=totals[ACCEPTED],
        accepted_per_position=tuple(per_position.get(i, 0.0) for i in range(width)),
        generation_tokens=totals[GENERATION_TOKENS],
    )


def consistency_problems(delta: SpecDecodeCounters, num_speculative_tokens: int) -> list[str]:
    """What would make the counters of one run contradict each other (each holds exactly in vLLM).

    A draft proposes at most k tokens (fewer near the length limit); a token accepted at position i+1 was
    accepted at i too, so the per-position counts never grow and sum to the accepted tokens.
    """
    problems = []
    k = num_speculative_tokens
    if delta.draft_tokens > delta.drafts * k:
        problems.append(f"draft tokens {delta.draft_tokens:g} > drafts {delta.drafts:g} x k {k}")
    if delta.accepted > delta.draft_tokens:
        problems.append(f"accepted {delta.accepted:g} > draft tokens {delta.draft_tokens:g}")
    per_position = delta.accepted_per_position
    if len(per_position) != k:
        problems.append(f"{len(per_position)} draft positions counted, expected k = {k}")
    if sum(per_position) != delta.accepted:
        problems.append(f"accepted per position {list(per_position)} does not sum to {delta.accepted:g}")
    if any(later > earlier for earlier, later in itertools.pairwise(per_position)):
        problems.append(f"accepted per position {list(per_position)} grows with the position")
    return problems


def _padded(values: tuple[float, ...], width: int) -> tuple[float, ...]:
    return values + (0.0,) * (width - len(values))
