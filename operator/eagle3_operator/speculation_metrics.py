"""The canary's and evaluate's sweep's per-run gauges (docs/metrics.md), read from the run's status.

`SpeculationGauges` holds the gauges; `canary_samples` and `sweep_samples` turn one status into the samples a
run has now, each under a slot that `OperatorMetrics` (metrics.py) remembers, so that a sample a new status no
longer has drops its series. The canary's come from `status.canary` (its phase, both tracks' live figures over
its observation window, the time to its decision); the sweep's from `status.checkpoint.speculation` (each k by
concurrency cell, the verifier alone as k 0, and the tuned schedule): at most 17 k by 16 concurrencies a run;
`choice_samples` the drafts evaluate chose the exported one from (draft.candidates or the epochs of
training.checkpointSelection acceptance), from its result's `checkpointSelection`; `category_samples` the
acceptance per category of the held-out prompts, from `status.checkpoint.categories` (at most 17 a run).
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Gauge

from eagle3_contract.api.status import CanaryPhase, Eagle3RunStatus, TrackFigures
from eagle3_contract.results import EvaluateResult
from eagle3_contract.stages import Stage

RUN = ("namespace", "run")
STABLE, CANARY = "stable", "canary"  # the `track` of the incumbent's and the canary's pods (the PodMonitor's)
BASELINE_K = "0"  # the sweep's `k` of the verifier alone (as in the schedule: k 0 = speculation off)
CANARY_SLOTS, SWEEP_SLOTS, CHOICE_SLOTS, CATEGORY_SLOTS = "canary_", "sweep_", "choice_", "category_"


@dataclass(frozen=True)
class Sample:
    """One series of a run: the memory slot that owns it, its gauge, its labels and its value."""

    slot: str
    gauge: Gauge
    labels: tuple[str, ...]
    value: float


class SpeculationGauges:
    """The canary's and the sweep's gauges, in the operator's registry."""

    def __init__(self, r: CollectorRegistry) -> None:
        def gauge(name: str, doc: str, *labels: str) -> Gauge:
            return Gauge(name, doc, [*RUN, *labels], registry=r)

        cell = ("model", "k", "concurrency")
        self.canary_phase = gauge(
            "eagle3_run_canary_phase",
            "1 for the canary's phase (status.canary.phase), 0 for the others.",
            "phase",
        )
        self.canary_length = gauge(
            "eagle3_run_canary_acceptance_length", "Live mean acceptance length over the canary's window, "
            "by track: stable (the incumbent) or canary.", "track",
        )  # fmt: skip
        self.canary_speed = gauge(
            "eagle3_run_canary_output_tokens_per_second", "Output tokens per second of one request over the "
            "canary's window (1 / mean time per output token), by track.", "track",
        )  # fmt: skip
        self.canary_requests = gauge(
            "eagle3_run_canary_requests", "Requests finished in the canary's window, by track.", "track"
        )
        self.canary_ratio = gauge(
            "eagle3_run_canary_ratio", "The canary's figure over the incumbent's, sub-window by sub-window "
            "(status.canary.acceptanceRatio, .speedRatio): bound ratio (the median), low and high (its 95 % "
            "interval).", "figure", "bound",
        )  # fmt: skip
        self.canary_decision = gauge(
            "eagle3_run_canary_decision_seconds", "From the start of the canary's window to its decision."
        )
        self.sweep_length = gauge(
            "eagle3_run_sweep_acceptance_length", "evaluate's sweep: mean acceptance length at k speculative "
            "tokens and a concurrency.", *cell,
        )  # fmt: skip
        self.sweep_speed = gauge(
            "eagle3_run_sweep_output_tokens_per_second", "evaluate's sweep: output tokens per second of all "
            "requests at k and a concurrency (k 0: the verifier alone).", *cell,
        )  # fmt: skip
        self.sweep_speedup = gauge(
            "eagle3_run_sweep_speedup", "evaluate's sweep: output tokens/s at k / the verifier alone's at "
            "the same concurrency (k 0: 1).", *cell,
        )  # fmt: skip
        self.speculation_length = gauge(
            "eagle3_run_speculation_length", "The best k per batch-size range (0: speculation off), from "
            "evaluate's sweep.", "model", "min_batch_size", "max_batch_size",
        )  # fmt: skip
        choice = ("model", "draft", "chosen")
        self.choice_length = gauge(
            "eagle3_run_choice_acceptance_length", "The drafts evaluate chose from (draft.candidates: by "
            "method; training.checkpointSelection acceptance: by epoch): mean acceptance length of each; "
            "chosen 1 for the one exported.", *choice,
        )  # fmt: skip
        self.choice_speed = gauge(
            "eagle3_run_choice_output_tokens_per_second", "The drafts evaluate chose from: output tokens "
            "per second of all requests at evaluate's concurrency; chosen 1 for the one exported.", *choice,
        )  # fmt: skip
        category = ("model", "category")
        self.category_length = gauge(
            "eagle3_run_category_acceptance_length", "evaluate's mean acceptance length (greedy) per "
            "category of the held-out prompts (status.checkpoint.categories: at most 17 a run).", *category,
        )  # fmt: skip
        self.category_rate = gauge(
            "eagle3_run_category_acceptance_rate", "evaluate's fraction of draft tokens accepted per "
            "category of the held-out prompts.", *category,
        )  # fmt: skip
        self.category_speedup = gauge(
            "eagle3_run_category_speedup", "evaluate's output tokens/s with the draft / the verifier alone's "
            "per category of the held-out prompts (each category's prompts answered as a run of their own).",
            *category,
        )  # fmt: skip


