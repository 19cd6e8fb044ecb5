"""OperatorMetrics: runs by phase without double counting, stage durations, per-run acceptance length."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eagle3_operator.api.status import RunPhase
from eagle3_operator.metrics import STAGE_BUCKETS, OperatorMetrics

RUNS = "eagle3_operator_runs"
ACCEPTANCE = "eagle3_run_acceptance_length"
STAGE = "eagle3_operator_stage_duration_seconds"


def runs_in(metrics: OperatorMetrics, phase: RunPhase) -> float | None:
    return metrics.registry.get_sample_value(RUNS, {"phase": phase.value})


def acceptance(metrics: OperatorMetrics, namespace: str, run: str) -> float | None:
    return metrics.registry.get_sample_value(ACCEPTANCE, {"namespace": namespace, "run": run})


def test_every_phase_starts_at_zero() -> None:
    metrics = OperatorMetrics()
    assert {phase: runs_in(metrics, phase) for phase in RunPhase} == dict.fromkeys(RunPhase, 0.0)


def test_a_run_moves_between_phases_and_is_counted_once() -> None:
    metrics = OperatorMetrics()
    metrics.observe_run("ns", "a", RunPhase.PENDING, None, [])
    metrics.observe_run("ns", "a", RunPhase.PENDING, None, [])
    assert runs_in(metrics, RunPhase.PENDING) == 1
    metrics.observe_run("ns", "a", RunPhase.RUNNING, None, [])
    metrics.observe_run("ns", "b", RunPhase.RUNNING, None, [])
    metrics.observe_run("other", "a", RunPhase.SERVING, None, [])  # same name, another namespace
    assert runs_in(metrics, RunPhase.PENDING) == 0
    assert runs_in(metrics, RunPhase.RUNNING) == 2
    assert runs_in(metrics, RunPhase.SERVING) == 1
    metrics.forget_run("ns", "a")
    metrics.forget_run("ns", "a")  # a second delete event changes nothing
    metrics.forget_run("ns", "never-seen")
    assert runs_in(metrics, RunPhase.RUNNING) == 1
    assert sum(runs_in(metrics, p) or 0 for p in RunPhase) == 2


def test_acceptance_length_per_run_is_forgotten_with_the_run() -> None:
    metrics = OperatorMetrics()
    metrics.observe_run("ns", "a", RunPhase.RUNNING, 1.6, [])
    metrics.observe_run("ns", "b", RunPhase.RUNNING, 2.4, [])
    assert acceptance(metrics, "ns", "a") == pytest.approx(1.6)
    metrics.observe_run("ns", "a", RunPhase.SERVING, None, [])  # no new measurement: the last one stays
    assert acceptance(metrics, "ns", "a") == pytest.approx(1.6)
    metrics.observe_run("ns", "a", RunPhase.SERVING, 1.9, [])
    assert acceptance(metrics, "ns", "a") == pytest.approx(1.9)
    metrics.forget_run("ns", "a")
    assert acceptance(metrics, "ns", "a") is None
    assert acceptance(metrics, "ns", "b") == pytest.approx(2.4)
    metrics.forget_run("ns", "a")  # no series left: no error


def test_finished_stages_are_observed_once_each() -> None:
    metrics = OperatorMetrics()
    metrics.observe_run("ns", "a", RunPhase.RUNNING, None, [("prepare", 90.0), ("extract", None)])
    metrics.observe_run("ns", "b", RunPhase.RUNNING, None, [("prepare", 4000.0)])
    sample = metrics.registry.get_sample_value
    assert sample(f"{STAGE}_count", {"stage": "prepare"}) == 2
    assert sample(f"{STAGE}_sum", {"stage": "prepare"}) == 4090.0
    assert sample(f"{STAGE}_bucket", {"stage": "prepare", "le": "300.0"}) == 1
    assert sample(f"{STAGE}_bucket", {"stage": "prepare", "le": "7200.0"}) == 2
    assert sample(f"{STAGE}_bucket", {"stage": "prepare", "le": "+Inf"}) == 2
    assert sample(f"{STAGE}_count", {"stage": "extract"}) is None  # no duration: nothing observed
    assert STAGE_BUCKETS[-1] == float("inf") and list(STAGE_BUCKETS) == sorted(STAGE_BUCKETS)


def test_reconciles_and_latency() -> None:
    metrics = OperatorMetrics()
    metrics.reconciles.labels("ok").inc()
    metrics.reconciles.labels("ok").inc()
    metrics.reconciles.labels("error").inc()
    metrics.latency.observe(0.02)
    sample = metrics.registry.get_sample_value
    assert sample("eagle3_operator_reconciles_total", {"result": "ok"}) == 2
    assert sample("eagle3_operator_reconciles_total", {"result": "error"}) == 1
    assert sample("eagle3_operator_reconcile_duration_seconds_count") == 1


def test_registries_are_per_instance() -> None:
    one, two = OperatorMetrics(), OperatorMetrics()
    one.observe_run("ns", "a", RunPhase.FAILED, 1.0, [])
    assert runs_in(one, RunPhase.FAILED) == 1 and runs_in(two, RunPhase.FAILED) == 0


EVENTS = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c"]), st.sampled_from(list(RunPhase)) | st.none()), max_size=30
)


@settings(max_examples=100, deadline=None)
@given(EVENTS)
def test_the_phase_gauge_counts_the_runs_in_each_phase(events: list[tuple[str, RunPhase | None]]) -> None:
    """Any sequence of reconciles (a phase) and deletes (None): the gauges are the count of runs per phase."""
    metrics = OperatorMetrics()
    model: dict[str, RunPhase] = {}
    for run, phase in events:
        if phase is None:
            metrics.forget_run("ns", run)
            model.pop(run, None)
        else:
            metrics.observe_run("ns", run, phase, None, [])
            model[run] = phase
        counts = Counter(model.values())
        assert {p: runs_in(metrics, p) for p in RunPhase} == {p: float(counts[p]) for p in RunPhase}
