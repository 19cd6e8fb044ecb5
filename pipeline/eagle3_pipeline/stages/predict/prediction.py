"""The predict stage's arithmetic: predicted tokens/s, speedups, break-even lengths, and a verdict.

Two methods give output tokens/s at an acceptance length L and a concurrency:
- `synthetic` (vLLM on CUDA): a server whose rejection sampler accepts draft tokens at a target mean
  acceptance length L (`rejection_sample_method: synthetic`); its tokens/s is measured directly.
- `step-cost` (vLLM's CPU build refuses synthetic sampling): one server with an untrained draft of the
  spec's shape pays the real cost of a speculative step (k draft proposals, k + 1 tokens verified) while its
  own acceptance L0 is about 1; the same verifier steps would produce L / L0 times the tokens at L, so
  tokens/s(L) = measured tokens/s x L / L0. Second-order effects (contexts growing faster per step, fewer
  steps per request) are left out.

The speedup is tokens/s over the verifier alone's at the same concurrency; the break-even acceptance length
is where it is 1 (interpolated between the measured lengths, extrapolated from the nearest two outside them).
"""

from __future__ import annotations

from collections.abc import Sequence

SYNTHETIC = "synthetic"
STEP_COST = "step-cost"
STEP_COST_NOTE = (
    "step-cost: vLLM's CPU build refuses synthetic rejection sampling, so an untrained draft of the spec's "
    "shape measured the real cost of a speculative step and tokens/s at L is that x L / its own acceptance "
    "length; second-order effects (contexts growing faster per step) are left out"
)
SYNTHETIC_NOTE = "synthetic: vLLM's synthetic rejection sampling at each acceptance length (one server each)"


def step_cost_tokens_per_second(measured: float, measured_length: float, length: float) -> float:
    """Tokens/s at acceptance length `length` from a run at `measured` tokens/s that accepted
    `measured_length` tokens per step: the same steps, `length / measured_length` times the tokens."""
    if measured_length <= 0:
        raise ValueError(f"measured acceptance length {measured_length} is not positive")
    return measured * length / measured_length


def speedup(tokens_per_second: float | None, baseline: float | None) -> float | None:
    if tokens_per_second is None or not baseline:
        return None
    return tokens_per_second / baseline


def break_even(lengths: Sequence[float], speedups: Sequence[float | None], k: int) -> float | None:
    """The acceptance length at which the speedup is 1, at one concurrency; None when it lies above k + 1
    (no draft with k speculative tokens pays off) or nothing was measured. At least 1.0."""
    points = sorted({(length, s) for length, s in zip(lengths, speedups, strict=True) if s is not None})
    distinct = list({length: s for length, s in points}.items())
    if not distinct:
        return None
    if len(distinct) == 1:  # one point: proportional to L (step-cost's model)
        length, s = distinct[0]
        value = length / s if s > 0 else None
    else:
        value = _crossing(distinct)
    if value is None or value > k + 1:
        return None
    return max(value, 1.0)


def _crossing(points: list[tuple[float, float]]) -> float | None:
    """Where the piecewise-linear curve through `points` (sorted by L) crosses 1."""
    segment = next(
        (i for i in range(len(points) - 1) if (points[i][1] - 1) * (points[i + 1][1] - 1) <= 0), None
    )
    if segment is None:
        segment = 0 if points[0][1] > 1 else len(points) - 2  # all above: extrapolate down; below: up
    (l1, s1), (l2, s2) = points[segment], points[segment + 1]
    if s2 == s1:
        return None
    return l1 + (1 - s1) * (l2 - l1) / (s2 - s1)


def verdict(concurrencies: Sequence[int], break_evens: Sequence[float | None], k: int) -> str:
    """One line: from which acceptance length a draft pays off at each concurrency, and where never."""
    pays = [(c, b) for c, b in zip(concurrencies, break_evens, strict=True) if b is not None]
    never = [c for c, b in zip(concurrencies, break_evens, strict=True) if b is None]
    parts = []
    if pays:
        parts.append(
            "a draft pays off at "
            + ", ".join(f"concurrency {c} from acceptance length {b:.2f}" for c, b in pays)
        )
    if never:
        listed = ", ".join(str(c) for c in never)
        parts.append(f"not at concurrency {listed}: it would need more than k+1 = {k + 1}")
    return "; ".join(parts) or "nothing was measured"


def interpolate(points: Sequence[tuple[float, float]], length: float) -> float | None:
    """The value at `length` on the piecewise-linear curve through `points` (extrapolated from the nearest
    segment outside them; exact for step-cost, whose speedup is proportional to L); None without points."""
    distinct = sorted(dict(points).items())
    if not distinct:
        return None
    if len(distinct) == 1:
        at, value = distinct[0]
        return value * length / at
    index = next((i for i in range(len(distinct) - 1) if length <= distinct[i + 1][0]), len(distinct) - 2)
    (l1, v1), (l2, v2) = distinct[index], distinct[index + 1]
    return v1 + (length - l1) * (v2 - v1) / (l2 - l1)