def canary_samples(g: SpeculationGauges, namespace: str, run: str, status: Eagle3RunStatus) -> list[Sample]:
    """status.canary: its phase (one-hot), both tracks' known figures, both comparisons (median ratio and
    interval), the seconds to its decision."""
    canary = status.canary
    if canary is None:
        return []
    out = [
        Sample(
            f"{CANARY_SLOTS}phase/{p.value}",
            g.canary_phase,
            (namespace, run, p.value),
            float(p == canary.phase),
        )
        for p in CanaryPhase
    ]
    for track, figures in ((STABLE, canary.incumbent), (CANARY, canary.canary)):
        for name, gauge, value in _track_figures(g, figures):
            out.append(Sample(f"{CANARY_SLOTS}{name}/{track}", gauge, (namespace, run, track), value))
    for figure, comparison in (
        ("acceptance_length", canary.acceptance_ratio),
        ("output_tokens_per_second", canary.speed_ratio),
    ):
        for bound in ("ratio", "low", "high") if comparison is not None else ():
            value = float(getattr(comparison, bound))
            labels = (namespace, run, figure, bound)
            out.append(Sample(f"{CANARY_SLOTS}ratio/{figure}/{bound}", g.canary_ratio, labels, value))
    if canary.seconds_to_decision is not None:
        out.append(
            Sample(f"{CANARY_SLOTS}decision", g.canary_decision, (namespace, run), canary.seconds_to_decision)
        )
    return out


def _track_figures(g: SpeculationGauges, figures: TrackFigures | None) -> list[tuple[str, Gauge, float]]:
    """(slot name, gauge, value) of one track's figures that are known."""
    if figures is None:
        return []
    found = (
        ("length", g.canary_length, figures.acceptance_length),
        ("speed", g.canary_speed, figures.output_tokens_per_second),
        ("requests", g.canary_requests, figures.requests),
    )
    return [(name, gauge, float(value)) for name, gauge, value in found if value is not None]


def sweep_samples(
    g: SpeculationGauges, namespace: str, run: str, model: str | None, status: Eagle3RunStatus
) -> list[Sample]:
    """status.checkpoint.speculation: each cell's figures, the baselines as k 0, the schedule's k by range."""
    table = status.checkpoint.speculation if status.checkpoint is not None else None
    if table is None or model is None:
        return []
    labels = (namespace, run, model)
    cells: list[tuple[str, str, int, Gauge, float | None]] = []
    for c in table.cells:
        k = str(c.num_speculative_tokens)
        cells += [
            ("length", k, c.concurrency, g.sweep_length, c.acceptance_length),
            ("speed", k, c.concurrency, g.sweep_speed, c.output_tokens_per_second),
            ("speedup", k, c.concurrency, g.sweep_speedup, c.speedup),
        ]
    for b in table.baselines:
        if b.output_tokens_per_second is not None:
            cells += [
                ("speed", BASELINE_K, b.concurrency, g.sweep_speed, b.output_tokens_per_second),
                ("speedup", BASELINE_K, b.concurrency, g.sweep_speedup, 1.0),
            ]
    out = [
        Sample(f"{SWEEP_SLOTS}{name}/{k}/{concurrency}", gauge, (*labels, k, str(concurrency)), value)
        for name, k, concurrency, gauge, value in cells
        if value is not None
    ]
    for r in table.schedule:
        bounds = (str(r.min_batch_size), str(r.max_batch_size))
        slot = f"{SWEEP_SLOTS}schedule/{'-'.join(bounds)}"
        out.append(Sample(slot, g.speculation_length, (*labels, *bounds), float(r.num_speculative_tokens)))
    return out


def choice_samples(
    g: SpeculationGauges, namespace: str, run: str, model: str | None, status: Eagle3RunStatus
) -> list[Sample]:
    """evaluate's checkpointSelection (status.stages.evaluate.result): each draft it measured to choose the
    one exported (a candidate method, or an epoch), its acceptance length and output tokens/s."""
    evaluate = status.stages.get(Stage.EVALUATE.value)
    result = EvaluateResult.parse(evaluate.result) if evaluate is not None else None
    choice = result.checkpoint_selection if result is not None else None
    if choice is None or model is None:
        return []
    out = []
    for c in choice.checkpoints:
        draft = c.method or f"epoch {c.epoch}"
        labels = (namespace, run, model, draft, "1" if c.checkpoint == choice.checkpoint else "0")
        for name, gauge, value in (
            ("length", g.choice_length, c.acceptance_length),
            ("speed", g.choice_speed, c.output_tokens_per_second),
        ):
            if value is not None:
                out.append(Sample(f"{CHOICE_SLOTS}{name}/{draft}", gauge, labels, float(value)))
    return out


def category_samples(
    g: SpeculationGauges, namespace: str, run: str, model: str | None, status: Eagle3RunStatus
) -> list[Sample]:
    """status.checkpoint.categories: each category's acceptance length, rate and speedup (the category
    label is bounded: eagle3_contract.api.categories)."""
    rows = status.checkpoint.categories if status.checkpoint is not None else None
    if not rows or model is None:
        return []
    out = []
    for row in rows:
        labels = (namespace, run, model, row.category)
        for name, gauge, value in (
            ("length", g.category_length, row.acceptance_length),
            ("rate", g.category_rate, row.acceptance_rate),
            ("speedup", g.category_speedup, row.speedup),
        ):
            if value is not None:
                out.append(Sample(f"{CATEGORY_SLOTS}{name}/{row.category}", gauge, labels, float(value)))
    return out
